package gateway

import (
	"bufio"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/example/egress-proxies-operator/broker"
	"github.com/example/egress-proxies-operator/lease"
	"github.com/example/egress-proxies-operator/tenant"
	"github.com/example/egress-proxies-operator/tracing"
)

// Why a tunnel ended, for the metrics.
const (
	closedDone      = "done"       // both sides finished, or one reset once the client was done
	closedIdle      = "idle"       // nothing either way for IdleTimeout
	closedLifetime  = "lifetime"   // MaxTunnelLifetime reached
	closedError     = "error"      // a side failed, or the upstream reset while the client was not done
	closedReported  = "reported"   // the session reported the host rate-limiting it
	closedShutdown  = "shutdown"   // the gateway stopped
	closedQuota     = "quota"      // its tenant's bytes for the day are spent
	closedLeaseLost = "lease_lost" // its lease ran out (renewals failed)
	closedPaced     = "paced"      // its host's pace allowed its next request no slot within IdleTimeout
)

// tunnel is one client's CONNECT, spliced to its upstream.
type tunnel struct {
	// session is the session's key (broker.SessionKey), name the one
	// the client gave.
	session, name, host string
	// sentUp and sentDown count the bytes carried each way (moved, both);
	// counted is what of them was counted toward the tenant's quota (under
	// meterMu), metered whether its tenant has a bytes-per-day limit at all.
	sentUp, sentDown atomic.Int64
	who              *tenant.Tenant
	metered          bool
	meterMu          sync.Mutex
	counted          int64
	// clientEnded: the client has ended its side (the tunnel half-closed
	// the upstream's): a reset after it is how the other side closes.
	clientEnded atomic.Bool
	// ledgerUntil is how far its ledger records say it holds its IP (only
	// the renew loop reads and writes it).
	ledgerUntil time.Time
	// account counts the bytes moved so far toward the quota once at least
	// its argument of them are uncounted.
	account       func(least int64)
	up            broker.Upstream
	client, upstr net.Conn
	started       time.Time
	idle, life    time.Duration
	// lastActive is when a byte last moved either way (UnixNano).
	lastActive atomic.Int64
	closeOnce  sync.Once
	reason     string
	// closed ends when the tunnel closes: a request waiting for its slot
	// stops waiting.
	closed context.Context
	cancel context.CancelFunc
	// answers counts the upstream's writes to the client, and seenAnswers
	// how many of them the client's last turn followed (the client's
	// direction alone uses it): the client writing after more is a new
	// turn. turns follows the client's turns (turns.go: the client's
	// direction alone uses it); pace takes a paced turn's slot (nil: the
	// host is not paced).
	answers     atomic.Int64
	seenAnswers int64
	turns       turnCounter
	pace        func() bool
	// retake is how long the first request, late for its slot, waits for
	// one of its own (nil: the host is not paced); see retakeSlot.
	retake func(context.Context) time.Duration
	// firstSlot is when the client's first request may reach the site:
	// the slot its lease took.
	firstSlot time.Time
	// hello reads the client's ClientHello (the client's direction alone).
	hello hello
	// inspected: the gateway terminates the client's TLS and carries each
	// request on a lease of its own (inspect.go); the tunnel holds none.
	inspected bool
	// span is the tunnel's trace span, ended when it closes.
	span trace.Span
}

// clientCuts reads a client write: where in it requests begin that must
// wait (turns.go).
func (t *tunnel) clientCuts(p []byte) []cut {
	t.hello.observe(p)
	answers := t.answers.Load()
	cuts, consumed := t.turns.cuts(p, answers > t.seenAnswers)
	if consumed {
		// A write that is no turn of its own (an alert, a plain-HTTP
		// client's second write of one request) leaves the answer for the
		// client's next write.
		t.seenAnswers = answers
	}
	return cuts
}

