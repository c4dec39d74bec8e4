package controllers

import (
	"testing"

	"github.com/stretchr/testify/assert"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
)

func TestProxyChangePredicate(t *testing.T) {
	pred := ProxyChangePredicate()
	base := proxyFixture()
	update := func(mutate func(*crawlv1alpha1.Proxy)) bool {
		next := base.DeepCopy()
		mutate(next)
		return pred.Update(event.UpdateEvent{ObjectOld: base, ObjectNew: next})
	}

	assert.True(t, pred.Create(event.CreateEvent{Object: base}), "creation triggers")
	assert.True(t, update(func(p *crawlv1alpha1.Proxy) { p.Generation++; p.Spec.Port = 8080 }), "a spec change (new generation) triggers")
	assert.True(t, update(func(p *crawlv1alpha1.Proxy) {
		now := metav1.Now()
		p.DeletionTimestamp = &now
	}), "the start of deletion triggers, even without a new generation")
	assert.False(t, update(func(p *crawlv1alpha1.Proxy) {
		p.Status.Phase = crawlv1alpha1.PhaseReady
		p.Status.IP = "127.0.0.10"
	}), "a status write (ours or the health engine's) does not")
	assert.False(t, update(func(p *crawlv1alpha1.Proxy) { p.Labels = map[string]string{"team": "crawl"} }), "a label edit does not")
}
