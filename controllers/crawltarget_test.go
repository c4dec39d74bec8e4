package controllers

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
)

func TestAcceptance(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ct := func(name, host string, created time.Time) crawlv1alpha1.CrawlTarget {
		return crawlv1alpha1.CrawlTarget{ObjectMeta: metav1.ObjectMeta{Name: name, Generation: 3, CreationTimestamp: metav1.NewTime(created)},
			Spec: crawlv1alpha1.CrawlTargetSpec{Host: host}}
	}
	older, newer, twin, other := ct("older", "shop.example", t0), ct("newer", "shop.example", t0.Add(time.Minute)),
		ct("a-twin", "shop.example", t0.Add(time.Minute)), ct("other", "other.example", t0.Add(-time.Hour))
	all := []crawlv1alpha1.CrawlTarget{older, newer, twin, other}

	c := acceptance(&older, all)
	assert.Equal(t, metav1.ConditionTrue, c.Status)
	assert.Equal(t, crawlv1alpha1.ReasonAccepted, c.Reason)
	assert.Equal(t, int64(3), c.ObservedGeneration)

	c = acceptance(&newer, all)
	assert.Equal(t, metav1.ConditionFalse, c.Status)
	assert.Equal(t, crawlv1alpha1.ReasonConflict, c.Reason)
	assert.Contains(t, c.Message, "CrawlTarget older is older")

	c = acceptance(&newer, []crawlv1alpha1.CrawlTarget{newer, twin})
	assert.Equal(t, crawlv1alpha1.ReasonConflict, c.Reason, "of two as old, the first by name wins")
	assert.Contains(t, c.Message, "a-twin")

	assert.Equal(t, metav1.ConditionTrue, acceptance(&other, all).Status, "another host: no conflict")
}
