package discovery

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"time"

	"github.com/julienschmidt/httprouter"
	"go.opentelemetry.io/otel/trace"

	"github.com/example/egress-proxies-operator/broker"
	"github.com/example/egress-proxies-operator/lease"
	"github.com/example/egress-proxies-operator/tracing"
)

func (s *Server) listProxies(w http.ResponseWriter, r *http.Request, _ httprouter.Params) int {
	sel, healthy, err := parseListQuery(r.URL.RawQuery)
	if err != nil {
		return writeError(w, http.StatusBadRequest, CodeInvalidRequest, err.Error())
	}
	proxies, err := s.broker.Visible(r.Context(), tenantOf(r.Context()), s.opts.View.List(sel, healthy))
	if err != nil {
		return authUnavailable(r.Context(), w, err)
	}
	ids := make([]string, len(proxies))
	for i := range proxies {
		ids[i] = proxies[i].ID
	}
	leases, err := s.store.ActiveLeases(r.Context(), ids)
	if err != nil {
		return storeUnavailable(r.Context(), w, err)
	}
	for i := range proxies {
		proxies[i].ActiveLeases = leases[i]
		s.withCredentials(r.Context(), &proxies[i], nil)
	}
	return writeJSON(w, http.StatusOK, map[string]any{"proxies": proxies})
}

// proxyResponse is GET /v1/proxies/{namespace}/{name}: the proxy as the
// list shows it, and what the hosts it went to made of it lately.
type proxyResponse struct {
	broker.ProxyInfo
	// Outcomes are its records by host (lease.HostRecord): served and
	// blocked outcomes, weights halving every OutcomeHalfLife.
	Outcomes []lease.HostRecord `json:"outcomes"`
}

func (s *Server) getProxy(w http.ResponseWriter, r *http.Request, ps httprouter.Params) int {
	id := ps.ByName("namespace") + "/" + ps.ByName("name")
	info, ok := s.opts.View.Lookup(id, 0)
	if ok {
		shown, err := s.broker.Visible(r.Context(), tenantOf(r.Context()), []broker.ProxyInfo{info})
		if err != nil {
			return authUnavailable(r.Context(), w, err)
		}
		ok = len(shown) == 1
	}
	if !ok {
		return writeError(w, http.StatusNotFound, CodeProxyNotFound, fmt.Sprintf("no proxy %s (or not one this caller may lease)", id))
	}
	leases, err := s.store.ActiveLeases(r.Context(), []string{id})
	if err != nil {
		return storeUnavailable(r.Context(), w, err)
	}
	records, err := s.store.Outcomes(r.Context(), id)
	if err != nil {
		return storeUnavailable(r.Context(), w, err)
	}
	info.ActiveLeases = leases[0]
	s.withCredentials(r.Context(), &info, nil)
	for i := range records {
		records[i].At, records[i].LastBlocked = records[i].At.UTC(), records[i].LastBlocked.UTC()
	}
	return writeJSON(w, http.StatusOK, proxyResponse{ProxyInfo: info, Outcomes: records})
}

// leaseRequest is the body of POST /v1/leases.
type leaseRequest struct {
	Selector   broker.Selector `json:"selector"`
	TTLSeconds *int64          `json:"ttlSeconds"`
	Target     string          `json:"target"`
	// MaxWaitSeconds is how long the client will wait for a paced
	// target's next slot (default 0: only a slot free now).
	MaxWaitSeconds float64 `json:"maxWaitSeconds"`
	// Exclusive asks for a proxy nobody else holds a lease on, held alone
	// until the lease is released or expires.
	Exclusive bool `json:"exclusive"`
}

// MaxLeaseWait bounds a lease request's maxWaitSeconds.
const MaxLeaseWait = time.Minute

// leaseResponse is a lease as the API shows it.
type leaseResponse struct {
	LeaseID   string           `json:"leaseID"`
	Proxy     broker.ProxyInfo `json:"proxy"`
	Target    string           `json:"target,omitempty"`
	ExpiresAt time.Time        `json:"expiresAt"`
	// Paced says, in the answer that created it, that the target's
	// politeness applied: the lease covers one request, at NextRequestAt
	// when that is set (the slot its pace reserved); lease again for the
	// next.
	Paced         bool       `json:"paced,omitempty"`
	NextRequestAt *time.Time `json:"nextRequestAt,omitempty"`
	// State is LeaseActive, or LeaseProxyUnavailable once the proxy is no
	// longer healthy or no longer exists (Reason says which): the lease can
	// no longer be renewed.
	State  string `json:"state"`
	Reason string `json:"reason,omitempty"`
	// Why says, in the answer that created it, how the proxy was chosen
	// (lease.Why*): least-loaded, then the fewest recent blocks by the
	// target, or the soonest slot in the target's pace.
	Why string `json:"why,omitempty"`
	// Exclusive says the lease holds its proxy alone.
	Exclusive bool `json:"exclusive,omitempty"`
}

