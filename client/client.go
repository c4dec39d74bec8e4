// Package client is the Go client of the operator's discovery API, for
// crawler teams who want control: lease a proxy for a target, keep the lease
// renewed in the background, report how a site answered (its Retry-After
// included), release it. Transport does all of that per request host, as an
// http.RoundTripper, and its Proxy method plugs into http.Transport.Proxy
// or Colly's SetProxyFunc.
//
// It speaks only the HTTP API and imports nothing of the operator, so a
// crawler depends on this package alone (depguard holds it to that).
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Error codes of the discovery API, stable for switching on.
const (
	CodeNoProxyAvailable = "no_proxy_available"
	CodeProxyUnavailable = "proxy_unavailable"
	CodeLeaseNotFound    = "lease_not_found"
	CodeStoreUnavailable = "store_unavailable"
	CodeUnauthorized     = "unauthorized"
)

// APIError is an answer of the API other than success.
type APIError struct {
	StatusCode int
	Code       string
	Message    string
	// RetryAfter is the answer's Retry-After, when it had one.
	RetryAfter time.Duration
}

func (e *APIError) Error() string {
	return fmt.Sprintf("discovery API: %d %s: %s", e.StatusCode, e.Code, e.Message)
}

// HasCode says whether err is an APIError with that code.
func HasCode(err error, code string) bool {
	var apiErr *APIError
	return errors.As(err, &apiErr) && apiErr.Code == code
}

// Client calls one discovery API.
type Client struct {
	base  *url.URL
	token string
	http  *http.Client
}

// Option changes a Client.
type Option func(*Client)

// WithHTTPClient sets the client that reaches the API itself (not the
// crawled sites). Default: a client with a 30s timeout.
func WithHTTPClient(h *http.Client) Option { return func(c *Client) { c.http = h } }

// New returns a client of the API at baseURL (http://host:8090) that sends
// token as its bearer token ("" for an API run without one).
func New(baseURL, token string, opts ...Option) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("discovery API URL %q must be http(s)://host:port", baseURL)
	}
	c := &Client{base: u, token: token, http: &http.Client{Timeout: 30 * time.Second}}
	for _, o := range opts {
		o(c)
	}
	return c, nil
}

// String is the API's base URL.
func (c *Client) String() string { return c.base.String() }

// Proxy is a proxy as the API shows it.
type Proxy struct {
	ID   string `json:"id"`
	IP   string `json:"ip"`
	Port int32  `json:"port"`
	// URL carries the credentials when the API is authenticated.
	URL                 string            `json:"url"`
	Username            string            `json:"username,omitempty"`
	Password            string            `json:"password,omitempty"`
	CredentialsWithheld string            `json:"credentialsWithheld,omitempty"`
	Attributes          map[string]string `json:"attributes"`
	// ExitIP is the address sites see its requests come from (its IP, or
	// the egress IP the operator learnt when another).
	ExitIP string `json:"exitIP,omitempty"`
	// IPv6Prefix is the IPv6 range it leaves from to sites with an IPv6
	// address, and SessionAddresses how many of its addresses it leaves
	// from: a CONNECT with the header SessionAddressHeader i (0 to
	// SessionAddresses-1) leaves from the range's first address plus i+1.
	IPv6Prefix       string `json:"ipv6Prefix,omitempty"`
	SessionAddresses int32  `json:"sessionAddresses,omitempty"`
	Healthy          bool   `json:"healthy"`
	ActiveLeases     int    `json:"activeLeases"`
}

// SessionAddressHeader names, in a CONNECT or plain-HTTP request to a
// leased proxy with SessionAddresses, the address of its IPv6 range the
// request leaves from (the proxy drops it before anything leaves).
const SessionAddressHeader = "X-Egress-Session-Address"