// await holds a request of the client's until its slot: the first until
// the lease's, each later one until a slot of the host's pace of its own
// (paceTurn). False: the host's pace gives it none within the tunnel's
// IdleTimeout, or the tunnel closed while it waited, and the tunnel ends.
func (t *tunnel) await(c cut) bool {
	if c.first {
		// The client's handshake may have outlasted the slot (untilSlot).
		return sleep(t.closed, untilSlot(t.closed, t.firstSlot, t.retake))
	}
	if t.pace == nil {
		return true
	}
	return t.pace()
}

// tunnel serves a CONNECT: an upstream that takes the tunnel (retrying
// others), then the bytes both ways until either side is done.
func (g *Gateway) tunnel(w http.ResponseWriter, r *http.Request, id Identity) {
	ctx := r.Context()
	hostport := r.Host
	host, port, err := net.SplitHostPort(hostport)
	if err != nil || host == "" || port == "" {
		answer{status: http.StatusBadRequest, errType: psHTTPRequestError, cause: CauseBadRequest,
			msg: fmt.Sprintf("CONNECT needs host:port, got %q", hostport)}.write(w, r)
		return
	}
	if id.Inspect {
		g.inspectTunnel(w, r, id, hostport)
		return
	}
	ctx, span := startSpan(ctx, "gateway tunnel", id, host)
	if !g.takeSlot(ctx) {
		endSpan(span, CauseBusy)
		g.busy(w, r)
		return
	}
	start := time.Now()
	upstream, up, last, err := g.connectAny(ctx, id, host, hostport)
	if err != nil {
		g.freeSlot()
		a := pickAnswer(err, last)
		endSpan(span, a.cause)
		a.write(w, r)
		return
	}
	span.SetAttributes(tracing.KeyProxy.String(up.ProxyID), tracing.KeyExitIP.String(up.ExitIP))
	connectDuration.Observe(time.Since(start).Seconds())
	// From here the tunnel's context outlives the request's.
	bg := logf.IntoContext(context.Background(), logf.FromContext(ctx))
	abandon := func() {
		_ = upstream.conn.Close()
		g.opts.Upstreams.ReleaseTunnel(bg, up.LeaseID, id.Session, broker.Carried{})
		g.freeSlot()
		endSpan(span, closedError)
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		abandon()
		http.Error(w, "the connection cannot be hijacked", http.StatusInternalServerError)
		return
	}
	clientConn, brw, err := hj.Hijack()
	if err != nil {
		abandon()
		logf.FromContext(ctx).Error(err, "hijacking a CONNECT")
		return
	}
	// Bytes the client sent early (a TLS ClientHello) go first.
	early := unread(brw.Reader)
	_ = clientConn.SetDeadline(time.Time{})
	if _, err := io.WriteString(clientConn, connectReply(up)); err != nil {
		_ = clientConn.Close()
		abandon()
		return
	}
	requestsTotal.WithLabelValues(kindConnect, outcomeOK).Inc()
	life := g.opts.MaxTunnelLifetime
	if up.Paced {
		life = min(life, g.opts.PacedTunnelLifetime)
	}
	t := &tunnel{session: up.Session, name: id.Session, host: broker.NormalizeTarget(host), up: up, client: clientConn, upstr: upstream.conn,
		started: time.Now(), idle: g.opts.IdleTimeout, life: life, who: id.Tenant, metered: g.opts.Upstreams.MetersBytes(id.Tenant)}
	t.account = func(least int64) { g.meter(bg, t, least) }
	t.ledgerUntil = up.LedgerUntil
	t.firstSlot = upstream.slot
	t.closed, t.cancel = context.WithCancel(bg)
	t.span = span
	if up.Paced {
		t.pace = func() bool { return g.paceTurn(t.closed, t) }
		t.retake = func(ctx context.Context) time.Duration { return g.retakeSlot(ctx, up.ProxyID, t.host) }
	}
	if up.BannedClient != "" {
		bannedClientTunnels.Inc()
	}
	t.hello.saw = func(client string) { g.opts.Upstreams.SawClient(id.Tenant, up.Session, t.host, client) }
	t.touch()
	g.register(t)
	// The handler returns: net/http's connection state, its buffers and
	// this goroutine's grown stack go with it, and the tunnel lives on two
	// goroutines of its own with small stacks.
	go g.carry(bg, t, early, upstream.pending)
}