// Lease states in responses.
const (
	LeaseActive           = "active"
	LeaseProxyUnavailable = "proxy_unavailable"
)

func (s *Server) createLease(w http.ResponseWriter, r *http.Request, _ httprouter.Params) int {
	var req leaseRequest
	if status, code, err := decode(w, r, &req); err != nil {
		return writeError(w, status, code, err.Error())
	}
	ttl, err := s.ttl(req.TTLSeconds)
	if err == nil {
		err = broker.ValidateSelector("selector", req.Selector)
	}
	if err == nil {
		err = broker.ValidateTarget(req.Target, false)
	}
	if err == nil && (req.MaxWaitSeconds < 0 || req.MaxWaitSeconds > MaxLeaseWait.Seconds() || math.IsNaN(req.MaxWaitSeconds)) {
		err = fmt.Errorf("maxWaitSeconds must be between 0 and %d, got %v", int(MaxLeaseWait.Seconds()), req.MaxWaitSeconds)
	}
	if err != nil {
		return writeError(w, http.StatusBadRequest, CodeInvalidRequest, err.Error())
	}
	granted, err := s.broker.Lease(r.Context(), tenantOf(r.Context()), broker.LeaseRequest{Selector: req.Selector, Target: req.Target,
		TTL: ttl, MaxWait: time.Duration(req.MaxWaitSeconds * float64(time.Second)), Exclusive: req.Exclusive})
	var (
		quota   *broker.QuotaError
		refused *broker.RefusedError
	)
	switch {
	case errors.As(err, &quota):
		setRetryAfter(w, max(quota.RetryAfter, time.Second))
		return writeError(w, http.StatusTooManyRequests, CodeQuotaExceeded, quota.Error())
	case errors.As(err, &refused) && refused.Cause.Paced():
		setRetryAfter(w, refused.Cause.RetryAfter)
		return writeError(w, http.StatusTooManyRequests, CodeTargetPaced, fmt.Sprintf(
			"the politeness for target %q allows none of the %d healthy proxies matching selector %v a request within %gs (%s); retry after Retry-After seconds or send a longer maxWaitSeconds",
			broker.NormalizeTarget(req.Target), refused.Candidates, map[string]string(req.Selector), req.MaxWaitSeconds, refused.Cause.Error()))
	case errors.As(err, &refused):
		return noProxy(w, req, refused)
	case errors.Is(err, broker.ErrTenantsUnavailable):
		return authUnavailable(r.Context(), w, err)
	case err != nil:
		return storeUnavailable(r.Context(), w, err)
	}
	trace.SpanFromContext(r.Context()).SetAttributes(tracing.KeyProxy.String(granted.ProxyID), tracing.KeyHost.String(broker.NormalizeTarget(req.Target)),
		tracing.KeyPaceWait.Float64(granted.Wait.Seconds()))
	// Only the answer that creates a lease says how it was paced: both
	// stores know it then, and a paced lease covers that one request.
	view := s.leaseView(r.Context(), granted)
	view.Paced = granted.Paced
	if granted.Wait > 0 {
		next := granted.CreatedAt.Add(granted.Wait).UTC()
		view.NextRequestAt = &next
	}
	return writeJSON(w, http.StatusCreated, view)
}

