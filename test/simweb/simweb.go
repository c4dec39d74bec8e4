// Package simweb is a simulated web for tests, benchmarks and the demo:
// HTTPS and plain-HTTP sites on loopback addresses that see each request's
// exit IP (its source address: every proxy in tests leaves from a loopback
// address of its own) and answer it by anti-bot rules set per site, as real
// sites do: a per-IP rate limit answered with 429 and Retry-After, a ban
// (403 for a period) after repeated violations, a per-IP concurrency
// limit, a list of blocked IPs, and soft blocks (200 with a block page).
//
// A site's rules are data, published at RulesPath, so a test computes what
// they allow (Oracle) from the same numbers the site enforces. A site
// counts every answer by kind and remembers the IPs it banned.
//
// It is test support only; production code must never import it.
package simweb

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/example/egress-proxies-operator/tlsprint"
)

// RulesPath is where every site publishes its Rules as JSON.
const RulesPath = "/.well-known/simweb-rules"

// BlockPageMarker is in the body of every soft block page, so a crawler
// (and a benchmark) can tell a block page from a page.
const BlockPageMarker = "simweb-block-page"

// Rules are one site's anti-bot rules, applied per exit IP.
type Rules struct {
	// RatePerSecond is the requests per second each IP may send on
	// average, and Burst how many an idle IP may send at once (a token
	// bucket per IP). Zero RatePerSecond: no rate limit.
	RatePerSecond float64 `json:"ratePerSecond,omitempty"`
	Burst         int     `json:"burst,omitempty"`
	// PerWindow requests in any Window per IP, a sliding log as most rate
	// limiters and WAF rules count: one more is a violation. Zero: none.
	PerWindow int      `json:"perWindow,omitempty"`
	Window    Duration `json:"window,omitempty"`
	// FixedWindow counts PerWindow in aligned windows (each Window from a
	// multiple of it) instead of a sliding log, as many rate limiters do.
	FixedWindow bool `json:"fixedWindow,omitempty"`
	// CountBy "network" applies every per-IP number (rates, windows,
	// concurrency, bans) to the IP's /24 (an IPv6 address's /64)
	// instead, as sites that limit a whole range do; "" counts per IP.
	CountBy string `json:"countBy,omitempty"`
	// IPv6Prefix, when counting per IP, counts an IPv6 address by its
	// network of that length instead (64: one subscriber's allocation, as
	// most sites and WAFs count IPv6); 0 counts each address.
	IPv6Prefix int `json:"ipv6Prefix,omitempty"`
	// BanAfter violations (requests over the rate or the concurrency
	// limit) within BanWindow ban the IP for BanFor: every request is
	// then answered 403, and the IP is burned on this site. Zero: no bans.
	BanAfter  int      `json:"banAfter,omitempty"`
	BanWindow Duration `json:"banWindow,omitempty"`
	BanFor    Duration `json:"banFor,omitempty"`
	// MaxConcurrent bounds each IP's requests in flight; one more is a
	// violation. Zero: no limit.
	MaxConcurrent int `json:"maxConcurrent,omitempty"`
	// Blocked IPs are answered 403 from their first request.
	Blocked []string `json:"blocked,omitempty"`
	// BlockedClients are TLS clients, by JA4 fingerprint (package
	// tlsprint), answered 403 from any IP, as sites and WAFs block a
	// client they take for a bot: the IP is not banned for it.
	BlockedClients []string `json:"blockedClients,omitempty"`
	// SoftBlocked IPs are answered 200 with a block page.
	SoftBlocked []string `json:"softBlocked,omitempty"`
	// SoftViolations answers a violation with a 200 block page instead of
	// a 429, as sites that hide their limits do (it still counts toward a
	// ban).
	SoftViolations bool `json:"softViolations,omitempty"`
	// Latency is how long the site takes to answer a page.
	Latency Duration `json:"latency,omitempty"`
}

// Duration is a time.Duration that reads and writes JSON as "1.5s".
type Duration time.Duration

// MarshalJSON writes d as Go's duration text.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON reads Go's duration text.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("a duration must be a string such as \"1.5s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("duration %q: %w", s, err)
	}
	*d = Duration(v)
	return nil
}

// Answer kinds a site counts.
const (
	AnswerPage      = "page"       // 200 with the page
	AnswerLimited   = "limited"    // 429: over the rate or the concurrency limit
	AnswerBanned    = "banned"     // 403: the IP is banned here
	AnswerBlocked   = "blocked"    // 403: the IP is on the block list
	AnswerSoftBlock = "soft_block" // 200 with a block page
	AnswerClient    = "client"     // 403: the TLS client is blocked, whatever its IP
)

