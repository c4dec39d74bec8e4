package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
)

// Transport is an http.RoundTripper that sends each request through a
// leased proxy for its host: one lease per host, kept renewed, so a host's
// requests stick to one proxy. A 429 from a site is reported rate_limited
// and a 403 blocked, with its Retry-After, and the next request to that
// host goes through another proxy; a proxy that fails (the tunnel cannot be opened,
// the proxy is deleted or stops being healthy) is released and the request
// is sent once more through a new lease, when its body can be sent again.
// A host with a politeness policy (or a pace the fleet learned) gets a
// paced lease, which covers one request: the Transport sends it at the
// slot the lease reserved and leases again for the next.
//
// A host's lease is released once no request has gone to it for
// IdleTimeout, and at most MaxHosts are held at once (beyond it, the least
// recently used host's goes), so a crawl over many hosts holds leases for
// the hosts it is crawling now, not for every host it ever saw. Hosts are
// compared as DNS does: Example.COM. is example.com.
//
// Set Client; the rest is optional. Close releases every lease.
type Transport struct {
	Client *Client
	// Selector and TTL are those of every lease it takes.
	Selector map[string]string
	TTL      time.Duration
	// MaxWait is how long a request may wait for its host's next paced
	// slot (0: DefaultMaxWait); beyond it the lease is refused with
	// target_paced and the request fails with that APIError.
	MaxWait time.Duration
	// Base sends the requests; its Proxy is replaced by the lease's. Nil:
	// a clone of http.DefaultTransport.
	Base *http.Transport
	// IdleTimeout releases a host's lease once no request has gone to the
	// host for that long (0: DefaultIdleTimeout).
	IdleTimeout time.Duration
	// MaxHosts bounds the leases held at once, one per host (0:
	// DefaultMaxHosts).
	MaxHosts int

	once  sync.Once
	inner *http.Transport
	ctx   context.Context
	stop  context.CancelFunc

	mu     sync.Mutex
	byHost map[string]*hostLease
}

// hostLease is a host's lease and when a request last took it.
type hostLease struct {
	held *Held
	used time.Time
}

var _ http.RoundTripper = (*Transport)(nil)

// Defaults of a Transport.
const (
	// DefaultMaxWait is a Transport's wait for a paced slot.
	DefaultMaxWait = 5 * time.Second
	// DefaultIdleTimeout is how long a host's lease outlives its last
	// request.
	DefaultIdleTimeout = time.Minute
	// DefaultMaxHosts bounds the leases a Transport holds at once.
	DefaultMaxHosts = 256
)

type proxyKey struct{}

func (t *Transport) init() {
	t.once.Do(func() {
		base := t.Base
		if base == nil {
			base = http.DefaultTransport.(*http.Transport)
		}
		t.inner = base.Clone()
		t.inner.Proxy = func(req *http.Request) (*url.URL, error) {
			u, _ := req.Context().Value(proxyKey{}).(*url.URL)
			return u, nil
		}
		if t.IdleTimeout <= 0 {
			t.IdleTimeout = DefaultIdleTimeout
		}
		if t.MaxHosts <= 0 {
			t.MaxHosts = DefaultMaxHosts
		}
		// Leases outlive any one request: they are renewed until they
		// idle, or until Close.
		t.ctx, t.stop = context.WithCancel(context.Background())
		t.byHost = map[string]*hostLease{}
		go t.releaseIdle()
	})
}

// releaseIdle releases, every so often, the leases of hosts no request
// took for IdleTimeout, until Close.
func (t *Transport) releaseIdle() {
	ticker := time.NewTicker(max(t.IdleTimeout/4, 10*time.Millisecond))
	defer ticker.Stop()
	for {
		select {
		case <-t.ctx.Done():
			return
		case now := <-ticker.C:
			t.mu.Lock()
			var idle []*Held
			for host, h := range t.byHost {
				if now.Sub(h.used) >= t.IdleTimeout {
					idle = append(idle, h.held)
					delete(t.byHost, host)
				}
			}
			t.mu.Unlock()
			for _, h := range idle {
				_ = h.Release(context.Background())
			}
		}
	}
}

// normalizeHost compares hosts as DNS does: case and a trailing dot aside.
func normalizeHost(host string) string {
	return strings.ToLower(strings.TrimSuffix(host, "."))
}

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	t.init()
	host := normalizeHost(req.URL.Hostname())
	for attempt := 0; ; attempt++ {
		held, err := t.heldFor(req.Context(), host)
		if err != nil {
			return nil, err
		}
		lease := held.Lease()
		proxy, err := lease.ProxyURL()
		if err != nil {
			return nil, err
		}
		if err := waitUntil(req.Context(), lease.NextRequestAt); err != nil {
			t.drop(host, held)
			return nil, err
		}
		out := req.Clone(context.WithValue(req.Context(), proxyKey{}, proxy))
		if attempt > 0 && req.Body != nil {
			if out.Body, err = req.GetBody(); err != nil {
				return nil, fmt.Errorf("sending %s again through another proxy: %w", req.URL.Redacted(), err)
			}
		}
		resp, err := t.inner.RoundTrip(out)
		if err != nil {
			if req.Context().Err() != nil {
				return nil, err
			}
			// The proxy may be gone: do not come back to it.
			t.drop(host, held)
			if attempt == 0 && (req.Body == nil || req.GetBody != nil) {
				continue
			}
			return nil, fmt.Errorf("through proxy %s: %w", lease.Proxy.ID, err)
		}
		t.observe(req.Context(), host, held, resp)
		if lease.Paced {
			// One request per paced lease, held until its answer is read
			// (it counts toward the host's connections): the next request
			// leases its own slot.
			t.forget(host, held)
			resp.Body = &releaseOnClose{ReadCloser: resp.Body, release: func() { _ = held.Release(context.Background()) }}
		}
		return resp, nil
	}
}

