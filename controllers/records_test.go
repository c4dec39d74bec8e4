package controllers

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/credentials"
	"github.com/example/egress-proxies-operator/operator"
	"github.com/example/egress-proxies-operator/providers"
	"github.com/example/egress-proxies-operator/test/testenv"
)

// TestRecordSweep: a shared credentials record goes once no Proxy in its
// namespace records its spec hash and it was not written for a new
// instance within recordGrace; a record an earlier version kept for one
// instance goes with its Proxy; another operator's records and records of
// namespaces out of scope stay.
func TestRecordSweep(t *testing.T) {
	env := testenv.Shared(t)
	ctx := context.Background()
	c := env.Client
	ns, credsNS, elsewhere := env.Namespace(t), env.Namespace(t), env.Namespace(t)

	user := managedProxy(ns, "user")
	require.NoError(t, c.Create(ctx, user))
	user.Status.SpecHash, user.Status.InstanceName, user.Status.Phase = "h-used", "px-user", crawlv1alpha1.PhaseReady
	require.NoError(t, c.Status().Update(ctx, user))
	legacyOwner := managedProxy(ns, "legacy-owner")
	require.NoError(t, c.Create(ctx, legacyOwner))

	now := time.Now().Add(10 * time.Minute) // every record is past the grace for young objects
	record := func(name string, owner providers.Owner, labels map[string]string, written time.Time) {
		t.Helper()
		l := mergeLabels(owner.Labels(), map[string]string{crawlv1alpha1.LabelCredentials: "true"}, labels)
		require.NoError(t, c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: credsNS, Name: name, Labels: l,
			Annotations: map[string]string{credentials.AnnotationRecordWritten: written.UTC().Format(time.RFC3339)}}}))
	}
	spec := func(namespace, hash string) map[string]string {
		return map[string]string{crawlv1alpha1.LabelCredentialsRole: credentials.RoleSpec, crawlv1alpha1.LabelOwnerNamespace: namespace, crawlv1alpha1.LabelSpecHash: hash}
	}
	legacy := func(name string, uid string) map[string]string {
		return map[string]string{crawlv1alpha1.LabelCredentialsRole: credentials.RoleInstance, crawlv1alpha1.LabelOwnerNamespace: ns,
			crawlv1alpha1.LabelOwnerName: name, crawlv1alpha1.LabelOwnerUID: uid}
	}
	long := now.Add(-2 * recordGrace)
	record(credentials.RecordName(ns, "h-used"), testOwner, spec(ns, "h-used"), long)
	record(credentials.RecordName(ns, "h-unused"), testOwner, spec(ns, "h-unused"), long)
	record(credentials.RecordName(ns, "h-starting"), testOwner, spec(ns, "h-starting"), now.Add(-recordGrace/2))
	record("other-operator", providers.Owner{ClusterID: testOwner.ClusterID, OperatorID: "tenant-b_epo"}, spec(ns, "h-unused-b"), long)
	record(credentials.RecordName(elsewhere, "h-x"), testOwner, spec(elsewhere, "h-x"), long)
	record("px-legacy-gone", testOwner, legacy("gone", "uid-gone"), long)
	record("px-legacy-live", testOwner, legacy("legacy-owner", string(legacyOwner.UID)), long)

	gc := &OrphanCollector{
		Client: c, Owner: testOwner, Scope: operator.Scope{Namespaces: []string{ns}},
		GracePeriod: 3 * time.Minute, Clock: clocktesting.NewFakeClock(now),
		Credentials: c, Deleter: c, CredentialsNamespace: credsNS,
	}
	for range 2 {
		require.NoError(t, gc.Sweep(ctx))
		var left corev1.SecretList
		require.NoError(t, c.List(ctx, &left, client.InNamespace(credsNS)))
		var names []string
		for _, s := range left.Items {
			if s.DeletionTimestamp.IsZero() {
				names = append(names, s.Name)
			}
		}
		assert.ElementsMatch(t, []string{
			credentials.RecordName(ns, "h-used"),     // a Proxy records its hash
			credentials.RecordName(ns, "h-starting"), // written for a new instance within recordGrace
			"other-operator",                         // not this operator's
			credentials.RecordName(elsewhere, "h-x"), // a namespace out of scope
			"px-legacy-live",                         // its Proxy exists
		}, names)
	}

	// The Proxy goes: its hash's record goes at the next sweep.
	require.NoError(t, c.Delete(ctx, user))
	require.Eventually(t, func() bool {
		return apierrors.IsNotFound(c.Get(ctx, client.ObjectKeyFromObject(user), &crawlv1alpha1.Proxy{}))
	}, waitFor, tick)
	require.NoError(t, gc.Sweep(ctx))
	err := c.Get(ctx, client.ObjectKey{Namespace: credsNS, Name: credentials.RecordName(ns, "h-used")}, &corev1.Secret{})
	assert.True(t, apierrors.IsNotFound(err), "the record outlived the last Proxy of its spec: %v", err)
}
