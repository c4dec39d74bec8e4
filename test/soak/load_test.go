//go:build soak

package soak

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// documented is every status each route may answer, as the README's
// discovery section documents them. 401 and 500 are left out on purpose:
// the soak's token is always valid (a 401 would mean the operator served
// before loading it), and a 500 is never right.
var documented = map[string][]int{
	"list": {http.StatusOK, http.StatusBadRequest},
	// 429 target_paced: the target's learned pace allows no proxy a request now.
	"lease":       {http.StatusCreated, http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusServiceUnavailable, http.StatusTooManyRequests},
	"bad-lease":   {http.StatusBadRequest}, // a malformed body: exactly 400, never anything else
	"get":         {http.StatusOK, http.StatusNotFound},
	"renew":       {http.StatusOK, http.StatusBadRequest, http.StatusNotFound, http.StatusConflict, http.StatusRequestEntityTooLarge}, // 409: the proxy stopped serving
	"report":      {http.StatusNoContent, http.StatusBadRequest, http.StatusNotFound, http.StatusRequestEntityTooLarge},
	"release":     {http.StatusNoContent},
	"lease-audit": {http.StatusOK, http.StatusNotFound}, // GET of an abandoned lease; 200 after its expiry is counted apart
}

const (
	crawlers = 8
	// crawlerPause is each crawler's pause between two leases: about 80
	// leases a second in all, each with a few more calls.
	crawlerPause = 100 * time.Millisecond
	// expirySlack is how long after expiresAt an abandoned lease may still
	// answer: the store checks expiry on every lookup, so only clock
	// granularity is allowed for.
	expirySlack = time.Second
)

// load is the crawlers' side: it drives the discovery API and keeps count
// of every answer.
type load struct {
	w *world

	mu         sync.Mutex
	statuses   map[string]map[int]int // route -> status -> count
	latencies  []time.Duration
	unexpected []string // route, status and body of answers outside documented
	// failedWhileUp are requests that got no HTTP answer while the
	// operator was up; failedWhileDown those around a kill.
	failedWhileUp   []string
	failedWhileDown int
	granted         int
	// abandoned leases are never released: the audit checks each answers
	// 404 once its TTL is over.
	abandoned   []abandonedLease
	audited     int
	outlivedTTL []string
	// shared is checked in the two-replica soak only: with one operator on
	// the memory store, a restart rightly forgets leases and cooldowns.
	shared sharedState
	// held is every exit IP's latest lease, for the ledger's check.
	held heldLeases
}

type abandonedLease struct {
	id        string
	expiresAt time.Time
}

type leaseAnswer struct {
	LeaseID   string    `json:"leaseID"`
	ExpiresAt time.Time `json:"expiresAt"`
	Proxy     struct {
		ID string `json:"id"`
		IP string `json:"ip"`
	} `json:"proxy"`
}

// maxRequestedTTL is the longest TTL a crawler asks for.
const maxRequestedTTL = 12 * time.Second

// ttlSeconds is a crawler's lease TTL: 3 to 12 seconds, so that many
// leases expire during the run.
func ttlSeconds(rng *rand.Rand) int { return 3 + rng.IntN(int(maxRequestedTTL/time.Second)-2) }

func newLoad(w *world) *load {
	return &load{w: w, statuses: map[string]map[int]int{}}
}

// run drives the crawlers and the lease audit until ctx ends.
func (l *load) run(ctx context.Context, seed uint64) {
	var wg sync.WaitGroup
	for i := range crawlers {
		rng := rand.New(rand.NewPCG(seed, uint64(i)))
		wg.Go(func() { l.crawler(ctx, rng) })
	}
	wg.Go(func() { l.audit(ctx) })
	wg.Wait()
}

// do sends one request and records its answer against route.
func (l *load) do(route, method, path, body string) (int, []byte) {
	base, upFlag := l.w.pickDiscovery()
	upBefore := upFlag.Load()
	req, err := http.NewRequest(method, base+path, strings.NewReader(body))
	if err != nil {
		panic(err) // the soak builds its own requests
	}
	req.Header.Set("Authorization", "Bearer "+token)
	start := time.Now()
	res, err := httpClient.Do(req)
	var raw []byte
	if err == nil {
		raw, err = io.ReadAll(res.Body)
		_ = res.Body.Close()
	}
	elapsed := time.Since(start)
	up := upBefore && upFlag.Load()
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		if up {
			l.failedWhileUp = append(l.failedWhileUp, fmt.Sprintf("%s %s: %v", method, path, err))
		} else {
			l.failedWhileDown++
		}
		return 0, nil
	}
	if l.statuses[route] == nil {
		l.statuses[route] = map[int]int{}
	}
	l.statuses[route][res.StatusCode]++
	l.latencies = append(l.latencies, elapsed)
	if !slices.Contains(documented[route], res.StatusCode) {
		l.unexpected = append(l.unexpected, fmt.Sprintf("%s %s %s -> %d %s", route, method, path, res.StatusCode, bytes.TrimSpace(raw)))
	}
	return res.StatusCode, raw
}

