package gateway_test

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/broker"
	"github.com/example/egress-proxies-operator/discovery"
	"github.com/example/egress-proxies-operator/gateway"
	"github.com/example/egress-proxies-operator/inspect"
	"github.com/example/egress-proxies-operator/lease"
	"github.com/example/egress-proxies-operator/netid"
	"github.com/example/egress-proxies-operator/providers/squidconf"
	"github.com/example/egress-proxies-operator/test/simweb"
	"github.com/example/egress-proxies-operator/test/squid"
	"github.com/example/egress-proxies-operator/test/testenv"
)

// TestEachSessionLeavesFromItsOwnAddress: a proxy with session addresses
// (a dual-stack VM's Squid, leaving from addresses of its IPv6 range; here
// three loopback addresses, the only ones a test may leave from) carries
// each gateway session from the address its key hashes to, on every tunnel
// and plain-HTTP or inspected request alike, and sessions spread over the addresses; a
// rotating client leaves from the proxy's own address. The header that
// names the address never reaches a site, and a plain-HTTP client's own
// is replaced.
func TestEachSessionLeavesFromItsOwnAddress(t *testing.T) {
	own := "127.0.0.91"
	addresses := []netip.Addr{netip.MustParseAddr("127.0.91.1"), netip.MustParseAddr("127.0.91.2"), netip.MustParseAddr("127.0.91.3")}
	rules := squid.DefaultRules + "request_header_access " + netid.SessionHeader + " deny all\n" +
		squidconf.SessionAddressRules(netip.MustParseAddr(own), addresses)
	squid.Start(t, squid.Config{Address: own, Port: 3128, Rules: rules})

	view := broker.NewView(nil, "operator-ns")
	p := &crawlv1alpha1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "crawl", Name: "dual"},
		Spec:       crawlv1alpha1.ProxySpec{Mode: crawlv1alpha1.ModeExternal, External: &crawlv1alpha1.ExternalEndpoint{Address: own}},
		Status: crawlv1alpha1.ProxyStatus{Phase: crawlv1alpha1.PhaseReady, IP: own, Port: 3128,
			IPv6Prefix: "2001:db8:9:1:0:1::/96", SessionAddresses: int32(len(addresses))},
	}
	testenv.SetHealth(p, metav1.ConditionTrue, "ProbeSucceeded")
	view.Upsert(p)
	ca, err := inspect.NewCA("test inspecting CA", time.Now())
	require.NoError(t, err)
	authority, sitesCAs := inspect.Static{Cert: &ca}, x509.NewCertPool()
	server := discovery.NewServer(discovery.Options{Store: lease.NewMemoryStore(nil), View: view, Tokens: discovery.StaticToken(token),
		DefaultTTL: broker.DefaultTTL, MaxTTL: broker.DefaultMaxTTL, DefaultCooldown: time.Minute, InspectCA: authority})
	gw := gateway.New(gateway.Options{Upstreams: server.Tunnels(), Destinations: gateway.Destinations{ConnectPorts: []int{0}, HTTPPorts: []int{0}},
		Inspect: gateway.Inspect{Authority: authority, RootCAs: sitesCAs}})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: gw, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(func() { _ = srv.Close() })

	// Each site records where each session's requests came from, and
	// whether the header reached it.
	var mu sync.Mutex
	from := map[string][]string{}
	leaked := 0
	record := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ip, _, _ := net.SplitHostPort(r.RemoteAddr)
		mu.Lock()
		from[r.Header.Get("X-Test-Session")] = append(from[r.Header.Get("X-Test-Session")], ip)
		if r.Header.Get(netid.SessionHeader) != "" {
			leaked++
		}
		mu.Unlock()
		_, _ = fmt.Fprint(w, "page")
	})
	tlsSite, plainSite := httptest.NewUnstartedServer(record), httptest.NewUnstartedServer(record)
	for ip, s := range map[string]*httptest.Server{"127.0.0.92": tlsSite, "127.0.0.93": plainSite} {
		s.Listener, err = net.Listen("tcp", ip+":0")
		require.NoError(t, err)
		t.Cleanup(s.Close)
	}
	cert, err := simweb.SelfSigned(net.ParseIP("127.0.0.92"), "session address test site")
	require.NoError(t, err)
	sitesCAs.AddCert(cert.Leaf)
	tlsSite.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	tlsSite.StartTLS()
	plainSite.Start()
	clientRoots := x509.NewCertPool()
	clientRoots.AddCert(cert.Leaf)
	clientRoots.AddCert(ca.Leaf)

	fetch := func(username, session, rawURL string) {
		t.Helper()
		proxy := &url.URL{Scheme: "http", User: url.UserPassword(username, token), Host: lis.Addr().String()}
		c := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{Proxy: http.ProxyURL(proxy), DisableKeepAlives: true,
			TLSClientConfig: &tls.Config{RootCAs: clientRoots, MinVersion: tls.VersionTLS12}}}
		req, err := http.NewRequest(http.MethodGet, rawURL, nil)
		require.NoError(t, err)
		req.Header.Set("X-Test-Session", session)
		if req.URL.Scheme == "http" {
			// The gateway reads a plain-HTTP request's headers: a
			// client's own choice of address counts for nothing there.
			// (Inside a tunnel the request is the client's business.)
			req.Header.Set(netid.SessionHeader, "2")
		}
		resp, err := c.Do(req)
		require.NoError(t, err)
		_ = resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	const sessions = 12
	for i := range sessions {
		session := fmt.Sprintf("s%d", i)
		fetch(session, session, tlsSite.URL+"/a")
		fetch(session, session, plainSite.URL+"/b")
		fetch(session, session, tlsSite.URL+"/c")
		fetch(session+".inspect", session, tlsSite.URL+"/inspected") // its CONNECT through the proxy names the address
	}
	fetch("", "rotating", tlsSite.URL+"/d")
	fetch("", "rotating", plainSite.URL+"/e")

	mu.Lock()
	defer mu.Unlock()
	used := map[string]bool{}
	for i := range sessions {
		session := fmt.Sprintf("s%d", i)
		want := addresses[netid.SessionIndex(session, len(addresses))].String()
		assert.Equal(t, []string{want, want, want, want}, from[session], "session %s leaves from its address on every tunnel and request", session)
		used[want] = true
	}
	assert.Greater(t, len(used), 1, "sessions spread over the addresses")
	assert.Equal(t, []string{own, own}, from["rotating"], "no session, no session address: the proxy's own")
	assert.Zero(t, leaked, "the header never reaches a site")
}
