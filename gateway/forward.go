package gateway

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strings"
	"time"

	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/example/egress-proxies-operator/broker"
	"github.com/example/egress-proxies-operator/client"
	"github.com/example/egress-proxies-operator/lease"
	"github.com/example/egress-proxies-operator/netid"
	"github.com/example/egress-proxies-operator/tracing"
)

// squidErrorHeader is the header Squid puts on the answers it makes
// itself (ERR_ACCESS_DENIED, ERR_CONNECT_FAIL, ...), never on a site's.
const squidErrorHeader = "X-Squid-Error"

// upstreamKey carries a forwarded request's upstream to the forwarder's
// Proxy function.
type upstreamKey struct{}

// upstreamOf is the forwarder's Proxy: the upstream picked for the request,
// with its credentials. A session address is in the URL's fragment, which
// the transport keys its idle connections by (never sent): a connection,
// or a CONNECT tunnel, made to leave from one address never carries
// another session's request.
func upstreamOf(r *http.Request) (*url.URL, error) {
	up, ok := r.Context().Value(upstreamKey{}).(broker.Upstream)
	if !ok {
		return nil, errors.New("no upstream picked for the request")
	}
	u := &url.URL{Scheme: "http", Host: up.Address, User: up.User}
	if up.SessionAddress != "" {
		u.Fragment = sessionAddressFragment + up.SessionAddress
	}
	return u, nil
}

// sessionAddressFragment prefixes a session address in an upstream URL's
// fragment (upstreamOf).
const sessionAddressFragment = "session-address-"

// sessionAddressHeader is the forwarder's GetProxyConnectHeader: the
// CONNECT of an inspected tunnel names its session's address, as the
// gateway's own tunnels do.
func sessionAddressHeader(_ context.Context, proxy *url.URL, _ string) (http.Header, error) {
	if i, ok := strings.CutPrefix(proxy.Fragment, sessionAddressFragment); ok {
		return http.Header{netid.SessionHeader: {i}}, nil
	}
	return nil, nil
}

// hopHeaders are the hop-by-hop headers (RFC 9110 7.6.1) a proxy must not
// pass on; Proxy-Authorization above all carries the client's token.
var hopHeaders = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

// setSessionAddress names the address a session leaves from ("": the
// proxy's own) in h, in place of any the client sent.
func setSessionAddress(h http.Header, address string) {
	h.Del(netid.SessionHeader)
	if address != "" {
		h.Set(netid.SessionHeader, address)
	}
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
	g.carryRequest(w, r, out, id, g.forwarder, false)
}