// lateSlot is how late after its slot a paced request may still go: a
// request later than that (its connection or the client's handshake took
// longer than the wait) takes a slot of its own (retakeSlot), so that it
// never falls closer than the pace to the request reserved after it. It is
// a fraction of the jitter allowance a declared rate keeps
// (lease.WindowJitter: 50 ms at 1 s), the rest being the network's.
const lateSlot = 10 * time.Millisecond

// untilSlot is how long a request due at slot waits before it goes: until
// its slot, or, when it is more than lateSlot late and retake is set (a
// paced host), for the slot retake takes. Sent at once, a late request
// would fall closer than the pace to the next one reserved after it.
func untilSlot(ctx context.Context, slot time.Time, retake func(context.Context) time.Duration) time.Duration {
	wait := time.Until(slot)
	if -wait > lateSlot && retake != nil {
		return retake(ctx)
	}
	return wait
}

// retakeSlot takes a new slot of host's pace on proxy for a request late
// for its own, and says how long to wait for it. When the pace has none
// within --gateway-pace-wait (a slow pace, whose next slot is far off) the
// request goes now, as late as it is: its lateness is then small against
// the spacing, and a tunnel the client already holds is not cut for it.
func (g *Gateway) retakeSlot(ctx context.Context, proxy, host string) time.Duration {
	wait, err := g.opts.Upstreams.Turn(ctx, proxy, host, max(g.opts.PaceWait, 0))
	if err != nil {
		lateSlots.WithLabelValues("sent_late").Inc()
		return 0
	}
	lateSlots.WithLabelValues("retaken").Inc()
	return wait
}

// paceTurn holds a request inside t until a slot of its host's pace
// (Upstreams.Turn). A request inside a tunnel cannot be answered 429, and
// closing the tunnel would cut every other request it carries (an HTTP/2
// client's streams), so one that gets no slot within PaceWait asks again
// until the tunnel's IdleTimeout has passed; false then, or when the store
// cannot say, or the tunnel closed: a request over the pace is what the
// fleet never sends.
func (g *Gateway) paceTurn(ctx context.Context, t *tunnel) bool {
	deadline := time.Now().Add(t.idle)
	for {
		wait, err := g.opts.Upstreams.Turn(ctx, t.up.ProxyID, t.host, max(g.opts.PaceWait, 0))
		var none *lease.NoProxyAvailableError
		switch {
		case err == nil:
			turnsPaced.WithLabelValues("sent").Inc()
			return sleep(ctx, wait)
		case !errors.As(err, &none) || !time.Now().Add(none.RetryAfter).Before(deadline):
			turnsPaced.WithLabelValues("refused").Inc()
			return false
		}
		if !sleep(ctx, max(none.RetryAfter-max(g.opts.PaceWait, 0), 10*time.Millisecond)) {
			return false
		}
	}
}

// connectReply is the gateway's 200 to a CONNECT: the upstream that
// carries the tunnel, its exit IP, and the same in Proxy-Status.
func connectReply(up broker.Upstream) string {
	reply := "HTTP/1.1 200 Connection established\r\n" + HeaderUpstream + ": " + up.ProxyID + "\r\n"
	if up.ExitIP != "" {
		reply += HeaderExitIP + ": " + up.ExitIP + "\r\n"
	}
	if up.Retired != "" {
		reply += HeaderSessionRetired + ": " + up.Retired + "\r\n"
	}
	return reply + "Proxy-Status: " + servedStatus(up) + "\r\n\r\n"
}

// busy answers a client beyond MaxTunnels.
func (g *Gateway) busy(w http.ResponseWriter, r *http.Request) {
	answer{status: http.StatusServiceUnavailable, errType: psConnectionLimitReached, cause: CauseBusy, retryAfter: time.Second,
		msg: fmt.Sprintf("the gateway carries its %d tunnels and requests; retry", g.opts.MaxTunnels)}.write(w, r)
}

