package gateway_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/example/egress-proxies-operator/gateway"
	"github.com/example/egress-proxies-operator/tracing"
	"github.com/example/egress-proxies-operator/tracing/tracingtest"
)

// TestTraces: with an OTLP endpoint, a plain request through the gateway
// is a span in the trace its client's traceparent names, with a child for
// the pick and one for the upstream's answer; a tunnel is a span with its
// upstream connect, bytes and outcome; a lease taken on the API is a span
// in its caller's trace too. Each names the tenant, the proxy and the host.
func TestTraces(t *testing.T) {
	receiver := tracingtest.Start()
	defer receiver.Close()
	stop, err := tracing.Setup(context.Background(), tracing.Options{Endpoint: receiver.URL, SampleRatio: 1}, "gateway-test")
	require.NoError(t, err)
	stopped := false
	defer func() {
		if !stopped {
			_ = stop(context.Background())
		}
	}()
	f := newFixture(t, gateway.Options{})
	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	traceparent := "00-" + traceID + "-" + parentID + "-01"

	// A plain request, in the client's trace.
	c, _ := f.client("crawler-t")
	req, err := http.NewRequest(http.MethodGet, f.plain.srv.URL+"/page", nil)
	require.NoError(t, err)
	req.Header.Set("traceparent", traceparent)
	resp, err := c.Do(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	proxy := resp.Header.Get(gateway.HeaderUpstream)

	// A tunnel, which ends when the client is done with it.
	status, _ := get(t, c, f.sites[0].srv.URL+"/page")
	require.Equal(t, http.StatusOK, status)
	require.Eventually(t, func() bool { return f.gw.Open() == 0 }, 10*time.Second, 10*time.Millisecond, "the tunnel closed")

	// A lease on the API, in the caller's trace.
	body := `{"selector":{"geo":"local"},"target":"shop.example"}`
	lreq, err := http.NewRequest(http.MethodPost, f.api.URL+"/v1/leases", strings.NewReader(body))
	require.NoError(t, err)
	lreq.Header.Set("Authorization", "Bearer "+token)
	lreq.Header.Set("traceparent", traceparent)
	lresp, err := http.DefaultClient.Do(lreq)
	require.NoError(t, err)
	_ = lresp.Body.Close()
	require.Equal(t, http.StatusCreated, lresp.StatusCode)

	require.NoError(t, stop(context.Background()), "flushed to the receiver")
	stopped = true

	requests := receiver.Named("gateway request")
	require.Len(t, requests, 1)
	r := requests[0]
	assert.Equal(t, traceID, r.TraceID, "the client's trace")
	assert.Equal(t, parentID, r.ParentID)
	assert.Equal(t, "gateway-test", r.Service)
	assert.Equal(t, "platform", r.Attributes["egress.tenant"])
	assert.Equal(t, "crawler-t", r.Attributes["egress.session"])
	assert.Equal(t, f.plain.host(), r.Attributes["egress.host"])
	assert.Equal(t, proxy, r.Attributes["egress.proxy"])
	assert.Equal(t, "ok", r.Attributes["egress.outcome"])
	assert.Equal(t, "200", r.Attributes["http.response.status_code"])
	assert.NotEqual(t, "0", r.Attributes["egress.bytes_down"])
	children := map[string]string{}
	for _, s := range receiver.Spans() {
		if s.ParentID == r.SpanID {
			children[s.Name] = s.Attributes["egress.proxy"]
		}
	}
	assert.Equal(t, map[string]string{"pick": proxy, "upstream request": proxy}, children)

	tunnels := receiver.Named("gateway tunnel")
	require.Len(t, tunnels, 1)
	tun := tunnels[0]
	assert.Equal(t, f.sites[0].host(), tun.Attributes["egress.host"])
	assert.NotEmpty(t, tun.Attributes["egress.proxy"])
	assert.Equal(t, "done", tun.Attributes["egress.outcome"])
	assert.NotEqual(t, "0", tun.Attributes["egress.bytes_up"], "the client's TLS handshake and request")
	assert.NotEqual(t, "0", tun.Attributes["egress.bytes_down"])
	connects := 0
	for _, s := range receiver.Named("upstream connect") {
		if s.ParentID == tun.SpanID {
			connects++
			assert.Equal(t, tun.Attributes["egress.proxy"], s.Attributes["egress.proxy"])
		}
	}
	assert.Equal(t, 1, connects)

	leases := receiver.Named("POST /v1/leases")
	require.Len(t, leases, 1)
	l := leases[0]
	assert.Equal(t, traceID, l.TraceID)
	assert.Equal(t, parentID, l.ParentID)
	assert.Equal(t, "platform", l.Attributes["egress.tenant"])
	assert.Equal(t, "shop.example", l.Attributes["egress.host"])
	assert.Contains(t, f.proxies, l.Attributes["egress.proxy"])
	assert.Equal(t, "201", l.Attributes["http.response.status_code"])
}