// Proxy is the proxy for req's host, leased and kept as RoundTrip does: for
// http.Transport.Proxy or Colly's SetProxyFunc, where the crawler's own
// transport sends the request (and nothing reports how the site answered).
func (t *Transport) Proxy(req *http.Request) (*url.URL, error) {
	t.init()
	held, err := t.heldFor(req.Context(), normalizeHost(req.URL.Hostname()))
	if err != nil {
		return nil, err
	}
	lease := held.Lease()
	return lease.ProxyURL()
}

// Current is the proxy id a host's requests go through now ("" when none).
func (t *Transport) Current(host string) string {
	t.init()
	t.mu.Lock()
	defer t.mu.Unlock()
	if h, ok := t.byHost[normalizeHost(host)]; ok {
		return h.held.Lease().Proxy.ID
	}
	return ""
}

// Close releases every lease the transport holds.
func (t *Transport) Close() error {
	t.init()
	t.mu.Lock()
	held := t.byHost
	t.byHost = map[string]*hostLease{}
	t.mu.Unlock()
	var errs []error
	for _, h := range held {
		errs = append(errs, h.held.Release(context.Background()))
	}
	t.stop()
	t.inner.CloseIdleConnections()
	return errors.Join(errs...)
}

// heldFor is the live lease for host, leasing a new one (for host as the
// target) when there is none or the last was lost. The API call happens
// outside the lock, so one slow lease holds up no other host; when two
// requests for a host race, the first lease stored wins and the other is
// released.
func (t *Transport) heldFor(ctx context.Context, host string) (*Held, error) {
	if h := t.live(host); h != nil {
		return h, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	maxWait := t.MaxWait
	if maxWait <= 0 {
		maxWait = DefaultMaxWait
	}
	h, err := t.Client.Hold(t.ctx, LeaseRequest{Selector: t.Selector, Target: host, TTL: t.TTL, MaxWait: maxWait})
	if err != nil {
		return nil, fmt.Errorf("leasing a proxy for %s: %w", host, err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if other, ok := t.byHost[host]; ok && !lost(other.held) {
		go func() { _ = h.Release(context.WithoutCancel(ctx)) }()
		other.used = time.Now()
		return other.held, nil
	}
	t.byHost[host] = &hostLease{held: h, used: time.Now()}
	if len(t.byHost) > t.MaxHosts {
		t.evictLocked(host)
	}
	return h, nil
}

// evictLocked releases the lease of the least recently used host other
// than keep.
func (t *Transport) evictLocked(keep string) {
	oldest := ""
	for host, h := range t.byHost {
		if host != keep && (oldest == "" || h.used.Before(t.byHost[oldest].used)) {
			oldest = host
		}
	}
	if h, ok := t.byHost[oldest]; ok {
		delete(t.byHost, oldest)
		go func() { _ = h.held.Release(context.Background()) }()
	}
}

// live is host's lease unless there is none or it was lost; a lost one is
// forgotten and released.
func (t *Transport) live(host string) *Held {
	t.mu.Lock()
	defer t.mu.Unlock()
	h, ok := t.byHost[host]
	if !ok {
		return nil
	}
	if lost(h.held) {
		delete(t.byHost, host)
		go func() { _ = h.held.Release(context.Background()) }()
		return nil
	}
	h.used = time.Now()
	return h.held
}

func lost(h *Held) bool {
	select {
	case <-h.Lost():
		return true
	default:
		return false
	}
}

// drop releases held and forgets it for host, if it is still host's.
func (t *Transport) drop(host string, held *Held) {
	t.forget(host, held)
	go func() { _ = held.Release(context.Background()) }()
}

// forget stops handing held out for host, if it is still host's.
func (t *Transport) forget(host string, held *Held) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if h, ok := t.byHost[host]; ok && h.held == held {
		delete(t.byHost, host)
	}
}

// releaseOnClose is a response body that releases its paced lease once
// the caller is done with it.
type releaseOnClose struct {
	io.ReadCloser
	once    sync.Once
	release func()
}

func (b *releaseOnClose) Close() error {
	err := b.ReadCloser.Close()
	b.once.Do(b.release)
	return err
}

// observe reports a rate-limited answer and moves host to another proxy.
func (t *Transport) observe(ctx context.Context, host string, held *Held, resp *http.Response) {
	r := ReportOf(resp, time.Now())
	if r.Result != ResultRateLimited && r.Result != ResultBlocked {
		return
	}
	// Reported before the release, since a report needs a live lease. A
	// report that fails loses only the cooldown: the host moves to another
	// proxy all the same, and the site's answer goes back to the caller.
	_ = t.Client.Report(context.WithoutCancel(ctx), held.Lease().ID, r)
	t.drop(host, held)
}

// waitUntil waits for at (nil: not at all), or ctx's end.
func waitUntil(ctx context.Context, at *time.Time) error {
	if at == nil {
		return nil
	}
	d := time.Until(*at)
	if d <= 0 {
		return nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