// tunnelRequest is what id asks of a tunnel or request to host.
func (g *Gateway) tunnelRequest(id Identity, host string, avoid []string) broker.TunnelRequest {
	return broker.TunnelRequest{
		Tenant: id.Tenant, Session: id.Session, Strict: id.Strict, Lifetime: id.Lifetime, Exclusive: id.Exclusive,
		Selector: id.Selector, Host: host, Avoid: avoid, TTL: g.opts.LeaseTTL, SessionIdle: g.opts.SessionIdle,
		MaxErrorScore: g.opts.SessionMaxErrorScore, MaxUses: id.MaxUses,
	}
}

// carry runs a tunnel to its end, then gives back its place, its lease and
// its registration.
func (g *Gateway) carry(ctx context.Context, t *tunnel, early, pending []byte) {
	defer g.freeSlot()
	// Unregistered once its lease is released: a tunnel no longer open
	// holds no lease either.
	defer g.unregister(t)
	defer func() {
		g.opts.Upstreams.ReleaseTunnel(ctx, t.up.LeaseID, t.name, broker.Carried{Up: t.sentUp.Load(), Down: t.sentDown.Load()})
	}()
	t.run(early, pending)
	t.span.SetAttributes(tracing.KeyBytesUp.Int64(t.sentUp.Load()), tracing.KeyBytesDown.Int64(t.sentDown.Load()))
	endSpan(t.span, t.reason)
	t.account(1)
	tunnelsClosed.WithLabelValues(t.reason).Inc()
	tunnelDuration.Observe(time.Since(t.started).Seconds())
}

// connectAny opens a tunnel to hostport through the first upstream that
// takes it, trying at most Attempts of them; each failure is counted
// against its upstream, which the next pick avoids (a strict session's
// next pick then fails). last is the last failure, for the client's 502.
func (g *Gateway) connectAny(ctx context.Context, id Identity, host, hostport string) (dialed, broker.Upstream, *failure, error) {
	var avoid []string
	var last *failure
	restart := false
	for range g.opts.Attempts {
		req := g.tunnelRequest(id, host, avoid)
		req.Restart = restart
		up, err := g.pick(ctx, req)
		if err != nil {
			return dialed{}, broker.Upstream{}, last, err
		}
		// The slot is the first request's: the tunnel opens (and the
		// client's handshake goes) meanwhile, and the client's turn that
		// may carry the request waits for it (tunnel.await).
		slot := time.Now().Add(up.Wait)
		paceWaitSpan(ctx, up.Wait)
		d, f := g.connect(ctx, up, hostport)
		if f == nil {
			d.slot = slot
			return d, up, nil, nil
		}
		// A CONNECT answer always comes from the proxy, never from the
		// site: a refusal says nothing of how the site sees the proxy, so
		// it is no outcome (anyone could have the fleet's proxies refuse
		// made-up destinations and get them banned).
		g.upstreamFailed(f)
		logf.FromContext(ctx).Info("upstream failed a tunnel; trying another", "proxy", up.ProxyID, "reason", f.reason, "error", f.err.Error(),
			"session", id.Session, "host", host)
		g.opts.Upstreams.ReleaseTunnel(context.WithoutCancel(ctx), up.LeaseID, id.Session, broker.Carried{})
		avoid = append(avoid, up.ProxyID)
		last = f
		// A session whose first tunnel on a proxy failed never left from
		// it: even a strict one may start on another.
		restart = up.Fresh
	}
	return dialed{}, broker.Upstream{}, last, &lease.NoProxyAvailableError{}
}

// upstreamFailed counts f, and tells Options.OnUnreachable of a proxy that
// could not be reached or spoke no proxy's answer.
func (g *Gateway) upstreamFailed(f *failure) {
	upstreamFailures.WithLabelValues(f.reason).Inc()
	switch f.reason {
	case failDial, failTimeout, failProtocol, failAuth:
		if g.opts.OnUnreachable != nil {
			g.opts.OnUnreachable(f.proxy)
		}
	}
}