// carryRequest carries out (the client's request r, made ready to go)
// through an upstream picked for its host: each request takes its own
// lease, so its host's pace gives it a slot of its own. A request without
// a body is retried on another upstream when one cannot be reached or
// refuses our credentials and, when inspecting, once when the site refuses
// the IP (a 403 or a block page to a GET or HEAD). The site's push-backs and
// refusals are recorded as outcomes; Squid's own answers are not.
func (g *Gateway) carryRequest(w http.ResponseWriter, r, out *http.Request, id Identity, rt http.RoundTripper, inspecting bool) {
	host := out.URL.Hostname()
	ctx, span := startSpan(r.Context(), "gateway request", id, host)
	outcome := "ok"
	defer func() { endSpan(span, outcome) }()
	stripHop(out.Header)
	retryable := r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0
	idempotent := retryable && (r.Method == http.MethodGet || r.Method == http.MethodHead)
	var avoid []string
	var last *failure
	restart, retriedBan := false, false
	for attempt := 0; attempt < g.opts.Attempts+1; attempt++ {
		req := g.tunnelRequest(id, host, avoid)
		req.Restart = restart
		up, err := g.pick(ctx, req)
		if err != nil {
			a := pickAnswer(err, last)
			outcome = a.cause
			a.write(w, r)
			return
		}
		span.SetAttributes(tracing.KeyProxy.String(up.ProxyID), tracing.KeyExitIP.String(up.ExitIP))
		// The request waits for its slot once its connection is ready
		// (a new one takes a CONNECT and a TLS handshake first), so the
		// site sees it at its slot, not a handshake later than the last.
		slot := time.Now().Add(up.Wait)
		paceWaitSpan(ctx, up.Wait)
		if !inspecting {
			// Squid reads (and drops) it on a plain-HTTP request; an
			// inspected one names it in its CONNECT instead, never to
			// the site.
			setSessionAddress(out.Header, up.SessionAddress)
		}
		upCtx, upSpan := tracing.Tracer(tracerName).Start(ctx, "upstream request", trace.WithAttributes(tracing.KeyProxy.String(up.ProxyID)))
		gate := &slotGate{slot: slot}
		if up.Paced {
			gate.retake = func(ctx context.Context) time.Duration {
				return g.retakeSlot(ctx, up.ProxyID, broker.NormalizeTarget(host))
			}
		}
		resp, err := rt.RoundTrip(gate.request(out.WithContext(context.WithValue(upCtx, upstreamKey{}, up))))
		if err != nil {
			upSpan.SetStatus(codes.Error, err.Error())
		} else {
			upSpan.SetAttributes(semconv.HTTPResponseStatusCode(resp.StatusCode))
		}
		upSpan.End()
		if ctx.Err() != nil {
			if err == nil {
				_ = resp.Body.Close()
			}
			g.opts.Upstreams.ReleaseTunnel(context.WithoutCancel(ctx), up.LeaseID, id.Session, broker.Carried{})
			return
		}
		var f *failure
		switch {
		case err != nil:
			f = &failure{proxy: up.ProxyID, reason: failDial, err: err}
		case resp.StatusCode == http.StatusProxyAuthRequired:
			_ = resp.Body.Close()
			f = &failure{proxy: up.ProxyID, reason: failAuth, status: resp.StatusCode, err: errors.New("the upstream refused our credentials (407)")}
		}
		if f == nil {
			refusal := g.judgeAnswer(ctx, id, up, host, resp)
			// An idempotent request the site refused the IP is tried once
			// more on another, when the gateway inspects: it saw the
			// answer before the client did.
			if inspecting && refusal == refusalBlocked && idempotent && !id.Strict && !retriedBan {
				_ = resp.Body.Close()
				g.opts.Upstreams.ReleaseTunnel(context.WithoutCancel(ctx), up.LeaseID, id.Session, broker.Carried{})
				inspectRetries.Inc()
				logf.FromContext(ctx).V(1).Info("the site refused an inspected request's IP; trying another once", "proxy", up.ProxyID, "host", host)
				retriedBan, restart = true, up.Fresh
				avoid = append(avoid, up.ProxyID)
				continue
			}
			carried := broker.Carried{Up: max(r.ContentLength, 0), Down: g.relay(w, resp, up), Requests: 1}
			span.SetAttributes(tracing.KeyBytesUp.Int64(carried.Up), tracing.KeyBytesDown.Int64(carried.Down), semconv.HTTPResponseStatusCode(resp.StatusCode))
			if refusal != refusalNone {
				outcome = resultOf(refusal)
			}
			g.opts.Upstreams.ReleaseTunnel(context.WithoutCancel(ctx), up.LeaseID, id.Session, carried)
			if g.opts.Upstreams.CountBytes(context.WithoutCancel(ctx), id.Tenant, carried.Up+carried.Down) {
				g.cutTenant(id.Tenant.Name)
			}
			return
		}
		g.upstreamFailed(f)
		g.opts.Upstreams.ReleaseTunnel(context.WithoutCancel(ctx), up.LeaseID, id.Session, broker.Carried{})
		if !retryable || attempt+1 >= g.opts.Attempts {
			a := f.answer()
			outcome = a.cause
			a.write(w, r)
			return
		}
		logf.FromContext(ctx).Info("upstream failed a request; trying another", "proxy", up.ProxyID, "reason", f.reason, "error", f.err.Error())
		avoid = append(avoid, up.ProxyID)
		last = f
		restart = up.Fresh
	}
}

// slotGate holds a request, once the transport has its connection, until
// its slot (untilSlot: a new connection takes a CONNECT and a TLS
// handshake, which may outlast it; with retake set, a paced host, a late
// request takes a slot of its own). A request whose client went away
// meanwhile is never sent (its connection is closed instead).
type slotGate struct {
	slot   time.Time
	retake func(context.Context) time.Duration
}

