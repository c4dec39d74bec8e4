package gateway

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/example/egress-proxies-operator/broker"
	"github.com/example/egress-proxies-operator/lease"
)

// HeaderExitIP names, in a CONNECT reply and a forwarded response, the
// address the site saw the request come from (as x-brd-ip does for Bright
// Data): the upstream's exit IP.
const HeaderExitIP = "X-Egress-IP"

// HeaderSessionRetired says, in a CONNECT reply and a forwarded response,
// that the session's last stint was retired and this one starts a new
// stint (on another proxy when one could take the host): its value is why
// (error_score, max_uses). A client that keeps its own session state
// (cookies, a browser profile) starts it afresh too.
const HeaderSessionRetired = "X-Session-Retired"

// RFC 9209 error types the gateway answers with.
const (
	psHTTPRequestDenied       = "http_request_denied"
	psHTTPRequestError        = "http_request_error"
	psConnectionLimitReached  = "connection_limit_reached"
	psDestinationUnavailable  = "destination_unavailable"
	psConnectionRefused       = "connection_refused"
	psConnectionTimeout       = "connection_timeout"
	psHTTPProtocolError       = "http_protocol_error"
	psProxyConfigError        = "proxy_configuration_error"
	psProxyInternalError      = "proxy_internal_error"
	psDestinationIPProhibited = "destination_ip_prohibited"
)

// Causes of the gateway's own answers: the first word of a Proxy-Status
// details, and the cause label of proxy_operator_gateway_errors_total.
const (
	CauseAuthRequired     = "auth_required"      // 407: no or unreadable credentials
	CauseWrongPassword    = "wrong_password"     // 407: the password is no token the operator takes
	CauseGatewayLocked    = "gateway_locked"     // 503: the operator has no token to check passwords with
	CauseAuthUnavailable  = "auth_unavailable"   // 503: the password could not be checked now
	CauseBadRequest       = "bad_request"        // 400: neither CONNECT nor an absolute http:// URL, or no host:port
	CauseBadUsername      = "bad_username"       // 400: the username does not parse
	CauseDestination      = "destination_denied" // 403: a port or address the fleet's proxies refuse (--gateway-connect-ports, --gateway-http-ports, --gateway-denied-destinations)
	CauseQuota            = "quota"              // 429: the tenant is at a TenantQuota limit
	CauseBusy             = "busy"               // 503: the gateway carries its --gateway-max-tunnels
	CauseNoProxy          = "no_proxy"           // 503: no healthy proxy matches the selector
	CauseExclusive        = "exclusive"          // 503: every matching proxy is in use or held (an exclusive session)
	CausePaced            = "paced"              // 429: the host's pace allows no proxy a request within --gateway-pace-wait
	CauseConcurrency      = "concurrency"        // 429: every proxy holds as many connections to the host as allowed
	CauseCooling          = "cooling"            // 429: every proxy is cooling down for the host
	CauseStoreUnavailable = "store_unavailable"  // 503: the lease store did not answer
	CauseUpstreamFailed   = "upstream_failed"    // 502: every upstream tried failed or refused the tunnel
	CauseSessionLost      = "session_lost"       // 502: a strict session's proxy or exit IP is gone
	CauseSessionEnded     = "session_ended"      // 502: a strict session's lifetime is over
	// CauseSessionRetired (502): a strict session's stint met its error
	// score or usage cap; in a carried answer's details, a soft session's
	// new stint after one was retired.
	CauseSessionRetired = "session_retired"
	// CauseClientBanned is no refusal: the details of a carried tunnel's
	// 200 when its host bans the session's TLS client everywhere.
	CauseClientBanned = "client_banned"
	// CauseInspectOff (400): the username asks for -inspect on a gateway
	// without --gateway-inspect; CauseInspectUnavailable (503): the
	// tenant's CA could not be read; CauseInspecting is no refusal: the
	// details of an inspected tunnel's 200.
	CauseInspectOff         = "inspect_off"
	CauseInspectUnavailable = "inspect_unavailable"
	CauseInspecting         = "inspecting"
)

// answer is a response the gateway itself gives instead of the site's.
type answer struct {
	status int
	// errType is the RFC 9209 error type; cause the gateway's own word
	// for it (details and metrics).
	errType, cause string
	msg            string
	retryAfter     time.Duration
	// nextHop names the upstream concerned ("" none); receivedStatus is
	// its answer (0 none).
	nextHop        string
	receivedStatus int
}

// write sends a: its status, Proxy-Status, Retry-After when set, and the
// message as the body; and counts it.
func (a answer) write(w http.ResponseWriter, r *http.Request) {
	requestsTotal.WithLabelValues(kindOf(r), outcomeOf(a.cause)).Inc()
	errorsTotal.WithLabelValues(a.errType, a.cause).Inc()
	h := w.Header()
	h.Set("Proxy-Status", a.proxyStatus())
	if a.retryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(int((a.retryAfter+time.Second-1)/time.Second)))
	}
	if a.status == http.StatusProxyAuthRequired {
		h.Set("Proxy-Authenticate", realm)
	}
	http.Error(w, a.msg, a.status)
}

// proxyStatus is a's Proxy-Status (RFC 9209): the gateway's member, with
// the error type, the next hop and what it answered, and details that
// start with the cause.
func (a answer) proxyStatus() string {
	var b strings.Builder
	b.WriteString(ProxyStatusName)
	b.WriteString("; error=")
	b.WriteString(a.errType)
	if a.nextHop != "" {
		b.WriteString("; next-hop=")
		b.WriteString(sfString(a.nextHop))
	}
	if a.receivedStatus > 0 {
		fmt.Fprintf(&b, "; received-status=%d", a.receivedStatus)
	}
	b.WriteString("; details=")
	b.WriteString(sfString(a.cause + ": " + a.msg))
	return b.String()
}