// Upstream failure reasons, for the metrics.
const (
	failDial     = "dial"     // the upstream could not be reached
	failTimeout  = "timeout"  // no CONNECT answer in time
	failAuth     = "auth"     // 407: the upstream refused our credentials
	failRefused  = "refused"  // another 4xx: the upstream refused the tunnel
	failUpstream = "upstream" // 5xx: the upstream could not reach the target
	failProtocol = "protocol" // an answer that is not HTTP
)

// dialed is an upstream connection past its CONNECT answer, with the bytes
// the answer's reader took beyond it (a server that speaks first).
type dialed struct {
	conn    net.Conn
	pending []byte
	// slot is when the tunnel's first request may go (its lease's slot).
	slot time.Time
}

// connect opens a tunnel through one upstream: a CONNECT with the
// upstream's credentials, and its 200; or how it failed.
func (g *Gateway) connect(ctx context.Context, up broker.Upstream, hostport string) (_ dialed, f *failure) {
	ctx, span := tracing.Tracer(tracerName).Start(ctx, "upstream connect", trace.WithAttributes(tracing.KeyProxy.String(up.ProxyID)))
	defer func() {
		if f != nil {
			span.SetStatus(codes.Error, f.reason+": "+f.err.Error())
		}
		span.End()
	}()
	failed := func(reason string, status int, err error) (dialed, *failure) {
		return dialed{}, &failure{proxy: up.ProxyID, reason: reason, status: status, err: err}
	}
	dialer := net.Dialer{Timeout: g.opts.ConnectTimeout}
	conn, err := dialer.DialContext(ctx, "tcp", up.Address)
	if err != nil {
		return failed(failDial, 0, err)
	}
	_ = conn.SetDeadline(time.Now().Add(g.opts.ConnectTimeout))
	req := &http.Request{Method: http.MethodConnect, URL: &url.URL{Opaque: hostport}, Host: hostport, Header: http.Header{}}
	if up.User != nil {
		req.Header.Set("Proxy-Authorization", basicAuth(up.User))
	}
	setSessionAddress(req.Header, up.SessionAddress)
	if err := req.Write(conn); err != nil {
		_ = conn.Close()
		return failed(failDial, 0, fmt.Errorf("sending CONNECT: %w", err))
	}
	br := bufio.NewReaderSize(conn, 1024)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		_ = conn.Close()
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return failed(failTimeout, 0, fmt.Errorf("no CONNECT answer within %s", g.opts.ConnectTimeout))
		}
		return failed(failProtocol, 0, fmt.Errorf("reading the CONNECT answer: %w", err))
	}
	if resp.StatusCode != http.StatusOK {
		_ = resp.Body.Close()
		_ = conn.Close()
		reason := failRefused
		switch {
		case resp.StatusCode == http.StatusProxyAuthRequired:
			reason = failAuth
		case resp.StatusCode >= 500:
			reason = failUpstream
		}
		return failed(reason, resp.StatusCode, fmt.Errorf("CONNECT %s answered %s", hostport, resp.Status))
	}
	_ = conn.SetDeadline(time.Time{})
	return dialed{conn: conn, pending: unread(br)}, nil
}

// unread copies what br holds and nobody has read yet, so the tunnel can
// pass it on and let br go.
func unread(br *bufio.Reader) []byte {
	n := br.Buffered()
	if n == 0 {
		return nil
	}
	b, _ := br.Peek(n)
	return append([]byte(nil), b...)
}

func basicAuth(u *url.Userinfo) string {
	password, _ := u.Password()
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(u.Username()+":"+password))
}

// run carries bytes both ways until both sides are done, or the tunnel is
// idle, too old, or closed. The client's direction counts its turns and
// holds a paced turn until its slot; the upstream's marks each answer.
func (t *tunnel) run(early, pendingDown []byte) {
	up := t.upstr
	done := make(chan struct{})
	go func() {
		defer close(done)
		t.pipe(up, t.client, early, both{bytesTotal.WithLabelValues(directionUp), &t.sentUp, t.account}, true, nil)
	}()
	t.pipe(t.client, up, pendingDown, both{bytesTotal.WithLabelValues(directionDown), &t.sentDown, t.account}, false, func() { t.answers.Add(1) })
	<-done
	t.close(closedDone)
}