// noProxy answers 503 no_proxy_available for a lease refused for want of a
// proxy, saying what held the candidates back.
func noProxy(w http.ResponseWriter, req leaseRequest, refused *broker.RefusedError) int {
	none, n, sel := refused.Cause, refused.Candidates, map[string]string(req.Selector)
	retry := retryAfterNoProxyBase
	if none.RetryAfter > 0 && n > 0 {
		retry = none.RetryAfter
	}
	setRetryAfter(w, retry)
	msg := fmt.Sprintf("no healthy proxy matches selector %v", sel)
	switch {
	case n > 0 && none.Cause == lease.CauseExclusive && req.Exclusive:
		msg = fmt.Sprintf("each of the %d healthy proxies matching selector %v is in use or held by an exclusive lease; an exclusive lease needs one nobody holds", n, sel)
	case n > 0 && none.Cause == lease.CauseExclusive:
		msg = fmt.Sprintf("each of the %d healthy proxies matching selector %v is held by an exclusive lease", n, sel)
	case n > 0:
		msg = fmt.Sprintf("all %d healthy proxies matching selector %v are cooling down for target %q", n, sel, broker.NormalizeTarget(req.Target))
	}
	return writeError(w, http.StatusServiceUnavailable, CodeNoProxyAvailable, msg)
}

func (s *Server) getLease(w http.ResponseWriter, r *http.Request, ps httprouter.Params) int {
	granted, err := s.broker.Get(r.Context(), tenantOf(r.Context()), ps.ByName("id"))
	if err != nil {
		return leaseError(r.Context(), w, ps.ByName("id"), err)
	}
	return writeJSON(w, http.StatusOK, s.leaseView(r.Context(), granted))
}

func (s *Server) releaseLease(w http.ResponseWriter, r *http.Request, ps httprouter.Params) int {
	// Only its holder ends a lease; one gone already (or another tenant's,
	// which this one cannot tell apart) is released all the same.
	if err := s.broker.Release(r.Context(), tenantOf(r.Context()), ps.ByName("id")); err != nil {
		return storeUnavailable(r.Context(), w, err)
	}
	w.WriteHeader(http.StatusNoContent)
	return http.StatusNoContent
}

// renewRequest is the (optional) body of POST /v1/leases/{id}/renew.
type renewRequest struct {
	TTLSeconds *int64 `json:"ttlSeconds"`
}

func (s *Server) renewLease(w http.ResponseWriter, r *http.Request, ps httprouter.Params) int {
	var req renewRequest
	if r.ContentLength != 0 {
		if status, code, err := decode(w, r, &req); err != nil {
			return writeError(w, status, code, err.Error())
		}
	}
	ttl, err := s.ttl(req.TTLSeconds)
	if err != nil {
		return writeError(w, http.StatusBadRequest, CodeInvalidRequest, err.Error())
	}
	granted, err := s.broker.Renew(r.Context(), tenantOf(r.Context()), ps.ByName("id"), ttl)
	var gone *broker.UnavailableError
	if errors.As(err, &gone) {
		return writeError(w, http.StatusConflict, CodeProxyUnavailable, gone.Error())
	}
	if err != nil {
		return leaseError(r.Context(), w, ps.ByName("id"), err)
	}
	return writeJSON(w, http.StatusOK, s.leaseView(r.Context(), granted))
}

// reportRequest is the body of POST /v1/leases/{id}/report.
type reportRequest struct {
	Result            string `json:"result"`
	Target            string `json:"target"`
	RetryAfterSeconds int64  `json:"retryAfterSeconds"`
}

func (s *Server) report(w http.ResponseWriter, r *http.Request, ps httprouter.Params) int {
	req, cooldown, status, code, err := s.decodeReport(w, r)
	if err != nil {
		return writeError(w, status, code, err.Error())
	}
	retryAfter := time.Duration(req.RetryAfterSeconds) * time.Second
	if err := s.broker.Report(r.Context(), tenantOf(r.Context()), ps.ByName("id"), req.Result, req.Target, cooldown, retryAfter); err != nil {
		return leaseError(r.Context(), w, ps.ByName("id"), err)
	}
	reportsTotal.WithLabelValues(req.Result).Inc()
	w.WriteHeader(http.StatusNoContent)
	return http.StatusNoContent
}

