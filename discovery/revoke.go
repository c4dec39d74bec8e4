package discovery

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
// CONNECT.
type revoker struct {
	mu      sync.Mutex
	pending map[string]*revocations // by proxy id
	dial    func(ctx context.Context, network, addr string) (net.Conn, error)
}

// revocations are one proxy's released leases not yet sent.
type revocations struct {
	addr  string
	creds credentials.Credentials
	ids   []string
	until time.Time
}

// maxPendingRevocations bounds what waits for one proxy: beyond it the
// oldest are dropped (their credentials still expire with their leases).
const maxPendingRevocations = 1024

const (
	revokeFlushEvery = 500 * time.Millisecond
	revokeTimeout    = 3 * time.Second
)

func newRevoker() *revoker {
	return &revoker{pending: map[string]*revocations{}, dial: (&net.Dialer{Timeout: revokeTimeout}).DialContext}
}

// add queues the revocation of lease id on proxy at addr until its
// credentials would expire anyway.
func (r *revoker) add(proxyID, addr string, creds credentials.Credentials, id string, until time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, ok := r.pending[proxyID]
	if !ok {
		p = &revocations{}
		r.pending[proxyID] = p
	}
	p.addr, p.creds = addr, creds
	if len(p.ids) >= maxPendingRevocations {
		p.ids = p.ids[1:]
		revocationsTotal.WithLabelValues("dropped").Inc()
	}
	p.ids = append(p.ids, id)
	if until.After(p.until) {
		p.until = until
	}
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

// flush sends every proxy its pending revocations; a proxy that cannot be
// reached keeps them for the next flush.
func (r *revoker) flush(ctx context.Context) {
	r.mu.Lock()
	batch := r.pending
	r.pending = map[string]*revocations{}
	r.mu.Unlock()
	for proxyID, p := range batch {
		for len(p.ids) > 0 {
			n := min(len(p.ids), credentials.MaxRevocationIDs)
			if err := r.send(ctx, proxyID, p, p.ids[:n]); err != nil {
				logf.FromContext(ctx).V(1).Info("could not tell a proxy of released leases; retrying", "proxy", proxyID, "error", err.Error())
				revocationsTotal.WithLabelValues("failed").Inc()
				for _, id := range p.ids {
					r.add(proxyID, p.addr, p.creds, id, p.until)
				}
				break
			}
			revocationsTotal.WithLabelValues("sent").Add(float64(n))
			p.ids = p.ids[n:]
		}
	}
}

// send makes one revoking CONNECT; the proxy's 407 is the answer it gives
// one (it never opens a tunnel for it).
func (r *revoker) send(ctx context.Context, proxyID string, p *revocations, ids []string) error {
	creds, err := p.creds.Revocation(proxyID, ids, p.until)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, revokeTimeout)
	defer cancel()
	conn, err := r.dial(ctx, "tcp", p.addr)
	if err != nil {
		return fmt.Errorf("dialing %s: %w", p.addr, err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(revokeTimeout))
	const target = "revoke.invalid:443" // never dialled: the helper refuses first
	req := &http.Request{Method: http.MethodConnect, URL: &url.URL{Opaque: target}, Host: target, Header: http.Header{}}
	req.Header.Set("Proxy-Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(creds.Username+":"+creds.Password)))
	if err := req.Write(conn); err != nil {
		return fmt.Errorf("writing to %s: %w", p.addr, err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		return fmt.Errorf("reading %s's answer: %w", p.addr, err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusProxyAuthRequired {
		return fmt.Errorf("%s answered %d to a revocation, want 407", p.addr, resp.StatusCode)
	}
	return nil
}

// revoke queues the revocation of a released lease's credentials, when
// its proxy takes per-lease ones.
func (s *Server) revoke(ctx context.Context, l Lease) {
	info, ok := s.opts.View.lookup(l.ProxyID, 0)
	if !ok || !info.hasCreds || s.opts.Credentials == nil || info.IP == "" {
		return
	}
	c, err := s.opts.Credentials.Lookup(ctx, info.creds)
	if err != nil || c.Scheme != credentials.SchemeLease {
		return
	}
	s.revoker.add(l.ProxyID, net.JoinHostPort(info.IP, strconv.Itoa(int(info.Port))), c, l.ID, l.ExpiresAt)
}

var revocationsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
	Namespace: operator.MetricsNamespace, Name: "lease_revocations_total",
	Help: "Released leases whose credentials the operator told their proxy to refuse, by result: sent, failed (retried), dropped (too many waiting for one proxy).",
}, []string{"result"})