// moved is the bytes t carried both ways so far.
func (t *tunnel) moved() int64 { return t.sentUp.Load() + t.sentDown.Load() }

func (t *tunnel) touch() { t.lastActive.Store(time.Now().UnixNano()) }

// close ends the tunnel once, for reason.
func (t *tunnel) close(reason string) {
	t.closeOnce.Do(func() {
		if t.cancel != nil {
			t.cancel()
		}
		t.reason = reason
		_ = t.client.Close()
		_ = t.upstr.Close()
	})
}

// chunk is the buffer one direction of a tunnel borrows while it has bytes
// to move: a tunnel that waits holds none.
const chunk = 32 << 10

var buffers = sync.Pool{New: func() any { b := make([]byte, chunk); return &b }}

// counter is what a direction counts its bytes with.
type counter interface{ Add(float64) }

// both counts a direction's bytes in the metric and the tunnel's count of
// that direction, and has the total counted toward the tenant's quota
// every chunk.
type both struct {
	metric  counter
	sent    *atomic.Int64
	account func(least int64)
}

func (b both) Add(n float64) {
	b.metric.Add(n)
	b.sent.Add(int64(n))
	if b.account != nil {
		b.account(chunk)
	}
}

// pipe copies src to dst until src ends (then half-closes dst), either
// fails, or the tunnel is idle or too old. It waits on a one-byte read, so
// an idle direction holds no buffer; once a byte arrives it borrows a
// buffer, reads whatever else is there without waiting, and writes it all.
// A gated direction (the client's) holds each request in what it writes
// until its slot (clientCuts, await): a request with no slot within
// IdleTimeout ends the tunnel (closedPaced); it never splices, so that
// every record is seen. writing hears of each write before it goes, so the
// peer's reaction never comes first.
func (t *tunnel) pipe(dst, src net.Conn, pending []byte, bytes counter, gated bool, writing func()) {
	tick := min(max(t.idle/4, time.Second), 30*time.Second)
	end := t.started.Add(t.life)
	if len(pending) > 0 {
		moved, werr := t.send(dst, pending, gated, writing)
		bytes.Add(float64(moved))
		if werr != nil {
			t.close(werr.reason)
			return
		}
	}
	raw, _ := src.(syscall.Conn)
	var first [1]byte
	for {
		now := time.Now()
		_ = src.SetReadDeadline(minTime(now.Add(tick), end))
		n, err := src.Read(first[:])
		if n == 1 {
			t.touch()
			moved, bulk, werr := t.drain(dst, raw, first[0], gated, writing)
			bytes.Add(float64(moved))
			if werr != nil {
				t.close(werr.reason)
				return
			}
			// A metered tunnel's bulk goes a few buffers at a time, each
			// counted toward its tenant's quota; a splice would count it
			// only once the transfer paused.
			if bulk && !t.metered && !gated {
				moved, err = t.stream(dst, src, end)
				bytes.Add(float64(moved))
			}
		}
		switch {
		case err == nil:
			continue
		case errors.Is(err, io.EOF):
			if src == t.client {
				t.clientEnded.Store(true)
			}
			if tcp, ok := dst.(interface{ CloseWrite() error }); ok {
				_ = tcp.CloseWrite()
				return
			}
			t.close(closedDone)
			return
		case errors.Is(err, syscall.ECONNRESET) && (src == t.client || t.clientEnded.Load()):
			// How many HTTP clients close a connection with bytes unread
			// (a TLS ticket or close_notify), and how a proxy may close its
			// side once the client has ended its own: the client is done.
			t.close(closedDone)
			return
		case errors.Is(err, os.ErrDeadlineExceeded):
			now = time.Now()
			if !now.Before(end) {
				t.close(closedLifetime)
				return
			}
			if now.Sub(time.Unix(0, t.lastActive.Load())) >= t.idle {
				t.close(closedIdle)
				return
			}
		default:
			t.close(closedError)
			return
		}
	}
}

