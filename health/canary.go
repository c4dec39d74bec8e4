package health

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/credentials"
)

// Canaries and the echo of the exit IP: defaults of their flags.
const (
	// DefaultCanaryInterval is how often each canary is fetched through
	// each proxy: a low rate, the team's own sites being the ones they
	// crawl.
	DefaultCanaryInterval = 5 * time.Minute
	// DefaultCanaryHostInterval spaces the canaries to one host across the
	// whole fleet: a fleet of 1,000 proxies sends its canaries to a host
	// one per second, not all at once.
	DefaultCanaryHostInterval = time.Second
	// canaryHoldIntervals is how many canary intervals a Blocked canary's
	// hold lasts unless a later canary renews or ends it: the next one is
	// due within about one, a host's pace or a busy engine may delay it.
	canaryHoldIntervals = 3
	// canaryHoldSkew is how far the store's clock may run ahead of the
	// engine's when an Allowed canary ends a hold (EndCanaryHold).
	canaryHoldSkew = time.Minute
	// EgressRecheck is how often a proxy's exit IP is asked of the echo
	// URL again once known.
	EgressRecheck = 10 * time.Minute
	// maxCanaryBody is how much of a canary's body is searched for its
	// blocked marker, and of an echo's for the address.
	maxCanaryBody = 64 << 10
)

// CanaryRequest is one fetch of a team's canary through one proxy.
type CanaryRequest struct {
	ProxyAddr   string
	Credentials credentials.Credentials
	Canary      crawlv1alpha1.CanaryTarget
	Timeout     time.Duration
}

// CanaryResult is what a canary came to: Allowed, Blocked or Unknown
// (crawlv1alpha1.Canary*), and what the fetch got.
type CanaryResult struct {
	Verdict string
	Message string
}

// CanaryProber fetches canaries through proxies (HTTPProber does).
type CanaryProber interface {
	Canary(ctx context.Context, req CanaryRequest) CanaryResult
}

// OutcomeSink takes what canaries learn: main adapts the lease store's
// outcome memory, so a blocked canary keeps the proxy away from that host
// and counts toward its ban. The engine knows nothing of discovery.
type OutcomeSink interface {
	// CanaryOutcome records a verdict; a blocked one holds the proxy away
	// from host for hold (each Blocked renews it).
	CanaryOutcome(ctx context.Context, proxy types.NamespacedName, host string, blocked bool, hold time.Duration)
	// EndCanaryHold ends that hold once a later canary says Allowed: a
	// hold ending no later than notAfter (a longer cooldown a site asked
	// for stays).
	EndCanaryHold(ctx context.Context, proxy types.NamespacedName, host string, notAfter time.Time)
}

// Canary fetches req.Canary's URL through the proxy: Allowed when the
// status is one the canary allows and its blocked marker is not in the
// body; Blocked otherwise; Unknown when the fetch itself failed (a
// timeout, a refused tunnel), which says nothing of the site's view.
func (p *HTTPProber) Canary(ctx context.Context, req CanaryRequest) CanaryResult {
	status, body, err := p.fetch(ctx, req.ProxyAddr, req.Credentials, req.Canary.URL, req.Timeout)
	if err != nil {
		return CanaryResult{Verdict: crawlv1alpha1.CanaryUnknown, Message: truncateMessage(classify(ctx, err).Message)}
	}
	return judgeCanary(req.Canary, status, body)
}

// judgeCanary is a canary's verdict on an answer. Pure.
func judgeCanary(c crawlv1alpha1.CanaryTarget, status int, body []byte) CanaryResult {
	allowed := c.AllowedStatuses
	if len(allowed) == 0 {
		allowed = []int32{http.StatusOK}
	}
	switch {
	case !slices.Contains(allowed, int32(status)):
		return CanaryResult{Verdict: crawlv1alpha1.CanaryBlocked, Message: fmt.Sprintf("answered %d, not an allowed status", status)}
	case c.BlockedMarker != "" && bytes.Contains(body, []byte(c.BlockedMarker)):
		return CanaryResult{Verdict: crawlv1alpha1.CanaryBlocked, Message: fmt.Sprintf("answered %d with the blocked marker %q", status, c.BlockedMarker)}
	}
	return CanaryResult{Verdict: crawlv1alpha1.CanaryAllowed, Message: fmt.Sprintf("answered %d", status)}
}

// fetch GETs target through the proxy at addr with creds, within timeout:
// its status and the first maxCanaryBody bytes of its body.
func (p *HTTPProber) fetch(ctx context.Context, addr string, creds credentials.Credentials, target string, timeout time.Duration) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(context.WithValue(ctx, proxyAddrKey{}, addr), timeout)
	defer cancel()
	ctx = context.WithValue(ctx, proxyAuthKey{}, creds.Userinfo())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return 0, nil, err
	}
	// The transport presents the credentials on the CONNECT of an https
	// target, and on the request itself of an http one.
	req.Header.Set("User-Agent", "egress-proxies-operator-health/1")
	res, err := p.transport.RoundTrip(req)
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, maxCanaryBody))
	if err != nil {
		return 0, nil, err
	}
	return res.StatusCode, body, nil
}