// Site is one simulated web site.
type Site struct {
	// Host is the site's address (a loopback IP); URL its base URL.
	Host, URL string
	Rules     Rules
	srv       *httptest.Server
	roots     *x509.CertPool
	cert      *x509.Certificate
	now       func() time.Time

	// clients are the JA4 fingerprints of the TLS connections, by the
	// client's address.
	clients sync.Map

	mu        sync.Mutex
	seenAs    map[string]string // SeeAs
	seen      map[string]bool   // every TLS client's fingerprint
	ips       map[string]*ipState
	answers   map[string]int
	bannedIPs []string
}

// ipState is what a site knows of one exit IP.
type ipState struct {
	tokens     float64
	refilled   time.Time
	violations []time.Time
	// sent are the pages of the last Window (a sliding log); inWindow
	// those of the fixed window that began at windowStart.
	sent        []time.Time
	windowStart time.Time
	inWindow    int
	bannedTill  time.Time
	inFlight    int
	requests    int
}

// Start serves a site with rules on a free port of ip (a loopback
// address), over TLS when https is set (with a certificate of its own for
// ip), and stops it with Close.
func Start(ip string, https bool, rules Rules) (*Site, error) {
	return StartOn(net.JoinHostPort(ip, "0"), https, rules)
}

// StartOn is Start on addr (ip:port): a Squid with the usual rules lets
// CONNECT reach port 443 only, and plain HTTP 80.
func StartOn(addr string, https bool, rules Rules) (*Site, error) {
	ip, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("site address %q: %w", addr, err)
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("site on %s: %w", addr, err)
	}
	s := &Site{Host: ip, Rules: rules, now: time.Now, ips: map[string]*ipState{}, answers: map[string]int{}, seen: map[string]bool{}}
	s.srv = httptest.NewUnstartedServer(s)
	s.srv.Listener = lis
	s.srv.Config.ConnState = func(c net.Conn, st http.ConnState) {
		if st == http.StateClosed || st == http.StateHijacked {
			s.clients.Delete(c.RemoteAddr().String())
		}
	}
	if !https {
		s.srv.Start()
		s.URL = s.srv.URL
		return s, nil
	}
	cert, err := SelfSigned(net.ParseIP(ip), "simweb site "+ip)
	if err != nil {
		_ = lis.Close()
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert.Leaf)
	s.srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			fp := tlsprint.JA4(h)
			s.clients.Store(h.Conn.RemoteAddr().String(), fp)
			s.mu.Lock()
			s.seen[fp] = true
			s.mu.Unlock()
			return nil, nil
		}}
	// Sites speak HTTP/2 to the clients that offer it, as real ones do.
	s.srv.EnableHTTP2 = true
	s.srv.StartTLS()
	s.URL, s.roots, s.cert = s.srv.URL, pool, cert.Leaf
	return s, nil
}

// SeeAs makes the site see requests from each loopback source address
// (a key) as coming from the public address it maps to, as a site on the
// internet sees a proxy's exit IP: tests may only leave from loopback
// addresses, so an IPv6 fleet is a set of loopback Squids the sites see as
// IPv6 addresses. Call it before the site's first request.
func (s *Site) SeeAs(addresses map[string]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seenAs = addresses
}

// exitIP is the address the site sees a request from source as.
func (s *Site) exitIP(source string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if as, ok := s.seenAs[source]; ok {
		return as
	}
	return source
}

// Roots trust the site's certificate (nil for plain HTTP).
func (s *Site) Roots() *x509.CertPool { return s.roots }

// Certificate is the site's self-signed certificate (nil for plain HTTP),
// for a client that trusts several sites.
func (s *Site) Certificate() *x509.Certificate { return s.cert }

// Client is an HTTP client that trusts the site's certificate.
func (s *Site) Client() *http.Client {
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: s.roots, MinVersion: tls.VersionTLS12}}}
}