// reportSession takes a report on a gateway session's requests: a target
// is required, since a session's route is per host.
func (s *Server) reportSession(w http.ResponseWriter, r *http.Request, ps httprouter.Params) int {
	session := ps.ByName("session")
	if !broker.ValidSessionName(session) {
		return writeError(w, http.StatusBadRequest, CodeInvalidRequest, fmt.Sprintf("session %q must be 1-64 letters, digits, '-' or '_'", session))
	}
	req, cooldown, status, code, err := s.decodeReport(w, r)
	if err == nil && req.Target == "" {
		status, code, err = http.StatusBadRequest, CodeInvalidRequest, errors.New("target is required: a session's route is per host")
	}
	if err != nil {
		return writeError(w, status, code, err.Error())
	}
	err = s.broker.ReportSession(r.Context(), tenantOf(r.Context()), session, req.Result, req.Target, cooldown,
		time.Duration(req.RetryAfterSeconds)*time.Second)
	switch {
	case errors.Is(err, lease.ErrSessionNotFound):
		return writeError(w, http.StatusNotFound, CodeSessionNotFound,
			fmt.Sprintf("no gateway session %q has tunnelled lately (it never did, or was idle past its time)", session))
	case err != nil:
		return storeUnavailable(r.Context(), w, err)
	}
	reportsTotal.WithLabelValues(req.Result).Inc()
	w.WriteHeader(http.StatusNoContent)
	return http.StatusNoContent
}

// decodeReport reads and checks a report's body; cooldown is what a
// rate_limited report sets.
func (s *Server) decodeReport(w http.ResponseWriter, r *http.Request) (req reportRequest, cooldown time.Duration, status int, code string, err error) {
	if status, code, err := decode(w, r, &req); err != nil {
		return req, 0, status, code, err
	}
	switch req.Result {
	case lease.ResultOK, lease.ResultError:
		err = broker.ValidateTarget(req.Target, false)
	case lease.ResultRateLimited, lease.ResultBlocked:
		err = broker.ValidateTarget(req.Target, true)
	default:
		err = fmt.Errorf("result must be one of %s, %s, %s, %s; got %q", lease.ResultOK, lease.ResultError, lease.ResultRateLimited, lease.ResultBlocked, req.Result)
	}
	if err == nil && (req.RetryAfterSeconds < 0 || time.Duration(req.RetryAfterSeconds)*time.Second > MaxReportRetryAfter) {
		err = fmt.Errorf("retryAfterSeconds must be between 0 and %d, got %d", int64(MaxReportRetryAfter/time.Second), req.RetryAfterSeconds)
	}
	if err != nil {
		return req, 0, http.StatusBadRequest, CodeInvalidRequest, err
	}
	return req, reportCooldown(req, s.opts.DefaultCooldown, s.opts.Politeness.Adaptive), 0, "", nil
}

// reportCooldown is how long a report keeps its proxy off its target:
// with adaptive pacing, a push-back for as long as the site's Retry-After
// said, when it said (the host's learned pace slows every proxy
// meanwhile); otherwise, and for a block, the default cooldown, or the
// Retry-After if longer (nothing else would slow the host).
func reportCooldown(req reportRequest, def time.Duration, adaptive bool) time.Duration {
	retryAfter := time.Duration(req.RetryAfterSeconds) * time.Second
	if adaptive && req.Result == lease.ResultRateLimited && retryAfter > 0 {
		return retryAfter
	}
	return max(def, retryAfter)
}

// leaseView shows a lease with its proxy as it is now; a proxy deleted since
// shows its id only, and healthy false.
func (s *Server) leaseView(ctx context.Context, l lease.Lease) leaseResponse {
	info, ok := s.opts.View.Lookup(l.ProxyID, l.ProxyLeases)
	if !ok {
		info = broker.ProxyInfo{ID: l.ProxyID, Attributes: map[string]string{}}
	}
	s.withCredentials(ctx, &info, &l)
	resp := leaseResponse{LeaseID: l.ID, Proxy: info, Target: l.Target, ExpiresAt: l.ExpiresAt.UTC(), State: LeaseActive, Why: l.Why, Exclusive: l.Exclusive}
	if why := s.opts.View.Unavailable(l.ProxyID); why != "" {
		resp.State, resp.Reason = LeaseProxyUnavailable, why
	}
	return resp
}

func (s *Server) ttl(seconds *int64) (time.Duration, error) {
	if seconds == nil {
		return min(s.opts.DefaultTTL, s.opts.MaxTTL), nil
	}
	if *seconds < 1 {
		return 0, fmt.Errorf("ttlSeconds must be at least 1, got %d", *seconds)
	}
	// Capped rather than refused: the response's expiresAt tells the truth.
	if *seconds > int64(s.opts.MaxTTL/time.Second) {
		return s.opts.MaxTTL, nil
	}
	return time.Duration(*seconds) * time.Second, nil
}
