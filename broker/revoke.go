package broker

import (
	"bufio"
	"context"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/example/egress-proxies-operator/credentials"
	"github.com/example/egress-proxies-operator/lease"
	"github.com/example/egress-proxies-operator/operator"
)

// A released lease's credentials must stop working before they expire,
// and nothing on a proxy calls the operator. So the operator tells the
// proxy: it sends the proxy a CONNECT whose credentials, signed with the
// proxy's key like any lease's, name the released leases; the proxy's
// lease-auth helper writes them to its revocation file and answers 407.
// Within Squid's 5 seconds of cached answers, the proxy refuses them.

// revoker batches released leases per proxy and sends each proxy its
// revocations every flushEvery, at most credentials.MaxRevocationIDs per
// CONNECT, to revokeParallel proxies at once: a proxy that does not
// answer holds up its own revocations only. A revocation is kept until it
// is sent or its lease's credentials expire anyway; a proxy that left the
// fleet (gone) has its revocations dropped.
type revoker struct {
	mu      sync.Mutex
	pending map[string]*revocations // by proxy id
	dial    func(ctx context.Context, network, addr string) (net.Conn, error)
	now     func() time.Time
	// gone says a proxy left the fleet: nothing will use its credentials.
	gone func(proxyID string) bool
}

// revocations are one proxy's released leases not yet sent: each lease id
// with the time its credentials expire anyway.
type revocations struct {
	addr  string
	creds credentials.Credentials
	ids   map[string]time.Time
}

// maxPendingRevocations bounds what waits for one proxy: beyond it the
// ones whose credentials expire first are dropped (they expire with their
// leases).
const maxPendingRevocations = 1024

const (
	revokeFlushEvery = 500 * time.Millisecond
	revokeTimeout    = 3 * time.Second
	// revokeParallel bounds the proxies told at once.
	revokeParallel = 32
)

func newRevoker(now func() time.Time, gone func(string) bool) *revoker {
	return &revoker{pending: map[string]*revocations{}, dial: (&net.Dialer{Timeout: revokeTimeout}).DialContext, now: now, gone: gone}
}

// add queues the revocation of lease id on proxy at addr until its
// credentials would expire anyway.
func (r *revoker) add(proxyID, addr string, creds credentials.Credentials, id string, until time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, ok := r.pending[proxyID]
	if !ok {
		p = &revocations{ids: map[string]time.Time{}}
		r.pending[proxyID] = p
	}
	p.addr, p.creds = addr, creds
	if _, queued := p.ids[id]; !queued && len(p.ids) >= maxPendingRevocations {
		first := ""
		for other, u := range p.ids {
			if first == "" || u.Before(p.ids[first]) {
				first = other
			}
		}
		delete(p.ids, first)
		revocationsTotal.WithLabelValues("dropped").Inc()
	}
	if until.After(p.ids[id]) {
		p.ids[id] = until
	}
}

// queued is how many revocations wait (the tests read it).
func (r *revoker) queued() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, p := range r.pending {
		n += len(p.ids)
	}
	return n
}

// run flushes until ctx ends.
func (r *revoker) run(ctx context.Context) {
	ticker := time.NewTicker(revokeFlushEvery)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
			r.flush(ctx)
		}
	}
}

// flush sends every proxy its pending revocations, revokeParallel proxies
// at once, and returns when all were tried. Revocations whose credentials
// expired, and those of proxies that left the fleet, are dropped first;
// a proxy that cannot be reached keeps the rest for the next flush.
func (r *revoker) flush(ctx context.Context) {
	r.mu.Lock()
	batch := r.pending
	r.pending = map[string]*revocations{}
	r.mu.Unlock()
	now := r.now()
	sem := make(chan struct{}, revokeParallel)
	var wg sync.WaitGroup
	for proxyID, p := range batch {
		if r.gone != nil && r.gone(proxyID) {
			revocationsTotal.WithLabelValues("gone").Add(float64(len(p.ids)))
			continue
		}
		ids := make([]string, 0, len(p.ids))
		for id, until := range p.ids {
			if !until.After(now) {
				revocationsTotal.WithLabelValues("expired").Inc()
				continue
			}
			ids = append(ids, id)
		}
		if len(ids) == 0 {
			continue
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			r.sendAll(ctx, proxyID, p, ids)
		})
	}
	wg.Wait()
}

// sendAll sends proxyID its revocations ids, a CONNECT per
// MaxRevocationIDs; on a failure the unsent ones are queued again.
func (r *revoker) sendAll(ctx context.Context, proxyID string, p *revocations, ids []string) {
	for len(ids) > 0 {
		n := min(len(ids), credentials.MaxRevocationIDs)
		var until time.Time
		for _, id := range ids[:n] {
			if u := p.ids[id]; u.After(until) {
				until = u
			}
		}
		if err := r.send(ctx, proxyID, p.addr, p.creds, ids[:n], until); err != nil {
			logf.FromContext(ctx).V(1).Info("could not tell a proxy of released leases; retrying", "proxy", proxyID, "error", err.Error())
			revocationsTotal.WithLabelValues("failed").Add(float64(len(ids)))
			for _, id := range ids {
				r.add(proxyID, p.addr, p.creds, id, p.ids[id])
			}
			return
		}
		revocationsTotal.WithLabelValues("sent").Add(float64(n))
		ids = ids[n:]
	}
}

// send makes one revoking CONNECT; the proxy's 407 is the answer it gives
// one (it never opens a tunnel for it).
func (r *revoker) send(ctx context.Context, proxyID, addr string, c credentials.Credentials, ids []string, until time.Time) error {
	creds, err := c.Revocation(proxyID, ids, until)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, revokeTimeout)
	defer cancel()
	conn, err := r.dial(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("dialing %s: %w", addr, err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(revokeTimeout))
	const target = "revoke.invalid:443" // never dialled: the helper refuses first
	req := &http.Request{Method: http.MethodConnect, URL: &url.URL{Opaque: target}, Host: target, Header: http.Header{}}
	req.Header.Set("Proxy-Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(creds.Username+":"+creds.Password)))
	if err := req.Write(conn); err != nil {
		return fmt.Errorf("writing to %s: %w", addr, err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		return fmt.Errorf("reading %s's answer: %w", addr, err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusProxyAuthRequired {
		return fmt.Errorf("%s answered %d to a revocation, want 407", addr, resp.StatusCode)
	}
	return nil
}

// revoke queues the revocation of a released lease's credentials, when
// its proxy takes per-lease ones.
func (b *Broker) revoke(ctx context.Context, l lease.Lease) {
	info, ok := b.opts.View.Lookup(l.ProxyID, 0)
	if !ok || !info.hasCreds || b.opts.Credentials == nil || info.IP == "" {
		return
	}
	c, err := b.opts.Credentials.Lookup(ctx, info.creds)
	if err != nil || c.Scheme != credentials.SchemeLease {
		return
	}
	b.revoker.add(l.ProxyID, net.JoinHostPort(info.IP, strconv.Itoa(int(info.Port))), c, l.ID, l.ExpiresAt)
}

var revocationsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
	Namespace: operator.MetricsNamespace, Name: "lease_revocations_total",
	Help: "Released leases whose credentials the operator told their proxy to refuse, by result: sent, failed (retried while the lease's credentials live), expired (dropped: the credentials expired meanwhile), gone (dropped: the proxy left the fleet), dropped (too many waiting for one proxy).",
}, []string{"result"})