// crawler leases a proxy, sometimes renews it and reports on it, and
// releases it or, one time in five, walks away from it.
func (l *load) crawler(ctx context.Context, rng *rand.Rand) {
	pools := []string{"", poolKubernetes, poolVM, poolExternal}
	for ctx.Err() == nil {
		selector := map[string]string{}
		if pool := pools[rng.IntN(len(pools))]; pool != "" {
			selector[poolKey] = pool
		}
		target := fmt.Sprintf("site-%d.example", rng.IntN(5))
		body, _ := json.Marshal(map[string]any{"selector": selector, "ttlSeconds": ttlSeconds(rng), "target": target})
		sent := time.Now()
		status, raw := l.do("lease", http.MethodPost, "/v1/leases", string(body))
		if status == http.StatusCreated {
			var lease leaseAnswer
			if err := json.Unmarshal(raw, &lease); err != nil || lease.LeaseID == "" {
				l.note(fmt.Sprintf("lease: unreadable 201 body %q: %v", raw, err))
				continue
			}
			l.mu.Lock()
			l.granted++
			l.mu.Unlock()
			granted := time.Now()
			if l.w.second != nil {
				// A cooldown is about the address it was reported for: a
				// proxy back on a new one starts clean.
				l.shared.granted(lease.Proxy.ID+"@"+lease.Proxy.IP, target, sent, granted)
			}
			l.use(rng, lease, target, granted)
		}
		switch n := rng.IntN(100); {
		case n < 5:
			l.do("list", http.MethodGet, "/v1/proxies?healthy=true&"+poolKey+"="+pools[1+rng.IntN(3)], "")
		case n < 7:
			l.do("bad-lease", http.MethodPost, "/v1/leases", `{"selector":`)
		}
		select {
		case <-ctx.Done():
		case <-time.After(crawlerPause):
		}
	}
}

func (l *load) use(rng *rand.Rand, lease leaseAnswer, target string, granted time.Time) {
	path := "/v1/leases/" + lease.LeaseID
	if rng.IntN(2) == 0 {
		status, raw := l.do("renew", http.MethodPost, path+"/renew", fmt.Sprintf(`{"ttlSeconds":%d}`, ttlSeconds(rng)))
		switch status {
		case http.StatusOK:
			var renewed leaseAnswer
			if err := json.Unmarshal(raw, &renewed); err == nil {
				lease.ExpiresAt = renewed.ExpiresAt
			}
		case http.StatusNotFound:
			if l.w.second != nil {
				l.shared.lostLease("renew", lease.LeaseID, time.Now(), lease.ExpiresAt)
			}
		}
	}
	if rng.IntN(10) < 3 {
		result := []string{"ok", "error", "rate_limited"}[rng.IntN(3)]
		sent := time.Now()
		retryAfter := rng.IntN(10)
		status, _ := l.do("report", http.MethodPost, path+"/report",
			fmt.Sprintf(`{"result":%q,"target":%q,"retryAfterSeconds":%d}`, result, target, retryAfter))
		switch {
		case l.w.second == nil:
		case status == http.StatusNotFound:
			l.shared.lostLease("report", lease.LeaseID, time.Now(), lease.ExpiresAt)
		case status == http.StatusNoContent && result == "rate_limited":
			l.shared.reported(lease.Proxy.ID+"@"+lease.Proxy.IP, target, sent, time.Now(), time.Duration(retryAfter)*time.Second)
		}
	}
	if rng.IntN(5) == 0 {
		l.mu.Lock()
		l.abandoned = append(l.abandoned, abandonedLease{id: lease.LeaseID, expiresAt: lease.ExpiresAt})
		l.mu.Unlock()
		l.held.note(lease.Proxy.IP, lease.LeaseID, granted, lease.ExpiresAt.Add(-expirySlack))
		return
	}
	l.held.note(lease.Proxy.IP, lease.LeaseID, granted, time.Now())
	l.do("release", http.MethodDelete, path, "")
}

// audit looks up every abandoned lease once its TTL is over: the API must
// no longer know it.
func (l *load) audit(ctx context.Context) {
	for ctx.Err() == nil {
		l.auditDue()
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// auditDue looks up the abandoned leases whose TTL is over.
func (l *load) auditDue() {
	l.mu.Lock()
	now := time.Now()
	due := takeDue(&l.abandoned, func(a abandonedLease) bool { return now.After(a.expiresAt.Add(expirySlack)) })
	l.mu.Unlock()
	for _, a := range due {
		status, _ := l.do("lease-audit", http.MethodGet, "/v1/leases/"+a.id, "")
		l.mu.Lock()
		switch status {
		case 0: // no answer (the operator was down): ask again later
			l.abandoned = append(l.abandoned, a)
		case http.StatusOK:
			l.audited++
			l.outlivedTTL = append(l.outlivedTTL, fmt.Sprintf("lease %s still answers %s after it expired at %s", a.id, time.Since(a.expiresAt).Round(time.Millisecond), a.expiresAt.Format(time.RFC3339Nano)))
		default:
			l.audited++
		}
		l.mu.Unlock()
	}
}

func (l *load) note(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.unexpected = append(l.unexpected, s)
}

// requests counts the answered requests.
func (l *load) requests() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, byStatus := range l.statuses {
		for _, c := range byStatus {
			n += c
		}
	}
	return n
}

// latency is a percentile of every answered request's latency.
func (l *load) latency(p float64) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.latencies) == 0 {
		return 0
	}
	sorted := slices.Clone(l.latencies)
	slices.Sort(sorted)
	return sorted[min(len(sorted)-1, int(p*float64(len(sorted))))]
}

// statusTable lists the answers per route and status, for the figures.
func (l *load) statusTable() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	routes := make([]string, 0, len(l.statuses))
	for r := range l.statuses {
		routes = append(routes, r)
	}
	sort.Strings(routes)
	var b strings.Builder
	for _, r := range routes {
		codes := make([]int, 0, len(l.statuses[r]))
		for c := range l.statuses[r] {
			codes = append(codes, c)
		}
		slices.Sort(codes)
		fmt.Fprintf(&b, "  %-12s", r)
		for _, c := range codes {
			fmt.Fprintf(&b, " %d×%d", c, l.statuses[r][c])
		}
		b.WriteString("\n")
	}
	return b.String()
}
