package controllers

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/providers"
)

// askedProvider counts what the reconciler asks of it; any other call
// panics through the nil Provider it embeds.
type askedProvider struct {
	providers.Provider
	asked int
}

func (a *askedProvider) Validate(*crawlv1alpha1.Proxy) error { a.asked++; return nil }

func (a *askedProvider) Get(context.Context, string, *crawlv1alpha1.Proxy) (*providers.Instance, error) {
	a.asked++
	return nil, providers.ErrNotFound
}

// TestTheFinalizerPassAsksTheCloudNothing: a new cloud Proxy's first pass
// adds the finalizer without a call to its provider, whose API is rate
// limited per account (EC2 refills DescribeInstances at 20 a second): the
// instance cannot change what that pass does.
func TestTheFinalizerPassAsksTheCloudNothing(t *testing.T) {
	cloud := &askedProvider{}
	r := &ProxyReconciler{Providers: providers.Set{"aws-eu": cloud}, Owner: testOwner}
	p := &crawlv1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: "crawl", Name: "eu-1", UID: "uid-1", Generation: 1},
		Spec: crawlv1alpha1.ProxySpec{Mode: crawlv1alpha1.ModeManaged, Provider: "aws-eu", Port: crawlv1alpha1.DefaultPort}}
	o, _ := r.observeInstance(context.Background(), p)
	assert.Equal(t, ActionAddFinalizer, plan(o).Type)
	assert.Zero(t, cloud.asked, "the provider was asked nothing")

	// Being deleted without a finalizer: nothing to add, nothing asked
	// (plan does nothing either way).
	deleting := p.DeepCopy()
	now := metav1.Now()
	deleting.DeletionTimestamp = &now
	deleting.Finalizers = []string{"someone-else"}
	assert.False(t, finalizerFirst(deleting, false), "a Proxy being deleted gets no finalizer")
	withFinalizer := p.DeepCopy()
	withFinalizer.Finalizers = []string{crawlv1alpha1.Finalizer}
	assert.False(t, finalizerFirst(withFinalizer, false), "a Proxy with the finalizer goes on to observe its instance")
	assert.False(t, finalizerFirst(p, true), "a provider whose instances go with their Proxy needs no finalizer")
}
