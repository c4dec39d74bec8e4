package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/example/egress-proxies-operator/gateway"
)

// testGateway: the operator's own gateway (--gateway-bind-address), in
// front of two Managed proxies (real Squid requiring the generated
// credentials): a crawler with nothing but a proxy URL reaches the HTTPS
// target, its session sticks to one proxy, a report by session moves the
// target elsewhere, and a wrong token gets 407.
func testGateway(t *testing.T) {
	ctx := context.Background()
	c := world.cluster.Env.Client
	ns := namespace(t)
	for _, name := range []string{"gw-a", "gw-b"} {
		p := managed(ns, name)
		require.NoError(t, c.Create(ctx, p))
		waitProxy(t, client.ObjectKeyFromObject(p), "Ready and Healthy", readyAndHealthy)
	}
	pem, err := os.ReadFile(world.cluster.Target.CAFile)
	require.NoError(t, err)
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(pem))
	crawler := func(username, password string) (*http.Client, func() []string) {
		var mu sync.Mutex
		var upstreams []string
		proxy := &url.URL{Scheme: "http", User: url.UserPassword(username, password), Host: world.gateway}
		tr := &http.Transport{
			Proxy: http.ProxyURL(proxy), TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}, DisableKeepAlives: true,
			OnProxyConnectResponse: func(_ context.Context, _ *url.URL, _ *http.Request, resp *http.Response) error {
				mu.Lock()
				defer mu.Unlock()
				upstreams = append(upstreams, resp.Header.Get(gateway.HeaderUpstream))
				return nil
			},
		}
		return &http.Client{Transport: tr, Timeout: 20 * time.Second}, func() []string {
			mu.Lock()
			defer mu.Unlock()
			return append([]string(nil), upstreams...)
		}
	}
	fetch := func(cl *http.Client) (int, error) {
		resp, err := cl.Get(world.cluster.Target.URL)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		return resp.StatusCode, nil
	}

	cl, upstreams := crawler("e2e-gw.suite-"+ns, world.token)
	for range 3 {
		status, err := fetch(cl)
		require.NoError(t, err)
		require.Less(t, status, 300, "the target answers through the gateway")
	}
	ups := upstreams()
	require.Len(t, ups, 3)
	own := ups[0]
	assert.Contains(t, []string{ns + "/gw-a", ns + "/gw-b"}, own)
	assert.Equal(t, []string{own, own, own}, ups, "the session sticks to one proxy")

	target, err := url.Parse(world.cluster.Target.URL)
	require.NoError(t, err)
	r := api(t, "POST", "/v1/sessions/e2e-gw/report", fmt.Sprintf(`{"result":"rate_limited","target":%q,"retryAfterSeconds":600}`, target.Hostname()))
	require.Equal(t, http.StatusNoContent, r.status, "%v", r.body)
	status, err := fetch(cl)
	require.NoError(t, err)
	require.Less(t, status, 300)
	ups = upstreams()
	assert.NotEqual(t, own, ups[len(ups)-1], "the reported target goes through the other proxy")

	wrong, _ := crawler("e2e-gw", "not-the-token")
	_, err = fetch(wrong)
	require.Error(t, err, "a wrong token cannot tunnel")
	assert.Contains(t, err.Error(), "Proxy Authentication Required")
}