// Lease is a claim on one proxy until ExpiresAt.
type Lease struct {
	ID        string    `json:"leaseID"`
	Proxy     Proxy     `json:"proxy"`
	Target    string    `json:"target,omitempty"`
	ExpiresAt time.Time `json:"expiresAt"`
	// State is "active", or "proxy_unavailable" once the proxy stopped
	// serving (Reason says why): lease another.
	State  string `json:"state"`
	Reason string `json:"reason,omitempty"`
	// Paced says the target's politeness applied: the lease covers one
	// request, sent no earlier than NextRequestAt (when set).
	Paced         bool       `json:"paced,omitempty"`
	NextRequestAt *time.Time `json:"nextRequestAt,omitempty"`
	// Why says how the proxy was chosen, in the answer that created the
	// lease: least-loaded, then the fewest recent blocks by the target,
	// or the soonest slot in the target's pace.
	Why string `json:"why,omitempty"`
	// Exclusive says the lease holds its proxy alone.
	Exclusive bool `json:"exclusive,omitempty"`
}

// ProxyURL is the proxy's URL, credentials included, for
// http.ProxyURL or a crawler's proxy setting.
func (l *Lease) ProxyURL() (*url.URL, error) {
	u, err := url.Parse(l.Proxy.URL)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("lease %s: proxy %s has no usable URL (%q)", l.ID, l.Proxy.ID, l.Proxy.URL)
	}
	return u, nil
}

// LeaseRequest asks for a lease.
type LeaseRequest struct {
	// Selector is the attributes the proxy must have (geo, pool, ...).
	Selector map[string]string
	// Target is the host to be crawled: proxies cooling down for it are
	// not leased.
	Target string
	// TTL is the lease's life; 0 takes the API's default (300s).
	TTL time.Duration
	// MaxWait is how long the caller will wait for a paced target's next
	// slot (at most a minute); 0: only a slot free now.
	MaxWait time.Duration
	// Exclusive asks for a proxy nobody else holds a lease on, held alone
	// until the lease is released or expires (account-per-IP work). With
	// none free: CodeNoProxyAvailable and a RetryAfter.
	Exclusive bool
}

// Lease leases the least-loaded healthy proxy matching req. With none free
// it returns an APIError with CodeNoProxyAvailable and a RetryAfter.
func (c *Client) Lease(ctx context.Context, req LeaseRequest) (*Lease, error) {
	body := map[string]any{"selector": req.Selector, "target": req.Target}
	if req.Selector == nil {
		body["selector"] = map[string]string{}
	}
	if req.TTL > 0 {
		body["ttlSeconds"] = ttlSeconds(req.TTL)
	}
	if req.MaxWait > 0 {
		body["maxWaitSeconds"] = req.MaxWait.Seconds()
	}
	if req.Exclusive {
		body["exclusive"] = true
	}
	var l Lease
	if err := c.do(ctx, http.MethodPost, "/v1/leases", body, http.StatusCreated, &l); err != nil {
		return nil, err
	}
	return &l, nil
}

// Get reads a lease.
func (c *Client) Get(ctx context.Context, id string) (*Lease, error) {
	var l Lease
	if err := c.do(ctx, http.MethodGet, "/v1/leases/"+url.PathEscape(id), nil, http.StatusOK, &l); err != nil {
		return nil, err
	}
	return &l, nil
}

// Renew extends a lease by ttl from now (0: the API's default). A lease
// whose proxy stopped serving answers CodeProxyUnavailable: release it and
// lease another.
func (c *Client) Renew(ctx context.Context, id string, ttl time.Duration) (*Lease, error) {
	var body any
	if ttl > 0 {
		body = map[string]any{"ttlSeconds": ttlSeconds(ttl)}
	}
	var l Lease
	if err := c.do(ctx, http.MethodPost, "/v1/leases/"+url.PathEscape(id)+"/renew", body, http.StatusOK, &l); err != nil {
		return nil, err
	}
	return &l, nil
}

// Release ends a lease. Releasing one already gone is not an error.
func (c *Client) Release(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/v1/leases/"+url.PathEscape(id), nil, http.StatusNoContent, nil)
}