// drainError says why a write ended the tunnel.
type drainError struct{ reason string }

// drain writes first and whatever else raw (the source) has without waiting, in
// borrowed buffers, and returns the bytes written; bulk says the source had
// more than a buffer's worth. A write that blocks for IdleTimeout (the peer
// reads nothing) ends the tunnel.
func (t *tunnel) drain(dst net.Conn, raw syscall.Conn, first byte, gated bool, writing func()) (moved int64, bulk bool, _ *drainError) {
	bp := buffers.Get().(*[]byte)
	defer buffers.Put(bp)
	buf := *bp
	buf[0] = first
	n := 1
	for {
		if n < len(buf) {
			m := readNow(raw, buf[n:])
			n += m
		}
		sent, werr := t.send(dst, buf[:n], gated, writing)
		moved += sent
		if werr != nil {
			return moved, false, werr
		}
		if n < len(buf) {
			return moved, false, nil // src had no more for now
		}
		if moved >= 4*chunk {
			return moved, true, nil // a bulk transfer: stream it
		}
		n = 0
	}
}

// send writes p to dst. A gated direction first holds each request that
// begins in p until its slot, writing what comes before it meanwhile.
func (t *tunnel) send(dst net.Conn, p []byte, gated bool, writing func()) (moved int64, _ *drainError) {
	start := 0
	if gated {
		for _, c := range t.clientCuts(p) {
			if c.at > start {
				if err := t.write(dst, p[start:c.at], writing); err != nil {
					return moved, err
				}
				moved += int64(c.at - start)
				start = c.at
			}
			if !t.await(c) {
				return moved, &drainError{closedPaced}
			}
		}
	}
	if err := t.write(dst, p[start:], writing); err != nil {
		return moved, err
	}
	return moved + int64(len(p)-start), nil
}

// write writes p to dst, telling writing first; a write that blocks for
// IdleTimeout (the peer reads nothing) ends the tunnel.
func (t *tunnel) write(dst net.Conn, p []byte, writing func()) *drainError {
	if writing != nil {
		writing()
	}
	_ = dst.SetWriteDeadline(time.Now().Add(t.idle))
	if _, err := dst.Write(p); err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return &drainError{closedIdle}
		}
		return &drainError{closedError}
	}
	t.touch()
	return nil
}

// stream carries a bulk transfer with io.Copy, which splices socket to
// socket on Linux (no copy through user space, no buffer of ours). It
// returns once src has had nothing for a second, with the error that ended
// the last copy: io.EOF when src ended. A pipe is held only while it runs.
// A read deadline stops a splice before it takes any byte, so stopping loses
// nothing; the write deadline is the tunnel's end, when it closes anyway.
func (t *tunnel) stream(dst, src net.Conn, end time.Time) (int64, error) {
	var moved int64
	_ = dst.SetWriteDeadline(end)
	for {
		_ = src.SetReadDeadline(minTime(time.Now().Add(time.Second), end))
		n, err := io.Copy(dst, src)
		moved += n
		if n > 0 {
			t.touch()
		}
		switch {
		case err == nil:
			return moved, io.EOF
		case errors.Is(err, os.ErrDeadlineExceeded) && n > 0 && time.Now().Before(end):
			continue
		}
		return moved, err
	}
}

// readNow reads what src has without waiting (0 when nothing, or when src
// cannot be read that way).
func readNow(raw syscall.Conn, buf []byte) int {
	if raw == nil {
		return 0
	}
	rc, err := raw.SyscallConn()
	if err != nil {
		return 0
	}
	n := 0
	_ = rc.Read(func(fd uintptr) bool {
		m, err := syscall.Read(int(fd), buf)
		if err == nil && m > 0 {
			n = m
		}
		return true // never wait: the socket is non-blocking
	})
	return n
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
