package kubernetes

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/credentials"
	"github.com/example/egress-proxies-operator/providers"
	"github.com/example/egress-proxies-operator/providers/squidconf"
)

func newTestProvider(t *testing.T, settings map[string]any) *Provider {
	t.Helper()
	p, err := New("kind-local", settings, providers.Dependencies{Client: fake.NewClientBuilder().Build()})
	require.NoError(t, err)
	return p.(*Provider)
}

func TestNewRejectsBadSettings(t *testing.T) {
	deps := providers.Dependencies{Client: fake.NewClientBuilder().Build()}
	_, err := New("kind-local", map[string]any{"imag": "squid"}, deps)
	assert.ErrorContains(t, err, `unknown field "imag"`)

	_, err = New("kind-local", map[string]any{"allowedSourceRanges": []any{"10.0.0.0/8", "10.0.0.0/33"}}, deps)
	assert.ErrorContains(t, err, `settings.allowedSourceRanges[1]: "10.0.0.0/33" is not a CIDR`)

	// Without a client, as the registry's Check builds it before the
	// operator connects: the settings are still checked.
	_, err = New("kind-local", map[string]any{"allowedSourceRanges": []any{"10.0.0.0/33"}}, providers.Dependencies{})
	assert.ErrorContains(t, err, `"10.0.0.0/33" is not a CIDR`)
	_, err = New("kind-local", nil, providers.Dependencies{})
	assert.NoError(t, err)
}

func TestValidate(t *testing.T) {
	p := newTestProvider(t, nil)
	proxy := &crawlv1alpha1.Proxy{Spec: crawlv1alpha1.ProxySpec{Placement: &crawlv1alpha1.Placement{Zone: "local", Region: "local"}}}
	assert.NoError(t, p.Validate(proxy), "zone and region are attributes for discovery")

	proxy.Spec.Placement.MachineType = "e2-small"
	err := p.Validate(proxy)
	assert.ErrorIs(t, err, providers.ErrTerminal)
	assert.ErrorContains(t, err, "spec.placement.machineType is not supported by kubernetes provider kind-local")
}

func TestSquidConfig(t *testing.T) {
	t.Run("defaults: private sources only, no loopback or metadata destinations, CONNECT to 443 only", func(t *testing.T) {
		conf, err := renderSquidConfig("crawl/eu-1", 8080, newTestProvider(t, nil).settings)
		require.NoError(t, err)
		for _, want := range []string{
			"http_port 8080\n",
			"acl clients src 10.0.0.0/8 172.16.0.0/12 192.168.0.0/16\n",
			"acl denied_destinations dst 127.0.0.0/8 169.254.0.0/16 ::1/128 fe80::/10\n",
			"http_access deny !clients\n",
			"http_access deny denied_destinations\n",
			"http_access deny CONNECT !SSL_ports\n",
			"http_access deny all\n",
		} {
			assert.Contains(t, conf, want)
		}
		assert.NotContains(t, conf, "http_access allow all", "never an open proxy")
	})

	t.Run("an explicit empty deny list denies no destination", func(t *testing.T) {
		p := newTestProvider(t, map[string]any{"allowedSourceRanges": []any{"127.0.0.0/8"}, "deniedDestinationRanges": []any{}})
		conf, err := renderSquidConfig("crawl/eu-1", 3128, p.settings)
		require.NoError(t, err)
		assert.Contains(t, conf, "acl clients src 127.0.0.0/8\n")
		assert.NotContains(t, conf, "denied_destinations")
	})
}

func TestInstanceOf(t *testing.T) {
	pod := func(mutate func(*corev1.Pod)) *corev1.Pod {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "px-1", Namespace: "crawl"},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "squid", Ports: []corev1.ContainerPort{{ContainerPort: 3128}}}}},
		}
		mutate(p)
		return p
	}
	running := func(p *corev1.Pod) {
		p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.0.0.10",
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	}
	cases := []struct {
		name string
		pod  *corev1.Pod
		want providers.State
	}{
		{"new pod", pod(func(*corev1.Pod) {}), providers.StatePending},
		{"running, not ready", pod(func(p *corev1.Pod) { p.Status.Phase, p.Status.PodIP = corev1.PodRunning, "127.0.0.10" }), providers.StatePending},
		{"running and ready", pod(running), providers.StateRunning},
		{"failed", pod(func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed }), providers.StateFailed},
		{"completed", pod(func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }), providers.StateFailed},
		{"being deleted", pod(func(p *corev1.Pod) {
			running(p)
			now := metav1.Now()
			p.DeletionTimestamp = &now
		}), providers.StateStopping},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			inst := instanceOf(tc.pod)
			assert.Equal(t, tc.want, inst.State)
			assert.Equal(t, "crawl", inst.Location)
			assert.Equal(t, int32(3128), inst.Port)
		})
	}
}