// SelfSigned makes a certificate for ip, self-signed so that it is its own
// CA (Leaf set), for a local server that clients must trust by name.
func SelfSigned(ip net.IP, commonName string) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("a key for %s: %w", ip, err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: commonName},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{ip}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("a certificate for %s: %w", ip, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("a certificate for %s: %w", ip, err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

// Close stops the site.
func (s *Site) Close() { s.srv.Close() }

// ServeHTTP answers one request by the rules.
func (s *Site) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == RulesPath {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(s.Rules)
		return
	}
	source, _, _ := net.SplitHostPort(r.RemoteAddr)
	ip := s.exitIP(source)
	key := s.countKey(ip)
	client := ""
	if fp, ok := s.clients.Load(r.RemoteAddr); ok {
		client = fp.(string)
	}
	kind, retryAfter := s.admit(key, ip, client)
	defer s.done(key, kind)
	switch kind {
	case AnswerLimited:
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(retryAfter.Seconds()))))
		http.Error(w, "too many requests from "+ip, http.StatusTooManyRequests)
	case AnswerBanned:
		http.Error(w, ip+" is banned from this site", http.StatusForbidden)
	case AnswerBlocked:
		http.Error(w, ip+" is blocked", http.StatusForbidden)
	case AnswerClient:
		http.Error(w, "your client is blocked", http.StatusForbidden)
	case AnswerSoftBlock:
		_, _ = fmt.Fprintf(w, "<html><head><title>Just a moment</title></head><body class=%q>Please prove you are human.</body></html>\n", BlockPageMarker)
	default:
		if d := time.Duration(s.Rules.Latency); d > 0 {
			time.Sleep(d)
		}
		// ?images=N: the page shows N images of the site's, as a
		// browser's page loads its subresources.
		images := ""
		if n, err := strconv.Atoi(r.URL.Query().Get("images")); err == nil {
			for i := range min(n, 64) {
				images += fmt.Sprintf(`<img src="%s-image-%d" alt="">`, r.URL.Path, i)
			}
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = fmt.Fprintf(w, "<html><head><title>%s%s</title><link rel=\"icon\" href=\"data:,\"></head><body>page %s of %s%s</body></html>\n",
			s.Host, r.URL.Path, r.URL.Path, s.Host, images)
	}
}

// countKey is what the site counts ip under: itself, its network
// (CountBy "network": a /24, an IPv6 /64), or for IPv6 the network of
// IPv6Prefix.
func (s *Site) countKey(ip string) string {
	addr, err := netip.ParseAddr(ip)
	if err != nil {
		return ip
	}
	addr = addr.Unmap()
	bits := 0
	switch {
	case s.Rules.CountBy == CountByNetwork && addr.Is4():
		bits = 24
	case s.Rules.CountBy == CountByNetwork:
		bits = 64
	case addr.Is6() && s.Rules.IPv6Prefix > 0:
		bits = s.Rules.IPv6Prefix
	default:
		return ip
	}
	p, _ := addr.Prefix(bits)
	return p.String()
}

// CountByNetwork is Rules.CountBy for a site that counts per network.
const CountByNetwork = "network"

// admit decides one request's answer (key is what the site counts ip
// under) and counts it in flight.
func (s *Site) admit(key, ip, client string) (kind string, retryAfter time.Duration) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.ips[key]
	if st == nil {
		st = &ipState{tokens: float64(max(s.Rules.Burst, 1)), refilled: now}
		s.ips[key] = st
	}
	st.requests++
	st.inFlight++
	switch {
	case client != "" && slices.Contains(s.Rules.BlockedClients, client):
		return AnswerClient, 0
	case slices.Contains(s.Rules.Blocked, ip):
		return AnswerBlocked, 0
	case now.Before(st.bannedTill):
		return AnswerBanned, 0
	case slices.Contains(s.Rules.SoftBlocked, ip):
		return AnswerSoftBlock, 0
	}
	r := s.Rules
	violation := false
	if r.MaxConcurrent > 0 && st.inFlight > r.MaxConcurrent {
		violation, retryAfter = true, time.Second
	}
	if !violation && r.RatePerSecond > 0 {
		st.tokens = min(float64(max(r.Burst, 1)), st.tokens+now.Sub(st.refilled).Seconds()*r.RatePerSecond)
		st.refilled = now
		if st.tokens < 1 {
			violation = true
			retryAfter = time.Duration((1 - st.tokens) / r.RatePerSecond * float64(time.Second))
		} else {
			st.tokens--
		}
	}
	if w := time.Duration(r.Window); !violation && r.PerWindow > 0 && w > 0 && r.FixedWindow {
		if start := now.Truncate(w); !start.Equal(st.windowStart) {
			st.windowStart, st.inWindow = start, 0
		}
		if st.inWindow >= r.PerWindow {
			violation, retryAfter = true, st.windowStart.Add(w).Sub(now)
		} else {
			st.inWindow++
		}
	} else if !violation && r.PerWindow > 0 && w > 0 {
		st.sent = slices.DeleteFunc(st.sent, func(t time.Time) bool { return now.Sub(t) >= w })
		if len(st.sent) >= r.PerWindow {
			violation, retryAfter = true, w-now.Sub(st.sent[0])
		} else {
			st.sent = append(st.sent, now)
		}
	}
	if !violation {
		return AnswerPage, 0
	}
	if r.BanAfter > 0 {
		window := time.Duration(r.BanWindow)
		st.violations = slices.DeleteFunc(append(st.violations, now), func(t time.Time) bool { return window > 0 && now.Sub(t) > window })
		if len(st.violations) >= r.BanAfter {
			st.bannedTill = now.Add(time.Duration(r.BanFor))
			st.violations = nil
			if !slices.Contains(s.bannedIPs, key) {
				s.bannedIPs = append(s.bannedIPs, key)
			}
		}
	}
	if r.SoftViolations {
		return AnswerSoftBlock, 0
	}
	return AnswerLimited, retryAfter
}

