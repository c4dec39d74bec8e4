package controllers

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/providers"
	"github.com/example/egress-proxies-operator/test/testenv"
	"github.com/example/egress-proxies-operator/tracing"
)

// TestAReconcileIsASpan: with tracing on, each reconcile of a Proxy is a
// span "reconcile Proxy" naming the proxy, its provider and the action the
// pass took, so a trace shows how long each step of a bring-up took.
func TestAReconcileIsASpan(t *testing.T) {
	recorder := tracetest.NewSpanRecorder()
	previous := otel.GetTracerProvider()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(recorder)))
	t.Cleanup(func() { otel.SetTracerProvider(previous) })

	env := testenv.Shared(t)
	ctx := context.Background()
	ns := env.Namespace(t)
	proxy := &crawlv1alpha1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "traced"},
		Spec:       crawlv1alpha1.ProxySpec{Mode: crawlv1alpha1.ModeManaged, Provider: "gcp-eu", Port: 3128},
	}
	require.NoError(t, env.Client.Create(ctx, proxy))
	mgr := newManager(t, env)
	require.NoError(t, indexProxies(mgr.GetFieldIndexer()))
	creds := credentialsCache(t, mgr)
	r := &ProxyReconciler{Client: mgr.GetClient(), Providers: providers.Set{}, Owner: testOwner, Recorder: events.NewFakeRecorder(100),
		CredentialsCache: creds, CredentialsNamespace: testCredentialsNamespace}
	stop := startManager(t, mgr, creds)
	defer stop()
	_, err := r.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(proxy)})
	require.NoError(t, err)

	var found bool
	for _, s := range recorder.Ended() {
		attrs := map[string]string{}
		for _, kv := range s.Attributes() {
			attrs[string(kv.Key)] = kv.Value.String()
		}
		if s.Name() != "reconcile Proxy" || attrs[string(tracing.KeyProxy)] != ns+"/traced" {
			continue
		}
		found = true
		assert.Equal(t, string(ActionAddFinalizer), attrs[string(tracing.KeyOutcome)], "the action the pass took")
		assert.Equal(t, ReasonFinalizerAdded, attrs["egress.reason"])
		assert.Equal(t, "gcp-eu", attrs["egress.provider"])
	}
	assert.True(t, found, "a span for the reconcile of %s/traced", ns)
}
