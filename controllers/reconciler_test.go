package controllers

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/providers"
	"github.com/example/egress-proxies-operator/test/testenv"
)

const (
	waitFor = 20 * time.Second
	tick    = 25 * time.Millisecond
)

// TestReconciler runs the real controller against a real API server with the
// kubernetes provider; a fake kubelet marks the Squid pods running.
func TestReconciler(t *testing.T) {
	env := testenv.Shared(t)
	startReconciler(t, env, func(c client.Client) providers.Set { return kubernetesProviders(t, c) })
	(&fakeKubelet{client: env.Client}).run(t)
	ctx := context.Background()
	c := env.Client

	t.Run("create -> Ready with the pod IP and no finalizer, then delete -> pod gone", func(t *testing.T) {
		ns := env.Namespace(t)
		proxy := managedProxy(ns, "eu-1")
		require.NoError(t, c.Create(ctx, proxy))

		ready := waitReady(t, c, proxy)
		pod := onlyPod(t, c, ns)
		assert.Equal(t, pod.Status.PodIP, ready.Status.IP, "status IP is the pod's")
		assert.Equal(t, int32(3128), ready.Status.Port)
		assert.Equal(t, providers.InstanceName(testOwner.ClusterID, ns, "eu-1"), pod.Name)
		assert.Equal(t, ready.Status.InstanceName, pod.Name)
		assert.Equal(t, ready.Status.SpecHash, pod.Labels[crawlv1alpha1.LabelSpecHash])
		assert.Equal(t, string(ready.UID), pod.Labels[crawlv1alpha1.LabelOwnerUID])
		assert.Equal(t, testOwner.ClusterID, pod.Labels[crawlv1alpha1.LabelClusterID])
		assert.Equal(t, testOwner.OperatorID, pod.Labels[crawlv1alpha1.LabelOperatorID])
		// The pod is owned by the Proxy, so the kubernetes provider's Proxy
		// carries no finalizer: one write less to bring it up.
		assert.Empty(t, ready.Finalizers)
		require.Len(t, pod.OwnerReferences, 1)
		assert.Equal(t, ready.UID, pod.OwnerReferences[0].UID)
		assert.True(t, *pod.OwnerReferences[0].Controller)
		assertReadyCondition(t, ready)
		assertPodIsRestricted(t, pod)
		// The pod's files (squid.conf, the lease-auth helper, its lease
		// key) are in a Secret of its own, which it mounts: the pod (which
		// the built-in view role reads and every pod watch carries whole)
		// holds none of them.
		var files corev1.Secret
		require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(&pod), &files))
		assert.Contains(t, string(files.Data["squid.conf"]), "http_port 3128\n")
		assert.Contains(t, string(files.Data["lease-auth.pl"]), "Digest::SHA")
		assert.Regexp(t, "^[0-9a-f]{64}\n$", string(files.Data["lease.key"]))
		assert.Equal(t, pod.Name, pod.Spec.Volumes[0].Secret.SecretName, "the pod mounts it")
		assert.Empty(t, pod.Annotations, "no file travels in the pod")
		assert.True(t, apierrors.IsNotFound(c.Get(ctx, client.ObjectKeyFromObject(&pod), &corev1.ConfigMap{})), "no ConfigMap")
		// A routine bring-up is told by the status alone: no Event, which
		// would cost a write per step and per proxy.
		assert.False(t, hasEvent(c, ns, "eu-1", ReasonCreating))
		assert.False(t, hasEvent(c, ns, "eu-1", ReasonInstanceRunning))

		require.NoError(t, c.Delete(ctx, ready))
		assert.True(t, apierrors.IsNotFound(c.Get(ctx, client.ObjectKeyFromObject(proxy), &crawlv1alpha1.Proxy{})), "nothing holds the Proxy")
		// envtest runs no garbage collector: the operator deletes the pod.
		require.Eventually(t, func() bool { return len(pods(t, c, ns)) == 0 }, waitFor, tick, "the pod outlived its Proxy")
	})

	t.Run("a Proxy carrying the finalizer (an earlier version's) -> delete goes through it", func(t *testing.T) {
		ns := env.Namespace(t)
		proxy := managedProxy(ns, "eu-legacy")
		proxy.Finalizers = []string{crawlv1alpha1.Finalizer}
		require.NoError(t, c.Create(ctx, proxy))
		ready := waitReady(t, c, proxy)
		assert.Equal(t, []string{crawlv1alpha1.Finalizer}, ready.Finalizers, "kept: the reconciler only removes it on deletion")
		onlyPod(t, c, ns)

		require.NoError(t, c.Delete(ctx, ready))
		waitEvent(t, c, ns, "eu-legacy", ReasonDeleting)
		require.Eventually(t, func() bool {
			return apierrors.IsNotFound(c.Get(ctx, client.ObjectKeyFromObject(proxy), &crawlv1alpha1.Proxy{}))
		}, waitFor, tick, "the finalizer was never removed")
		assert.Empty(t, pods(t, c, ns), "the finalizer came off before the pod was gone")
	})

	t.Run("port change -> same name, new pod, new IP", func(t *testing.T) {
		ns := env.Namespace(t)
		proxy := managedProxy(ns, "eu-2")
		require.NoError(t, c.Create(ctx, proxy))
		before := waitReady(t, c, proxy)
		oldPod := onlyPod(t, c, ns)

		before.Spec.Port = 8080
		require.NoError(t, c.Update(ctx, before))
		after := waitFor2(t, c, proxy, func(p *crawlv1alpha1.Proxy) bool {
			return p.Status.Phase == crawlv1alpha1.PhaseReady && p.Status.Port == 8080
		})
		newPod := onlyPod(t, c, ns)
		assert.Equal(t, oldPod.Name, newPod.Name, "a replacement keeps the name")
		assert.NotEqual(t, oldPod.UID, newPod.UID, "a replacement is a new pod")
		assert.NotEqual(t, before.Status.IP, after.Status.IP, "a replacement gets a new IP")
		assert.Equal(t, newPod.Status.PodIP, after.Status.IP)
		assert.Equal(t, int32(8080), newPod.Spec.Containers[0].Ports[0].ContainerPort)
		assert.NotEqual(t, before.Status.SpecHash, after.Status.SpecHash)
		waitEvent(t, c, ns, "eu-2", ReasonSpecChanged)
	})

	t.Run("cloud-init Secret rotation -> replacement", func(t *testing.T) {
		ns := env.Namespace(t)
		secret := createCloudInitSecret(t, c, ns)
		proxy := withSecretCloudInit(managedProxy(ns, "eu-3"), secret)
		require.NoError(t, c.Create(ctx, proxy))
		before := waitReady(t, c, proxy)
		oldPod := onlyPod(t, c, ns)

		secret.Data["user-data"] = []byte("#cloud-config\npackages: [squid, curl]\n")
		require.NoError(t, c.Update(ctx, secret))
		waitFor2(t, c, proxy, func(p *crawlv1alpha1.Proxy) bool {
			return p.Status.Phase == crawlv1alpha1.PhaseReady && p.Status.SpecHash != before.Status.SpecHash
		})
		newPod := onlyPod(t, c, ns)
		assert.NotEqual(t, oldPod.UID, newPod.UID, "rotating the Secret replaces the pod")
		assert.NotEqual(t, oldPod.Labels[crawlv1alpha1.LabelSpecHash], newPod.Labels[crawlv1alpha1.LabelSpecHash],
			"the new cloud-init is in the pod's spec hash")
	})

	t.Run("an unlabelled cloud-init Secret fails the Proxy with a message naming the label", func(t *testing.T) {
		ns := env.Namespace(t)
		require.NoError(t, c.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "unlabelled"},
			Data:       map[string][]byte{"user-data": []byte("#cloud-config\n")},
		}))
		proxy := managedProxy(ns, "eu-4")
		proxy.Spec.CloudInit = &crawlv1alpha1.CloudInit{SecretRef: &crawlv1alpha1.SecretKeyReference{Name: "unlabelled"}}
		require.NoError(t, c.Create(ctx, proxy))
		failed := waitFor2(t, c, proxy, func(p *crawlv1alpha1.Proxy) bool { return p.Status.Phase == crawlv1alpha1.PhaseFailed })
		cond := meta.FindStatusCondition(failed.Status.Conditions, crawlv1alpha1.ConditionProvisioned)
		require.NotNil(t, cond)
		assert.Equal(t, ReasonCloudInitError, cond.Reason)
		assert.Contains(t, cond.Message, `crawl.example.com/cloud-init: "true"`)
		assert.Empty(t, pods(t, c, ns), "nothing is created for a Proxy that failed")
		waitEvent(t, c, ns, "eu-4", ReasonCloudInitError)
	})

	t.Run("an unknown provider fails the Proxy, listing the configured ones", func(t *testing.T) {
		ns := env.Namespace(t)
		proxy := managedProxy(ns, "eu-5")
		proxy.Spec.Provider = "gcp-eu"
		require.NoError(t, c.Create(ctx, proxy))
		failed := waitFor2(t, c, proxy, func(p *crawlv1alpha1.Proxy) bool { return p.Status.Phase == crawlv1alpha1.PhaseFailed })
		assert.Contains(t, failed.Status.Message, `provider "gcp-eu" is not in the operator's providers config; configured: kind-local`)

		// Deleting it needs no provider: nothing was ever created.
		require.NoError(t, c.Delete(ctx, failed))
		require.Eventually(t, func() bool {
			return apierrors.IsNotFound(c.Get(ctx, client.ObjectKeyFromObject(proxy), &crawlv1alpha1.Proxy{}))
		}, waitFor, tick)
	})
}