// BlockClients has the site block these TLS clients (Rules.BlockedClients)
// from now on.
func (s *Site) BlockClients(fingerprints ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.Rules.BlockedClients = append(s.Rules.BlockedClients, fingerprints...)
}

// Clients are the JA4 fingerprints of every TLS client the site has seen,
// sorted.
func (s *Site) Clients() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.seen))
	for fp := range s.seen {
		out = append(out, fp)
	}
	slices.Sort(out)
	return out
}

// done counts a finished request.
func (s *Site) done(key, kind string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ips[key].inFlight--
	s.answers[kind]++
}

// Stats are what a site answered.
type Stats struct {
	// Answers counts answers by kind (AnswerPage, AnswerLimited...).
	Answers map[string]int
	// Banned are the IPs (the networks, when it counts by network) the
	// site banned, in the order it banned them.
	Banned []string
}

// Pages is the pages served; Wasted every other answer.
func (st Stats) Pages() int { return st.Answers[AnswerPage] }

// Wasted is every answer that was not a page.
func (st Stats) Wasted() int {
	n := 0
	for kind, c := range st.Answers {
		if kind != AnswerPage {
			n += c
		}
	}
	return n
}

// Stats reads the site's counts so far.
func (s *Site) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	answers := make(map[string]int, len(s.answers))
	for k, v := range s.answers {
		answers[k] = v
	}
	return Stats{Answers: answers, Banned: slices.Clone(s.bannedIPs)}
}

// Reset forgets every IP and count: a fresh site with the same rules.
func (s *Site) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ips, s.answers, s.bannedIPs = map[string]*ipState{}, map[string]int{}, nil
}

// IsBlockPage says whether a 200's body is a soft block.
func IsBlockPage(body []byte) bool { return strings.Contains(string(body), BlockPageMarker) }

// Oracle is the most pages rules allow from ips in d: each IP (each
// network, when the site counts by network) that is neither blocked nor
// soft-blocked sends its burst, then its rate; at most PerWindow in each
// Window (a fixed window's count may start anew right after the crawl
// begins: one window more); and at most MaxConcurrent requests of Latency
// each at a time; no more than demand in all. No limit at all: demand.
func Oracle(rules Rules, ips []string, d time.Duration, demand int) int {
	s := &Site{Rules: rules}
	counted := map[string]bool{}
	for _, ip := range ips {
		if !slices.Contains(rules.Blocked, ip) && !slices.Contains(rules.SoftBlocked, ip) {
			counted[s.countKey(ip)] = true
		}
	}
	perKey := math.Inf(1)
	if rules.RatePerSecond > 0 {
		perKey = float64(max(rules.Burst, 1)) + rules.RatePerSecond*d.Seconds()
	}
	if w := time.Duration(rules.Window); rules.PerWindow > 0 && w > 0 {
		windows := math.Ceil(d.Seconds() / w.Seconds())
		if rules.FixedWindow {
			windows++
		}
		perKey = min(perKey, float64(rules.PerWindow)*windows)
	}
	if rules.MaxConcurrent > 0 && rules.Latency > 0 {
		perKey = min(perKey, float64(rules.MaxConcurrent)*d.Seconds()/time.Duration(rules.Latency).Seconds())
	}
	if math.IsInf(perKey, 1) {
		return demand
	}
	return min(demand, int(math.Floor(perKey))*len(counted))
}
