package controllers

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"runtime/pprof"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/credentials"
	"github.com/example/egress-proxies-operator/providers"
	"github.com/example/egress-proxies-operator/providers/kubernetes"
	"github.com/example/egress-proxies-operator/test/testenv"
)

// testOwner is the identity the tests' operator labels its instances with.
var testOwner = providers.Owner{ClusterID: "test-cluster", OperatorID: "test-system_test-operator"}

func TestMain(m *testing.M) {
	code := m.Run()
	testenv.StopShared()
	os.Exit(code)
}

// newManager builds a manager as main does (same cache scoping), without
// metrics or probe listeners.
func newManager(t *testing.T, env *testenv.Env) manager.Manager {
	t.Helper()
	byObject := CacheByObject()
	maps.Copy(byObject, kubernetes.CacheByObject())
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                 env.Scheme,
		Cache:                  cache.Options{ByObject: byObject},
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             testControllerConfig(),
		// Under -race, with other packages' tests on the same two cores, a
		// reconcile in flight may take a while to end; 30s once was not
		// enough (see stopManager for what is printed when even this is).
		GracefulShutdownTimeout: ptr.To(90 * time.Second),
	})
	require.NoError(t, err)
	return mgr
}

// testControllerConfig is main's controller configuration, and lets several
// managers in one test binary run controllers of the same name, one after
// another.
func testControllerConfig() config.Controller {
	c := ControllerDefaults()
	c.SkipNameValidation = ptr.To(true)
	return c
}

// kubernetesProviders is the provider set the tests run: one kubernetes
// provider instance, kind-local.
func kubernetesProviders(t *testing.T, c client.Client) providers.Set {
	t.Helper()
	set, err := providers.Registry{kubernetes.Type: kubernetes.New}.Build(providers.Config{Providers: []providers.InstanceConfig{
		{Name: "kind-local", Type: kubernetes.Type},
	}}, providers.Dependencies{Client: c})
	require.NoError(t, err)
	return set
}

// startManager runs mgr until the test ends (or stop is called) and waits
// for its cache.
func startManager(t *testing.T, mgr manager.Manager, alsoSynced ...cache.Cache) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	require.True(t, mgr.GetCache().WaitForCacheSync(ctx), "cache did not sync")
	// The manager starts added caches on goroutines of their own: a reconcile
	// called directly, not by a controller, may come first and find one not
	// started yet (ErrCacheNotStarted).
	for _, c := range alsoSynced {
		require.True(t, c.WaitForCacheSync(ctx), "an added cache did not sync")
	}
	var stopped atomic.Bool
	stop = func() {
		if stopped.Swap(true) {
			return
		}
		cancel()
		if err := <-done; err != nil {
			// Name what did not end: every goroutine's stack.
			var stacks bytes.Buffer
			_ = pprof.Lookup("goroutine").WriteTo(&stacks, 1)
			t.Fatalf("the manager did not stop: %v\n%s", err, stacks.String())
		}
	}
	t.Cleanup(stop)
	return stop
}

// startReconciler runs the Proxy controller, with the providers newProviders
// builds on the manager's client, in a fresh manager until the test ends.
func startReconciler(t *testing.T, env *testenv.Env, newProviders func(client.Client) providers.Set) {
	t.Helper()
	mgr := newManager(t, env)
	require.NoError(t, (&ProxyReconciler{
		Client:       mgr.GetClient(),
		Providers:    newProviders(mgr.GetClient()),
		Owner:        testOwner,
		Recorder:     mgr.GetEventRecorder("egress-proxies-operator"),
		PollInterval: 100 * time.Millisecond,

		CredentialsCache: credentialsCache(t, mgr), CredentialsNamespace: testCredentialsNamespace,
	}).SetupWithManager(mgr))
	startManager(t, mgr)
}

// testCredentialsNamespace plays the operator's namespace, where the
// reconciler keeps generated credentials and instance records.
const testCredentialsNamespace = "default"

// credentialsCache is the operator's cache of credentials Secrets, added to
// mgr as main adds it.
func credentialsCache(t *testing.T, mgr manager.Manager) cache.Cache {
	t.Helper()
	c, err := cache.New(mgr.GetConfig(), credentials.CacheOptions(cache.Options{Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper()}))
	require.NoError(t, err)
	require.NoError(t, mgr.Add(c))
	return c
}

// fakeKubelet stands in for the kubelet envtest does not have: it marks proxy
// pods Running and Ready with a fresh loopback IP each, as a node would give
// each new pod a new address.
type fakeKubelet struct {
	client client.Client
	ips    atomic.Int32
}

// tick marks every pending proxy pod running.
func (k *fakeKubelet) tick(ctx context.Context) error {
	var pods corev1.PodList
	if err := k.client.List(ctx, &pods, client.HasLabels{crawlv1alpha1.LabelClusterID}); err != nil {
		return err
	}
	for i := range pods.Items {
		pod := &pods.Items[i]
		if pod.Status.Phase == corev1.PodRunning || pod.DeletionTimestamp != nil {
			continue
		}
		n := k.ips.Add(1)
		pod.Status = corev1.PodStatus{
			Phase: corev1.PodRunning,
			PodIP: fmt.Sprintf("127.0.%d.%d", 1+n/250, 1+n%250),
			Conditions: []corev1.PodCondition{
				{Type: corev1.PodReady, Status: corev1.ConditionTrue},
			},
		}
		if err := k.client.Status().Update(ctx, pod); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return err
		}
	}
	return nil
}

// run ticks until the test ends.
func (k *fakeKubelet) run(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			if err := k.tick(ctx); err != nil && ctx.Err() == nil {
				t.Errorf("fake kubelet: %v", err)
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
}
