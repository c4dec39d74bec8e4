package testenv

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
)

// CrawlTarget is a CrawlTarget ns/name for host allowing perSecond
// requests a second per IP, created at created: the politeness tests'
// policy.
func CrawlTarget(ns, name, host string, perSecond int32, created time.Time) *crawlv1alpha1.CrawlTarget {
	return &crawlv1alpha1.CrawlTarget{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, CreationTimestamp: metav1.NewTime(created)},
		Spec:       crawlv1alpha1.CrawlTargetSpec{Host: host, RequestsPerInterval: perSecond, Interval: metav1.Duration{Duration: time.Second}},
	}
}
