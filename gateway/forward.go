package gateway

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/example/egress-proxies-operator/broker"
	"github.com/example/egress-proxies-operator/client"
)

// squidErrorHeader is the header Squid puts on the answers it makes
// itself (ERR_ACCESS_DENIED, ERR_CONNECT_FAIL, ...), never on a site's.
const squidErrorHeader = "X-Squid-Error"

// upstreamKey carries a forwarded request's upstream to the forwarder's
// Proxy function.
type upstreamKey struct{}

// upstreamOf is the forwarder's Proxy: the upstream picked for the request,
// with its credentials.
func upstreamOf(r *http.Request) (*url.URL, error) {
	up, ok := r.Context().Value(upstreamKey{}).(broker.Upstream)
	if !ok {
		return nil, errors.New("no upstream picked for the request")
	}
	return &url.URL{Scheme: "http", Host: up.Address, User: up.User}, nil
}

// hopHeaders are the hop-by-hop headers (RFC 9110 7.6.1) a proxy must not
// pass on; Proxy-Authorization above all carries the client's token.
var hopHeaders = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

func stripHop(h http.Header) {
	for _, f := range h.Values("Connection") {
		for _, name := range strings.Split(f, ",") {
			h.Del(strings.TrimSpace(name))
		}
	}
	for _, name := range hopHeaders {
		h.Del(name)
	}
}

// forward carries a plain-HTTP request through an upstream. A request
// without a body is retried on another upstream when one cannot be reached
// or refuses our credentials; any answer of the site's goes back as it is.
func (g *Gateway) forward(w http.ResponseWriter, r *http.Request, id Identity) {
	ctx := r.Context()
	if !g.takeSlot(ctx) {
		g.busy(w, r)
		return
	}
	defer g.freeSlot()
	out := r.Clone(ctx)
	out.RequestURI = ""
	stripHop(out.Header)
	retryable := r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0
	var avoid []string
	var last *failure
	restart := false
	for attempt := range g.opts.Attempts {
		req := g.tunnelRequest(id, r.URL.Hostname(), avoid)
		req.Restart = restart
		up, err := g.pick(ctx, req)
		if err != nil {
			pickAnswer(err, last).write(w, r)
			return
		}
		if !waitForSlot(ctx, up) {
			g.opts.Upstreams.ReleaseTunnel(context.WithoutCancel(ctx), up.LeaseID, id.Session, 0)
			return
		}
		resp, err := g.forwarder.RoundTrip(out.WithContext(context.WithValue(ctx, upstreamKey{}, up)))
		var f *failure
		switch {
		case err != nil:
			f = &failure{proxy: up.ProxyID, reason: failDial, err: err}
		case resp.StatusCode == http.StatusProxyAuthRequired:
			_ = resp.Body.Close()
			f = &failure{proxy: up.ProxyID, reason: failAuth, status: resp.StatusCode, err: errors.New("the upstream refused our credentials (407)")}
		}
		if f == nil {
			// Squid marks the answers it makes itself (a denied
			// destination, a site it cannot reach): those say nothing of
			// how the site sees the proxy.
			fromSite := resp.Header.Get(squidErrorHeader) == ""
			if fromSite && (resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable) {
				// The site pushed back: the host's pace learns from it.
				retryAfter, _ := client.ParseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
				g.opts.Upstreams.PushBack(context.WithoutCancel(ctx), r.URL.Hostname(), retryAfter)
			}
			if fromSite && (resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusForbidden) {
				g.opts.Upstreams.Refused(context.WithoutCancel(ctx), id.Tenant, up.ProxyID, r.URL.Hostname(), resp.StatusCode == http.StatusTooManyRequests)
			}
			n := g.relay(w, resp, up) + max(r.ContentLength, 0)
			g.opts.Upstreams.ReleaseTunnel(context.WithoutCancel(ctx), up.LeaseID, id.Session, n)
			if g.opts.Upstreams.CountBytes(context.WithoutCancel(ctx), id.Tenant, n) {
				g.cutTenant(id.Tenant.Name)
			}
			return
		}
		upstreamFailures.WithLabelValues(f.reason).Inc()
		g.opts.Upstreams.ReleaseTunnel(context.WithoutCancel(ctx), up.LeaseID, id.Session, 0)
		if !retryable || attempt+1 == g.opts.Attempts {
			f.answer().write(w, r)
			return
		}
		logf.FromContext(ctx).Info("upstream failed a request; trying another", "proxy", up.ProxyID, "reason", f.reason, "error", f.err.Error())
		avoid = append(avoid, up.ProxyID)
		last = f
		restart = up.Fresh
	}
}

// relay writes an upstream's response back to the client, and returns
// the body's bytes.
func (g *Gateway) relay(w http.ResponseWriter, resp *http.Response, up broker.Upstream) int64 {
	defer resp.Body.Close()
	stripHop(resp.Header)
	for k, vs := range resp.Header {
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	w.Header().Set(HeaderUpstream, up.ProxyID)
	if up.ExitIP != "" {
		w.Header().Set(HeaderExitIP, up.ExitIP)
	}
	// The gateway's member goes last: the one farthest from the site.
	w.Header().Add("Proxy-Status", servedStatus(up))
	w.WriteHeader(resp.StatusCode)
	n, _ := io.Copy(w, resp.Body)
	bytesTotal.WithLabelValues(directionDown).Add(float64(n))
	requestsTotal.WithLabelValues(kindHTTP, outcomeOK).Inc()
	return n
}