// createCloudInitSecret creates a cloud-init Secret labelled so the
// operator's cache holds it.
func createCloudInitSecret(t *testing.T, c client.Client, ns string) *corev1.Secret {
	t.Helper()
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "squid-init", Labels: map[string]string{crawlv1alpha1.LabelCloudInit: "true"}},
		Data:       map[string][]byte{"user-data": []byte("#cloud-config\npackages: [squid]\n")},
	}
	require.NoError(t, c.Create(context.Background(), secret))
	return secret
}

// withSecretCloudInit points the Proxy's cloud-init at secret.
func withSecretCloudInit(p *crawlv1alpha1.Proxy, secret *corev1.Secret) *crawlv1alpha1.Proxy {
	p.Spec.CloudInit = &crawlv1alpha1.CloudInit{SecretRef: &crawlv1alpha1.SecretKeyReference{Name: secret.Name}}
	return p
}

func managedProxy(ns, name string) *crawlv1alpha1.Proxy {
	return &crawlv1alpha1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: crawlv1alpha1.ProxySpec{
			Mode: crawlv1alpha1.ModeManaged, Provider: "kind-local", Port: 3128,
			Attributes: map[string]string{"geo": "local"},
		},
	}
}

// waitFor2 polls the Proxy until cond holds and returns it.
func waitFor2(t *testing.T, c client.Client, proxy *crawlv1alpha1.Proxy, cond func(*crawlv1alpha1.Proxy) bool) *crawlv1alpha1.Proxy {
	t.Helper()
	var got crawlv1alpha1.Proxy
	require.Eventually(t, func() bool {
		if err := c.Get(context.Background(), client.ObjectKeyFromObject(proxy), &got); err != nil {
			return false
		}
		return cond(&got)
	}, waitFor, tick, "Proxy %s/%s never reached the expected state; last status: %+v", proxy.Namespace, proxy.Name, &got.Status)
	return &got
}