// request is r held by the gate.
func (s *slotGate) request(r *http.Request) *http.Request {
	ctx := r.Context()
	return r.WithContext(httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) {
		if !sleep(ctx, untilSlot(ctx, s.slot, s.retake)) {
			_ = info.Conn.Close()
		}
	}}))
}

// What a site's answer was, as judgeAnswer reads it.
const (
	refusalNone    = iota // a page, or an answer of Squid's
	refusalLimited        // a 429 (or a 503 with Retry-After): a push-back
	refusalBlocked        // a 403, or a block page (BlockMarkers)
)

// resultOf is what a site's answer of refusal says, in the results of
// reports (lease.ResultOK for a page).
func resultOf(refusal int) string {
	switch refusal {
	case refusalLimited:
		return lease.ResultRateLimited
	case refusalBlocked:
		return lease.ResultBlocked
	}
	return lease.ResultOK
}

// judgeAnswer reads a site's answer to a request through up and records
// what it says: a push-back slows the host's learned pace and, with a
// Retry-After, cools the proxy for the host that long for everyone; a
// refusal of the IP is a blocked outcome. A block page is told by
// BlockMarkers in the first bytes of an HTML body, which stay in resp.
func (g *Gateway) judgeAnswer(ctx context.Context, id Identity, up broker.Upstream, host string, resp *http.Response) int {
	// Squid marks the answers it makes itself (a denied destination, a
	// site it cannot reach): those say nothing of how the site sees the
	// proxy.
	if resp.Header.Get(squidErrorHeader) != "" {
		return refusalNone
	}
	ctx = context.WithoutCancel(ctx)
	retryAfter, _ := client.ParseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
	refusal := refusalNone
	switch {
	case resp.StatusCode == http.StatusTooManyRequests || (resp.StatusCode == http.StatusServiceUnavailable && retryAfter > 0):
		refusal = refusalLimited
	case resp.StatusCode == http.StatusForbidden, g.blockPage(resp):
		refusal = refusalBlocked
	}
	if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable {
		// The site pushed back: the host's pace learns from it.
		g.opts.Upstreams.PushBack(ctx, host, retryAfter)
	}
	if refusal != refusalNone {
		g.opts.Upstreams.Refused(ctx, id.Tenant, up.ProxyID, host, refusal == refusalLimited, retryAfter)
	}
	// The session's stint keeps score of how the site sees it: refusals
	// add, pages take away (only from a score there is: no write per page).
	if refusal != refusalNone || up.Score > 0 && resp.StatusCode < http.StatusBadRequest {
		g.opts.Upstreams.MarkSession(ctx, up.Session, up.ProxyID, resultOf(refusal))
	}
	return refusal
}

// blockPageScan is how much of an HTML body the gateway reads for a block
// marker.
const blockPageScan = 64 << 10

// blockPage says whether resp is a 200 block page: an HTML body whose
// first blockPageScan bytes hold one of BlockMarkers. What it read stays
// at the front of resp.Body.
func (g *Gateway) blockPage(resp *http.Response) bool {
	if len(g.opts.BlockMarkers) == 0 || resp.StatusCode != http.StatusOK || !strings.Contains(resp.Header.Get("Content-Type"), "html") ||
		resp.Header.Get("Content-Encoding") != "" {
		return false
	}
	head, err := io.ReadAll(io.LimitReader(resp.Body, blockPageScan))
	resp.Body = readCloser{Reader: io.MultiReader(bytes.NewReader(head), resp.Body), Closer: resp.Body}
	if err != nil {
		return false
	}
	for _, m := range g.opts.BlockMarkers {
		if bytes.Contains(head, []byte(m)) {
			return true
		}
	}
	return false
}

type readCloser struct {
	io.Reader
	io.Closer
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
	if up.Retired != "" {
		w.Header().Set(HeaderSessionRetired, up.Retired)
	}
	// The gateway's member goes last: the one farthest from the site.
	w.Header().Add("Proxy-Status", servedStatus(up))
	w.WriteHeader(resp.StatusCode)
	n, _ := io.Copy(w, resp.Body)
	bytesTotal.WithLabelValues(directionDown).Add(float64(n))
	requestsTotal.WithLabelValues(kindHTTP, outcomeOK).Inc()
	return n
}
