package controllers

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/providers"
	"github.com/example/egress-proxies-operator/test/testenv"
)

// crashScenario is one provider's side of the crash-safety test.
type crashScenario struct {
	// proxy is created at the start.
	proxy *crawlv1alpha1.Proxy
	// providers builds the provider set on a fresh manager's client.
	providers func(t *testing.T, c client.Client) providers.Set
	// between lets the world move on between steps: a kubelet tick, a clock
	// step.
	between func(t *testing.T)
	// instances counts the instances that exist for the Proxy now.
	instances func(t *testing.T) int
	// change makes a change to the spec that forces a replacement.
	change func(*crawlv1alpha1.Proxy)
	// verify, if set, checks what the provider saw once the Proxy is gone.
	verify func(t *testing.T)
}

// runCrashScenario restarts the operator between every pair of steps: each
// step is exactly one reconcile in a brand-new manager with a cold cache. On
// every other step the status write fails as well, as if the operator died
// right after acting and before recording what it did; two runs put the
// crash on even and on odd steps, so every kind of step is followed by one.
// Through create, replace and delete there must never be two instances for
// the Proxy, and none once it is gone. The health engine, its own writer,
// records a passing verdict about each new address between steps: Ready
// means the reconciler's record and the engine's verdict agree.
func runCrashScenario(t *testing.T, newScenario func(t *testing.T, ns string) crashScenario) {
	for _, crashParity := range []int{0, 1} {
		t.Run(fmt.Sprintf("crash on steps with parity %d", crashParity), func(t *testing.T) {
			env := testenv.Shared(t)
			ctx := context.Background()
			c := env.Client
			sc := newScenario(t, env.Namespace(t))
			require.NoError(t, c.Create(ctx, sc.proxy))
			key := client.ObjectKeyFromObject(sc.proxy)

			steps := 0
			step := func() {
				steps++
				mgr := newManager(t, env)
				cl := mgr.GetClient()
				if steps%2 == crashParity {
					cl = crashBeforeRecord{cl}
				}
				require.NoError(t, indexProxies(mgr.GetFieldIndexer()))
				creds := credentialsCache(t, mgr)
				r := &ProxyReconciler{
					Client: cl, Providers: sc.providers(t, cl), Owner: testOwner,
					Recorder:         events.NewFakeRecorder(100),
					CredentialsCache: creds, CredentialsNamespace: testCredentialsNamespace,
				}
				stop := startManager(t, mgr, creds)
				_, _ = r.Reconcile(ctx, reconcile.Request{NamespacedName: key}) // half the steps crash: errors expected
				stop()
				sc.between(t)
				probeBetweenSteps(t, c, key)
				require.LessOrEqual(t, sc.instances(t), 1, "step %d left two instances for one Proxy", steps)
			}
			until := func(what string, done func() bool) {
				t.Helper()
				for range 40 {
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
			ready := func(p *crawlv1alpha1.Proxy) bool {
				return p != nil && p.Status.Phase == crawlv1alpha1.PhaseReady && p.Status.IP != "" && sc.instances(t) == 1 &&
					p.IsReady() && meta.IsStatusConditionTrue(p.Status.Conditions, crawlv1alpha1.ConditionReady)
			}

			until("created and Ready", func() bool { return ready(current()) })
			first := current()

			sc.change(first)
			require.NoError(t, c.Update(ctx, first))
			until("replaced and Ready", func() bool {
				p := current()
				return ready(p) && p.Status.SpecHash != first.Status.SpecHash && p.Status.IP != first.Status.IP
			})
			require.Equal(t, first.Status.InstanceName, current().Status.InstanceName, "the replacement keeps the name")

			require.NoError(t, c.Delete(ctx, current()))
			until("deleted", func() bool {
				return apierrors.IsNotFound(c.Get(ctx, key, &crawlv1alpha1.Proxy{}))
			})
			require.Zero(t, sc.instances(t), "an instance outlived its Proxy after %d steps", steps)
			if sc.verify != nil {
				sc.verify(t)
			}
		})
	}
}

func TestCrashSafetyKubernetes(t *testing.T) {
	runCrashScenario(t, func(t *testing.T, ns string) crashScenario {
		c := testenv.Shared(t).Client
		kubelet := &fakeKubelet{client: c}
		return crashScenario{
			proxy:     managedProxy(ns, "crashy"),
			providers: kubernetesProviders,
			between:   func(t *testing.T) { require.NoError(t, kubelet.tick(context.Background())) },
			instances: func(t *testing.T) int { return len(pods(t, c, ns)) },
			change:    func(p *crawlv1alpha1.Proxy) { p.Spec.Port = 8080 },
		}
	})
}

// probeBetweenSteps plays the health engine between restarts: a serving
// proxy without a verdict about its instance gets a passing one.
func probeBetweenSteps(t *testing.T, c client.Client, key types.NamespacedName) {
	t.Helper()
	var p crawlv1alpha1.Proxy
	if err := c.Get(context.Background(), key, &p); err != nil || !p.Serving() || p.IsReady() {
		return
	}
	require.NoError(t, testenv.ApplyHealth(context.Background(), c, &p, metav1.ConditionTrue, "ProbeSucceeded", "probed through the proxy"))
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

func (failingStatusWriter) Apply(context.Context, runtime.ApplyConfiguration, ...client.SubResourceApplyOption) error {
	return errors.New("operator crashed before recording")
}