func waitReady(t *testing.T, c client.Client, proxy *crawlv1alpha1.Proxy) *crawlv1alpha1.Proxy {
	t.Helper()
	return waitFor2(t, c, proxy, func(p *crawlv1alpha1.Proxy) bool {
		return p.Status.Phase == crawlv1alpha1.PhaseReady && p.Status.IP != ""
	})
}

func pods(t *testing.T, c client.Client, ns string) []corev1.Pod {
	t.Helper()
	var list corev1.PodList
	require.NoError(t, c.List(context.Background(), &list, client.InNamespace(ns)))
	return list.Items
}

func onlyPod(t *testing.T, c client.Client, ns string) corev1.Pod {
	t.Helper()
	var got []corev1.Pod
	require.Eventually(t, func() bool {
		got = pods(t, c, ns)
		return len(got) == 1 && got[0].Status.PodIP != ""
	}, waitFor, tick, "want exactly one running pod in %s", ns)
	return got[0]
}

func assertReadyCondition(t *testing.T, p *crawlv1alpha1.Proxy) {
	t.Helper()
	provisioned := meta.FindStatusCondition(p.Status.Conditions, crawlv1alpha1.ConditionProvisioned)
	require.NotNil(t, provisioned)
	assert.Equal(t, metav1.ConditionTrue, provisioned.Status)
	assert.Equal(t, p.Generation, provisioned.ObservedGeneration)
	assert.Nil(t, meta.FindStatusCondition(p.Status.Conditions, crawlv1alpha1.ConditionHealthy), "the verdict is the health engine's to write")
	assert.False(t, p.IsReady(), "not Ready until Healthy")
	assert.Equal(t, crawlv1alpha1.ReasonAwaitingProbe, p.ReadyCondition(p.RecordedHealth()).Reason)
}

// assertPodIsRestricted checks the Pod Security "restricted" essentials.
func assertPodIsRestricted(t *testing.T, pod corev1.Pod) {
	t.Helper()
	psc := pod.Spec.SecurityContext
	require.NotNil(t, psc)
	assert.True(t, *psc.RunAsNonRoot)
	assert.Equal(t, corev1.SeccompProfileTypeRuntimeDefault, psc.SeccompProfile.Type)
	for _, ctr := range pod.Spec.Containers {
		sc := ctr.SecurityContext
		require.NotNil(t, sc, ctr.Name)
		assert.False(t, *sc.AllowPrivilegeEscalation, ctr.Name)
		assert.Equal(t, []corev1.Capability{"ALL"}, sc.Capabilities.Drop, ctr.Name)
		assert.True(t, *sc.ReadOnlyRootFilesystem, ctr.Name)
		assert.NotNil(t, ctr.ReadinessProbe.TCPSocket, "a TCP readiness probe on the proxy port")
		assert.False(t, ctr.Resources.Requests.Cpu().IsZero(), "CPU request")
	}
}

// waitEvent waits for an Event with reason about the Proxy: what `kubectl
// describe px` shows.
func waitEvent(t *testing.T, c client.Client, ns, name, reason string) {
	t.Helper()
	require.Eventually(t, func() bool { return hasEvent(c, ns, name, reason) }, waitFor, tick,
		"no %s Event for Proxy %s/%s", reason, ns, name)
}

// hasEvent says whether an Event with reason and a note about the Proxy
// exists now; a failed List counts as none.
func hasEvent(c client.Client, ns, name, reason string) bool {
	var list eventsv1.EventList
	if err := c.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		return false
	}
	for _, e := range list.Items {
		if e.Regarding.Name == name && e.Regarding.Kind == "Proxy" && e.Reason == reason && e.Note != "" {
			return true
		}
	}
	return false
}