// Result is how a site answered through a leased proxy.
type Result string

// Results a report may carry.
const (
	ResultOK          Result = "ok"
	ResultError       Result = "error"
	ResultRateLimited Result = "rate_limited"
	// ResultBlocked: the site refused the proxy itself (a 403, a ban
	// page). It cools the proxy for the site as rate_limited does, slows
	// nobody's pace, and counts toward the proxy's ban.
	ResultBlocked Result = "blocked"
)

// Report is what a crawler tells the API about a lease.
type Report struct {
	Result Result
	// Target is the host that answered; required for rate_limited and
	// blocked.
	Target string
	// RetryAfter is how long the site asked to be left alone (its
	// Retry-After); the API keeps the proxy away from Target for at least
	// this long.
	RetryAfter time.Duration
}

// Report records a lease's outcome.
func (c *Client) Report(ctx context.Context, id string, r Report) error {
	body := map[string]any{"result": r.Result, "target": r.Target}
	if r.RetryAfter > 0 {
		body["retryAfterSeconds"] = ttlSeconds(r.RetryAfter)
	}
	return c.do(ctx, http.MethodPost, "/v1/leases/"+url.PathEscape(id)+"/report", body, http.StatusNoContent, nil)
}

// ReportOf reads a site's response as a report: 429 is rate_limited and
// 403 blocked, each with the response's Retry-After; 5xx an error; the
// rest ok.
func ReportOf(resp *http.Response, now time.Time) Report {
	r := Report{Result: ResultOK, Target: resp.Request.URL.Hostname()}
	switch {
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusForbidden:
		r.Result = ResultRateLimited
		if resp.StatusCode == http.StatusForbidden {
			r.Result = ResultBlocked
		}
		r.RetryAfter, _ = ParseRetryAfter(resp.Header.Get("Retry-After"), now)
	case resp.StatusCode >= 500:
		r.Result = ResultError
	}
	return r
}

// ParseRetryAfter reads a Retry-After header in either of its forms
// (RFC 9110): a number of seconds, or an HTTP date, taken relative to now.
// ok is false for an empty or unreadable header; a date in the past is 0.
func ParseRetryAfter(header string, now time.Time) (time.Duration, bool) {
	header = strings.TrimSpace(header)
	if header == "" {
		return 0, false
	}
	if secs, err := strconv.ParseInt(header, 10, 64); err == nil {
		if secs < 0 {
			return 0, false
		}
		return time.Duration(min(secs, int64(24*time.Hour/time.Second))) * time.Second, true
	}
	at, err := http.ParseTime(header)
	if err != nil {
		return 0, false
	}
	return max(0, at.Sub(now)), true
}

// ttlSeconds rounds up to whole seconds, the API's unit.
func ttlSeconds(d time.Duration) int64 {
	return int64((d + time.Second - 1) / time.Second)
}

// maxErrorBody bounds what is read of an error answer.
const maxErrorBody = 64 << 10

// do sends one API request and decodes a want answer into out.
func (c *Client) do(ctx context.Context, method, path string, body any, want int, out any) error {
	var rd io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("encoding the %s %s body: %w", method, path, err)
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base.JoinPath(path).String(), rd)
	if err != nil {
		return fmt.Errorf("building %s %s: %w", method, path, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("discovery API %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != want {
		return apiError(resp)
	}
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("discovery API %s %s: reading the answer: %w", method, path, err)
	}
	return nil
}

func apiError(resp *http.Response) error {
	var body struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	e := &APIError{StatusCode: resp.StatusCode}
	if err := json.Unmarshal(raw, &body); err == nil && body.Error.Code != "" {
		e.Code, e.Message = body.Error.Code, body.Error.Message
	} else {
		e.Message = strings.TrimSpace(string(raw))
	}
	e.RetryAfter, _ = ParseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
	return e
}
