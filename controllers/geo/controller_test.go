package geo

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/geoip"
	"github.com/example/egress-proxies-operator/geoip/geoiptest"
	"github.com/example/egress-proxies-operator/test/testenv"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testenv.StopShared()
	os.Exit(code)
}

// TestProxiesShowWhereTheirExitIPIs: a Proxy on an address the database
// knows shows its country and ASN in status; one declaring another
// country shows the mismatch and gets a Warning Event; a new version of
// the database is followed without any change to the Proxies.
func TestProxiesShowWhereTheirExitIPIs(t *testing.T) {
	env := testenv.Shared(t)
	ns := env.Namespace(t)
	path := filepath.Join(t.TempDir(), "city.mmdb")
	require.NoError(t, geoiptest.Write(path, map[string]geoip.Location{
		"127.0.60.0/24": {Country: "BE", City: "Brussels", ASN: 396982, ASNOrg: "GOOGLE-CLOUD-PLATFORM"},
	}))
	db, err := geoip.Open([]string{path})
	require.NoError(t, err)

	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{Scheme: env.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0"})
	require.NoError(t, err)
	recorder := events.NewFakeRecorder(16)
	require.NoError(t, (&Reconciler{Client: mgr.GetClient(), Database: db, Recorder: recorder}).SetupWithManager(mgr))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })

	agrees := readyExternal(t, env.Client, ns, "agrees", "127.0.60.1", map[string]string{"country": "be"})
	disagrees := readyExternal(t, env.Client, ns, "disagrees", "127.0.60.2", map[string]string{"country": "de"})
	unknown := readyExternal(t, env.Client, ns, "unknown", "127.0.61.1", nil)

	geoOf := func(p *crawlv1alpha1.Proxy) *crawlv1alpha1.ProxyGeo {
		var cur crawlv1alpha1.Proxy
		require.NoError(t, env.Client.Get(context.Background(), client.ObjectKeyFromObject(p), &cur))
		return cur.Status.Geo
	}
	require.Eventually(t, func() bool { g := geoOf(agrees); return g != nil && g.Country == "BE" }, 10*time.Second, 10*time.Millisecond)
	assert.Equal(t, &crawlv1alpha1.ProxyGeo{IP: "127.0.60.1", Country: "BE", City: "Brussels", ASN: 396982, ASNOrg: "GOOGLE-CLOUD-PLATFORM"}, geoOf(agrees))
	require.Eventually(t, func() bool { g := geoOf(disagrees); return g != nil && g.Mismatch != "" }, 10*time.Second, 10*time.Millisecond)
	assert.Equal(t, "country de is declared; the database places the exit IP in BE", geoOf(disagrees).Mismatch)
	select {
	case e := <-recorder.Events:
		assert.True(t, strings.HasPrefix(e, "Warning GeoMismatch"), e)
		assert.Contains(t, e, "the database places the exit IP in BE")
	case <-time.After(10 * time.Second):
		t.Fatal("a mismatch is told by an Event")
	}

	// The database learns the other network: the Proxy that had no geo
	// gets one, with nothing else changing.
	require.NoError(t, geoiptest.Write(path, map[string]geoip.Location{
		"127.0.60.0/24": {Country: "BE", City: "Brussels", ASN: 396982, ASNOrg: "GOOGLE-CLOUD-PLATFORM"},
		"127.0.61.0/24": {Country: "NL", ASN: 16509, ASNOrg: "AMAZON-02"},
	}))
	require.NoError(t, os.Chtimes(path, time.Now(), time.Now().Add(time.Minute)))
	assert.Nil(t, geoOf(unknown), "not known before the refresh")
	changed, err := db.Refresh()
	require.NoError(t, err)
	require.True(t, changed)
	require.Eventually(t, func() bool { g := geoOf(unknown); return g != nil && g.Country == "NL" }, 10*time.Second, 10*time.Millisecond)
	assert.Equal(t, int64(16509), geoOf(unknown).ASN)
}

// readyExternal creates an External Proxy with attrs and records it Ready
// at ip, as the reconciler would.
func readyExternal(t *testing.T, c client.Client, ns, name, ip string, attrs map[string]string) *crawlv1alpha1.Proxy {
	t.Helper()
	ctx := context.Background()
	p := &crawlv1alpha1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: crawlv1alpha1.ProxySpec{Mode: crawlv1alpha1.ModeExternal, Port: 3128, Attributes: attrs,
			External: &crawlv1alpha1.ExternalEndpoint{Address: ip}},
	}
	require.NoError(t, c.Create(ctx, p))
	p.Status = crawlv1alpha1.ProxyStatus{Phase: crawlv1alpha1.PhaseReady, IP: ip, Port: 3128}
	meta.SetStatusCondition(&p.Status.Conditions, metav1.Condition{Type: crawlv1alpha1.ConditionProvisioned, Status: metav1.ConditionTrue, Reason: "External", Message: "x"})
	require.NoError(t, c.Status().Update(ctx, p))
	return p
}
