package controllers

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/test/testenv"
)

// TestCrashSafety restarts the operator between every pair of steps: each
// step is exactly one reconcile in a brand-new manager with a cold cache. On
// every other step the status write fails as well, as if the operator died
// right after acting and before recording what it did. Through create,
// replace and delete there must never be two pods for the Proxy, and none
// once it is gone.
func TestCrashSafety(t *testing.T) {
	// Two runs, so that every kind of step is followed by a crash in one of
	// them: the first crashes on even steps, the second on odd ones.
	for _, crashParity := range []int{0, 1} {
		t.Run(fmt.Sprintf("crash on steps with parity %d", crashParity), func(t *testing.T) {
			crashSafetyRun(t, crashParity)
		})
	}
}

func crashSafetyRun(t *testing.T, crashParity int) {
	env := testenv.Shared(t)
	ctx := context.Background()
	c := env.Client
	ns := env.Namespace(t)
	kubelet := &fakeKubelet{client: c}
	proxy := managedProxy(ns, "crashy")
	require.NoError(t, c.Create(ctx, proxy))
	key := client.ObjectKeyFromObject(proxy)

	steps := 0
	step := func() {
		steps++
		mgr := newManager(t, env)
		cl := mgr.GetClient()
		if steps%2 == crashParity {
			cl = crashBeforeRecord{cl}
		}
		r := &ProxyReconciler{
			Client: cl, Providers: kubernetesProviders(t, cl), ClusterID: testClusterID,
			Recorder: events.NewFakeRecorder(100),
		}
		stop := startManager(t, mgr)
		_, _ = r.Reconcile(ctx, reconcile.Request{NamespacedName: key}) // errors are expected: half the steps crash
		stop()

		require.NoError(t, kubelet.tick(ctx))
		require.LessOrEqual(t, len(pods(t, c, ns)), 1, "step %d left two pods for one Proxy", steps)
	}
	// until steps until done holds, failing after a bound that is far above
	// what a healthy run needs.
	until := func(what string, done func() bool) {
		t.Helper()
		for range 30 {
			step()
			if done() {
				t.Logf("%s after %d steps in total", what, steps)
				return
			}
		}
		t.Fatalf("%s: not reached after %d steps", what, steps)
	}
	current := func() *crawlv1alpha1.Proxy {
		var p crawlv1alpha1.Proxy
		if err := c.Get(ctx, key, &p); err != nil {
			return nil
		}
		return &p
	}
	runningPod := func() *corev1.Pod {
		list := pods(t, c, ns)
		if len(list) != 1 || list[0].Status.PodIP == "" {
			return nil
		}
		return &list[0]
	}

	until("created and Ready", func() bool {
		p, pod := current(), runningPod()
		return p != nil && pod != nil && p.Status.Phase == crawlv1alpha1.PhaseReady && p.Status.IP == pod.Status.PodIP
	})
	firstPod := runningPod()

	p := current()
	p.Spec.Port = 8080
	require.NoError(t, c.Update(ctx, p))
	until("replaced and Ready", func() bool {
		p, pod := current(), runningPod()
		return p != nil && pod != nil && p.Status.Phase == crawlv1alpha1.PhaseReady && p.Status.Port == 8080 &&
			pod.UID != firstPod.UID && p.Status.IP == pod.Status.PodIP
	})
	assert.Equal(t, firstPod.Name, runningPod().Name, "the replacement keeps the name")

	require.NoError(t, c.Delete(ctx, current()))
	until("deleted", func() bool {
		return apierrors.IsNotFound(c.Get(ctx, key, &crawlv1alpha1.Proxy{}))
	})
	assert.Empty(t, pods(t, c, ns), fmt.Sprintf("a pod outlived its Proxy after %d steps", steps))
}

// crashBeforeRecord is a client whose status writes fail: the operator acted
// (created, deleted) and died before recording it.
type crashBeforeRecord struct{ client.Client }

func (c crashBeforeRecord) Status() client.SubResourceWriter {
	return failingStatusWriter{c.Client.Status()}
}

type failingStatusWriter struct{ client.SubResourceWriter }

func (failingStatusWriter) Update(context.Context, client.Object, ...client.SubResourceUpdateOption) error {
	return errors.New("operator crashed before recording")
}

func (failingStatusWriter) Patch(context.Context, client.Object, client.Patch, ...client.SubResourcePatchOption) error {
	return errors.New("operator crashed before recording")
}