// parseEcho reads the address an echo service says a request came from:
// a body that is the address alone (ipify, icanhazip, ifconfig.me), or a
// JSON object with "ip" or "origin" (httpbin). "" when it is neither.
func parseEcho(body []byte) string {
	text := strings.TrimSpace(string(body))
	if ip := net.ParseIP(text); ip != nil {
		return ip.String()
	}
	var doc struct {
		IP     string `json:"ip"`
		Origin string `json:"origin"`
	}
	if json.Unmarshal(body, &doc) != nil {
		return ""
	}
	for _, s := range []string{doc.IP, strings.TrimSpace(strings.Split(doc.Origin, ",")[0])} {
		if ip := net.ParseIP(s); ip != nil {
			return ip.String()
		}
	}
	return ""
}

// echo asks the echo URL, through the proxy, where the proxy's requests
// come from: "" when it cannot tell.
func (p *HTTPProber) echo(ctx context.Context, pr ProbeRequest) string {
	status, body, err := p.fetch(ctx, pr.ProxyAddr, pr.Credentials, pr.EchoURL, pr.Timeout)
	if err != nil || status != http.StatusOK {
		return ""
	}
	return parseEcho(body)
}

func truncateMessage(s string) string {
	if len(s) > 256 {
		return s[:253] + "..."
	}
	return s
}

// hostPacer spaces the canaries to each host across the fleet: one per
// interval per host (golang.org/x/time/rate), the limiters of hosts not
// asked lately dropped now and then.
type hostPacer struct {
	interval time.Duration
	mu       sync.Mutex
	limiters map[string]*rate.Limiter
}

// allow says whether a canary may go to host now, and takes its slot.
func (h *hostPacer) allow(host string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.limiters == nil || len(h.limiters) > 4096 {
		h.limiters = map[string]*rate.Limiter{}
	}
	l, ok := h.limiters[host]
	if !ok {
		l = rate.NewLimiter(rate.Every(h.interval), 1)
		h.limiters[host] = l
	}
	return l.Allow()
}

// runCanaries fetches due canaries of the instance identity at pt, as
// each host's pace allows (a canary whose host is busy waits for a later
// probe), hands what they learn to the outcome sink, and says whether a
// recorded verdict changed.
func (e *Engine) runCanaries(ctx context.Context, key types.NamespacedName, identity string, pt probeTarget, due []crawlv1alpha1.CanaryTarget) bool {
	creds, err := e.credentialsFor(ctx, key, pt)
	if err != nil {
		return false // the probe said so already
	}
	changed := false
	for _, c := range due {
		host := canaryHost(c.URL)
		if !e.pacer.allow(host) {
			continue
		}
		res := e.opts.Canaries.Canary(ctx, CanaryRequest{ProxyAddr: pt.address, Credentials: creds, Canary: c, Timeout: pt.settings.Value().Timeout})
		canaryChecks.WithLabelValues(c.Name, res.Verdict).Inc()
		now := e.opts.Clock.Now()
		hold := canaryHoldIntervals * e.opts.CanaryInterval
		if e.opts.Outcomes != nil && res.Verdict != crawlv1alpha1.CanaryUnknown {
			blocked := res.Verdict == crawlv1alpha1.CanaryBlocked
			e.opts.Outcomes.CanaryOutcome(ctx, key, host, blocked, hold)
			if held := e.canaryHeld(key, identity, c.Name); !blocked && !held.IsZero() {
				e.opts.Outcomes.EndCanaryHold(ctx, key, host, held.Add(canaryHoldSkew))
			}
		}
		e.mu.Lock()
		if t, ok := e.targets[key]; ok && t.identity == identity && slices.ContainsFunc(t.canaries, func(x crawlv1alpha1.CanaryTarget) bool { return x.Name == c.Name }) {
			if t.canaryStates == nil {
				t.canaryStates = map[string]*canaryState{}
			}
			st := t.canaryStates[c.Name]
			if st == nil {
				st = &canaryState{}
				t.canaryStates[c.Name] = st
			}
			st.due = now.Add(e.opts.CanaryInterval + e.spread(e.opts.CanaryInterval))
			switch res.Verdict {
			case crawlv1alpha1.CanaryBlocked:
				st.heldUntil = now.Add(hold)
			case crawlv1alpha1.CanaryAllowed:
				st.heldUntil = time.Time{}
			}
			if recordable(st.status.Verdict, res.Verdict) {
				at := metav1.NewTime(now).Rfc3339Copy()
				st.status = crawlv1alpha1.CanaryStatus{Name: c.Name, Host: host, Verdict: res.Verdict, Message: res.Message, LastTransitionTime: &at}
				changed = true
			}
		}
		e.mu.Unlock()
	}
	return changed
}

// canaryHeld is when the hold of the canary called name on the instance
// identity ends (zero: it holds nothing).
func (e *Engine) canaryHeld(key types.NamespacedName, identity, name string) time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	if t, ok := e.targets[key]; ok && t.identity == identity {
		if st := t.canaryStates[name]; st != nil {
			return st.heldUntil
		}
	}
	return time.Time{}
}

// recordable says whether a canary's new verdict changes what is recorded:
// a change between Allowed and Blocked, or a first verdict; an Unknown
// (the fetch failed) never hides a verdict.
func recordable(recorded, next string) bool {
	if recorded == next {
		return false
	}
	return recorded == "" || next != crawlv1alpha1.CanaryUnknown
}

// canaryHost is the host a canary's URL names, normalized as discovery
// normalizes targets (lower case, no port).
func canaryHost(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	return strings.ToLower(strings.TrimSuffix(u.Hostname(), "."))
}