// servedStatus is the Proxy-Status of an answer the gateway carried: no
// error, and the upstream that carried it; when the host bans the
// session's TLS client everywhere, details say so (CauseClientBanned).
func servedStatus(up broker.Upstream) string {
	s := ProxyStatusName + "; next-hop=" + sfString(up.ProxyID)
	var details []string
	if up.Retired != "" {
		details = append(details, CauseSessionRetired+": the session's last stint was retired ("+up.Retired+"); this one starts a new stint on "+up.ProxyID)
	}
	if up.BannedClient != "" {
		details = append(details, CauseClientBanned+": the host blocks the TLS client "+up.BannedClient+
			" through every proxy while other clients pass; another IP will not help, another client (TLS fingerprint) will")
	}
	if len(details) > 0 {
		s += "; details=" + sfString(strings.Join(details, "; "))
	}
	return s
}

// sfString is s as a Structured Field string (RFC 8941): quoted, with '"'
// and '\' escaped and anything but printable ASCII dropped.
func sfString(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('"')
	for _, c := range []byte(s) {
		switch {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c >= 0x20 && c < 0x7f:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// outcomeOf is the outcome label of proxy_operator_gateway_requests_total
// for an answer's cause.
func outcomeOf(cause string) string {
	switch cause {
	case CauseAuthRequired, CauseWrongPassword, CauseGatewayLocked, CauseAuthUnavailable, CauseBadRequest, CauseBadUsername:
		return outcomeRefused
	case CauseQuota:
		return outcomeQuota
	case CauseBusy:
		return outcomeBusy
	case CausePaced, CauseConcurrency, CauseCooling:
		return outcomePaced
	case CauseUpstreamFailed:
		return outcomeUpstreamFailed
	case CauseSessionLost, CauseSessionEnded, CauseSessionRetired:
		return outcomeSessionLost
	}
	return outcomeNoProxy
}

// pickAnswer is the answer to a client whose tunnel or request found no
// upstream: why, from the pick's error and the last upstream failure.
func pickAnswer(err error, last *failure) answer {
	var (
		none  *lease.NoProxyAvailableError
		quota *broker.QuotaError
		lost  *broker.SessionLostError
	)
	switch {
	case errors.As(err, &quota):
		// The tenant's own limit: a 429 with when to come back, as a site
		// would answer.
		return answer{status: http.StatusTooManyRequests, errType: psConnectionLimitReached, cause: CauseQuota,
			msg:        quota.Error(),
			retryAfter: max(quota.RetryAfter, time.Second)}
	case errors.As(err, &lost):
		a := answer{status: http.StatusBadGateway, errType: psDestinationUnavailable, cause: CauseSessionLost, msg: lost.Error(), nextHop: lost.Proxy}
		switch lost.Cause {
		case broker.SessionEnded:
			a.cause = CauseSessionEnded
		case broker.SessionRetired:
			a.cause = CauseSessionRetired
		}
		if last != nil {
			a.msg += "; it failed: " + last.err.Error()
			a.receivedStatus = last.status
		}
		return a
	case errors.Is(err, broker.ErrInvalidTunnel):
		return answer{status: http.StatusBadRequest, errType: psHTTPRequestError, cause: CauseBadRequest, msg: err.Error()}
	case errors.As(err, &none) && last != nil:
		return last.answer()
	case errors.As(err, &none) && none.Cause == lease.CauseExclusive:
		return answer{status: http.StatusServiceUnavailable, errType: psDestinationUnavailable, cause: CauseExclusive,
			msg: "every proxy matching the selector is in use or held by an exclusive session", retryAfter: max(none.RetryAfter, 5*time.Second)}
	case errors.As(err, &none) && none.Cause != "":
		// Proxies match, but none may take this host now: a 429, as the
		// site itself would say, with the cause for the crawler's log.
		return answer{status: http.StatusTooManyRequests, errType: psConnectionLimitReached, cause: none.Cause,
			msg:        fmt.Sprintf("no proxy may take this host now: %s (retry in %dms)", none.Error(), none.RetryAfter.Milliseconds()),
			retryAfter: max(none.RetryAfter, time.Second)}
	case errors.As(err, &none):
		retry := none.RetryAfter
		if retry <= 0 {
			retry = 5 * time.Second
		}
		return answer{status: http.StatusServiceUnavailable, errType: psDestinationUnavailable, cause: CauseNoProxy,
			msg: "no healthy proxy matches the selector", retryAfter: retry}
	}
	return answer{status: http.StatusServiceUnavailable, errType: psProxyInternalError, cause: CauseStoreUnavailable,
		msg: "the lease store did not answer; retry", retryAfter: 2 * time.Second}
}

// failure is how one upstream failed a tunnel or request.
type failure struct {
	proxy  string
	reason string // a fail* reason
	status int    // the upstream's answer, 0 for none
	err    error
}

// answer is the 502 for a tunnel whose last upstream failed so.
func (f *failure) answer() answer {
	errType := psDestinationUnavailable
	switch f.reason {
	case failDial:
		errType = psConnectionRefused
	case failTimeout:
		errType = psConnectionTimeout
	case failAuth:
		errType = psProxyConfigError
	case failProtocol:
		errType = psHTTPProtocolError
	}
	return answer{status: http.StatusBadGateway, errType: errType, cause: CauseUpstreamFailed, nextHop: f.proxy, receivedStatus: f.status,
		msg: fmt.Sprintf("no upstream could reach the target; the last one: %s: %v", f.proxy, f.err)}
}