// TestZonePinsThePod: a pool spreads members over zones; on the kubernetes
// provider a member's zone is a node constraint, and a proxy without one
// may run on any node.
func TestZonePinsThePod(t *testing.T) {
	p := newTestProvider(t, nil)
	proxy := &crawlv1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "eu-abcde", Namespace: "crawl"},
		Spec: crawlv1alpha1.ProxySpec{Port: 3128, Placement: &crawlv1alpha1.Placement{Zone: "europe-west1-c"}}}
	pod := p.pod(providers.CreateRequest{Proxy: proxy, Name: "px-crawl-eu-abcde"})
	assert.Equal(t, map[string]string{corev1.LabelTopologyZone: "europe-west1-c"}, pod.Spec.NodeSelector)

	proxy.Spec.Placement = nil
	assert.Empty(t, p.pod(providers.CreateRequest{Proxy: proxy, Name: "px-crawl-eu-abcde"}).Spec.NodeSelector)
}

// TestThePodsFilesAreInASecretNeverInThePod: squid.conf, the lease-auth
// helper and the key a pod checks its leases' credentials with are in a
// Secret of its own, which the pod mounts; the pod object (which the
// built-in view role reads, and which every pod watch carries whole) holds
// no trace of the key and stays the size of a bare pod. A replaced
// instance's Create gives the Secret the new key.
func TestThePodsFilesAreInASecretNeverInThePod(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientBuilder().Build()
	pv, err := New("kind-local", nil, providers.Dependencies{Client: c})
	require.NoError(t, err)
	p := pv.(*Provider)
	proxy := &crawlv1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "eu-1", Namespace: "crawl", UID: "uid-1"}, Spec: crawlv1alpha1.ProxySpec{Port: 3128}}
	creds := credentials.Credentials{Username: "crawler", Password: "s3cret-password-0123456789", Scheme: credentials.SchemeLease}
	req := providers.CreateRequest{Proxy: proxy, Name: "px-crawl-eu-1", Credentials: creds}
	require.NoError(t, p.Create(ctx, req))

	var pod corev1.Pod
	require.NoError(t, c.Get(ctx, client.ObjectKey{Namespace: "crawl", Name: "px-crawl-eu-1"}, &pod))
	raw, err := json.Marshal(pod)
	require.NoError(t, err)
	key := strings.TrimSpace(req.LeaseKeyFile())
	assert.NotContains(t, string(raw), key, "the pod object holds no key")
	var secret corev1.Secret
	require.NoError(t, c.Get(ctx, client.ObjectKey{Namespace: "crawl", Name: "px-crawl-eu-1"}, &secret))
	assert.Equal(t, req.LeaseKeyFile(), string(secret.Data[leaseKeyKey]))
	assert.Equal(t, types.UID("uid-1"), secret.OwnerReferences[0].UID, "owned by the Proxy: collected with it")
	assert.Contains(t, string(secret.Data[squidConfKey]), "http_port 3128\n")
	assert.Equal(t, squidconf.LeaseAuthHelper, string(secret.Data[leaseAuthKey]))
	assert.Equal(t, "px-crawl-eu-1", pod.Spec.Volumes[0].Secret.SecretName, "the pod mounts it")
	assert.Empty(t, pod.Annotations)
	assert.Less(t, len(raw), 2500, "a pod the size of a bare one: %d bytes", len(raw))

	rotated := req
	rotated.Credentials.Password = "another-password-0123456789"
	require.NoError(t, c.Delete(ctx, &pod))
	require.NoError(t, p.Create(ctx, rotated))
	require.NoError(t, c.Get(ctx, client.ObjectKey{Namespace: "crawl", Name: "px-crawl-eu-1"}, &secret))
	assert.Equal(t, rotated.LeaseKeyFile(), string(secret.Data[leaseKeyKey]), "a replacement's key")
	assert.NotEqual(t, req.LeaseKeyFile(), rotated.LeaseKeyFile())

	require.NoError(t, p.Delete(ctx, &providers.Instance{Name: "px-crawl-eu-1", Location: "crawl"}))
	assert.True(t, apierrors.IsNotFound(c.Get(ctx, client.ObjectKey{Namespace: "crawl", Name: "px-crawl-eu-1"}, &secret)), "deleted with the pod")
}
