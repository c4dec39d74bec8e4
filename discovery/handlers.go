package discovery

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"time"

	"github.com/julienschmidt/httprouter"

	"github.com/example/egress-proxies-operator/lease"
)

func (s *Server) listProxies(w http.ResponseWriter, r *http.Request, _ httprouter.Params) int {
	sel, healthy, err := parseListQuery(r.URL.RawQuery)
	if err != nil {
		return writeError(w, http.StatusBadRequest, CodeInvalidRequest, err.Error())
	}
	proxies, err := s.visible(r.Context(), s.opts.View.list(sel, healthy))
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
	ProxyInfo
	// Outcomes are its records by host (discovery.HostRecord): served and
	// blocked outcomes, weights halving every OutcomeHalfLife.
	Outcomes []lease.HostRecord `json:"outcomes"`
}

func (s *Server) getProxy(w http.ResponseWriter, r *http.Request, ps httprouter.Params) int {
	id := ps.ByName("namespace") + "/" + ps.ByName("name")
	info, ok := s.opts.View.lookup(id, 0)
	if ok {
		shown, err := s.visible(r.Context(), []ProxyInfo{info})
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
	Selector   Selector `json:"selector"`
	TTLSeconds *int64   `json:"ttlSeconds"`
	Target     string   `json:"target"`
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
	LeaseID   string    `json:"leaseID"`
	Proxy     ProxyInfo `json:"proxy"`
	Target    string    `json:"target,omitempty"`
	ExpiresAt time.Time `json:"expiresAt"`
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
	// (discovery.Why*): least-loaded, then the fewest recent blocks by the
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
		err = validateSelector("selector", req.Selector)
	}
	if err == nil {
		err = validateTarget(req.Target, false)
	}
	if err == nil && (req.MaxWaitSeconds < 0 || req.MaxWaitSeconds > MaxLeaseWait.Seconds() || math.IsNaN(req.MaxWaitSeconds)) {
		err = fmt.Errorf("maxWaitSeconds must be between 0 and %d, got %v", int(MaxLeaseWait.Seconds()), req.MaxWaitSeconds)
	}
	if err != nil {
		return writeError(w, http.StatusBadRequest, CodeInvalidRequest, err.Error())
	}
	req.Target = normalizeTarget(req.Target)
	t := tenantOf(r.Context())
	candidates, err := s.leasableCandidates(r.Context(), t, s.opts.View.candidates(req.Selector))
	if err != nil {
		return authUnavailable(r.Context(), w, err)
	}
	acquire := s.acquireRequest(candidates, req.Target, ttl, time.Duration(req.MaxWaitSeconds*float64(time.Second)))
	acquire.Holder, acquire.Limit, acquire.Exclusive = t.Name, s.limitFor(t, LimitLeases), req.Exclusive
	granted, err := s.store.Acquire(r.Context(), acquire)
	var quota *QuotaError
	if errors.As(s.quotaError(t, LimitLeases, err), &quota) {
		setRetryAfter(w, max(quota.RetryAfter, time.Second))
		return writeError(w, http.StatusTooManyRequests, CodeQuotaExceeded, quota.Error())
	}
	notePaced(err, granted.Wait)
	var none *lease.NoProxyAvailableError
	if errors.As(err, &none) && none.Paced() {
		setRetryAfter(w, none.RetryAfter)
		return writeError(w, http.StatusTooManyRequests, CodeTargetPaced, fmt.Sprintf(
			"the politeness for target %q allows none of the %d healthy proxies matching selector %v a request within %gs (%s); retry after Retry-After seconds or send a longer maxWaitSeconds",
			req.Target, len(candidates.IDs), map[string]string(req.Selector), req.MaxWaitSeconds, none.Error()))
	}
	if errors.As(err, &none) {
		s.noteRefused(r.Context(), t, req.Selector)
		retry := retryAfterNoProxyBase
		if none.RetryAfter > 0 && len(candidates.IDs) > 0 {
			retry = none.RetryAfter
		}
		setRetryAfter(w, retry)
		msg := fmt.Sprintf("no healthy proxy matches selector %v", map[string]string(req.Selector))
		switch {
		case len(candidates.IDs) > 0 && none.Cause == lease.CauseExclusive && req.Exclusive:
			msg = fmt.Sprintf("each of the %d healthy proxies matching selector %v is in use or held by an exclusive lease; an exclusive lease needs one nobody holds",
				len(candidates.IDs), map[string]string(req.Selector))
		case len(candidates.IDs) > 0 && none.Cause == lease.CauseExclusive:
			msg = fmt.Sprintf("each of the %d healthy proxies matching selector %v is held by an exclusive lease", len(candidates.IDs), map[string]string(req.Selector))
		case len(candidates.IDs) > 0:
			msg = fmt.Sprintf("all %d healthy proxies matching selector %v are cooling down for target %q", len(candidates.IDs), map[string]string(req.Selector), req.Target)
		}
		return writeError(w, http.StatusServiceUnavailable, CodeNoProxyAvailable, msg)
	}
	if err != nil {
		return storeUnavailable(r.Context(), w, err)
	}
	// Only the answer that creates a lease says how it was paced: both
	// stores know it then, and a paced lease covers that one request.
	s.record(r.Context(), lease.LedgerLease, lease.LedgerStart, granted, "", granted.ExpiresAt, 0)
	view := s.leaseView(r.Context(), granted)
	view.Paced = granted.Paced
	if granted.Wait > 0 {
		next := granted.CreatedAt.Add(granted.Wait).UTC()
		view.NextRequestAt = &next
	}
	return writeJSON(w, http.StatusCreated, view)
}

func (s *Server) getLease(w http.ResponseWriter, r *http.Request, ps httprouter.Params) int {
	granted, err := s.heldLease(r.Context(), ps.ByName("id"))
	if err != nil {
		return leaseError(r.Context(), w, ps.ByName("id"), err)
	}
	return writeJSON(w, http.StatusOK, s.leaseView(r.Context(), granted))
}

func (s *Server) releaseLease(w http.ResponseWriter, r *http.Request, ps httprouter.Params) int {
	// Only its holder ends a lease; one gone already (or another tenant's,
	// which this one cannot tell apart) is released all the same.
	granted, err := s.heldLease(r.Context(), ps.ByName("id"))
	switch {
	case errors.Is(err, lease.ErrLeaseNotFound):
		w.WriteHeader(http.StatusNoContent)
		return http.StatusNoContent
	case err != nil:
		return storeUnavailable(r.Context(), w, err)
	}
	if err := s.store.Release(r.Context(), granted.ID); err != nil {
		return storeUnavailable(r.Context(), w, err)
	}
	s.revoke(r.Context(), granted)
	s.record(r.Context(), lease.LedgerLease, lease.LedgerEnd, granted, "", s.opts.Clock.Now(), 0)
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
	granted, err := s.heldLease(r.Context(), ps.ByName("id"))
	if err != nil {
		return leaseError(r.Context(), w, ps.ByName("id"), err)
	}
	// A lease on a proxy that went away is not extended: the client should
	// lease another. The lease itself lives on until its TTL, so a report
	// on it (a cooldown worth keeping) is still accepted.
	if why := s.opts.View.unavailable(granted.ProxyID); why != "" {
		return writeError(w, http.StatusConflict, CodeProxyUnavailable,
			fmt.Sprintf("lease %q is not renewed: %s; release it and lease another", granted.ID, why))
	}
	if granted, err = s.store.Renew(r.Context(), granted.ID, ttl); err != nil {
		return leaseError(r.Context(), w, ps.ByName("id"), err)
	}
	s.record(r.Context(), lease.LedgerLease, lease.LedgerRenew, granted, "", granted.ExpiresAt, 0)
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
	target := normalizeTarget(req.Target)
	if !tenantOf(r.Context()).All() {
		if _, err := s.heldLease(r.Context(), ps.ByName("id")); err != nil {
			return leaseError(r.Context(), w, ps.ByName("id"), err)
		}
	}
	if err := s.store.Report(r.Context(), ps.ByName("id"), req.Result, target, cooldown); err != nil {
		return leaseError(r.Context(), w, ps.ByName("id"), err)
	}
	reportsTotal.WithLabelValues(req.Result).Inc()
	if req.Result == lease.ResultRateLimited {
		s.pushBack(r.Context(), target, time.Duration(req.RetryAfterSeconds)*time.Second)
	}
	w.WriteHeader(http.StatusNoContent)
	return http.StatusNoContent
}

// reportSession takes a report on a gateway session's requests: a target
// is required, since a session's route is per host.
func (s *Server) reportSession(w http.ResponseWriter, r *http.Request, ps httprouter.Params) int {
	session := ps.ByName("session")
	if !ValidSessionName(session) {
		return writeError(w, http.StatusBadRequest, CodeInvalidRequest, fmt.Sprintf("session %q must be 1-64 letters, digits, '-' or '_'", session))
	}
	req, cooldown, status, code, err := s.decodeReport(w, r)
	if err == nil && req.Target == "" {
		status, code, err = http.StatusBadRequest, CodeInvalidRequest, errors.New("target is required: a session's route is per host")
	}
	if err != nil {
		return writeError(w, status, code, err.Error())
	}
	target := normalizeTarget(req.Target)
	who := tenantOf(r.Context())
	key := SessionKey(who, session)
	proxy, err := s.store.ReportSession(r.Context(), key, who.Name, req.Result, target, cooldown, SessionReportWindow)
	switch {
	case errors.Is(err, lease.ErrSessionNotFound):
		return writeError(w, http.StatusNotFound, CodeSessionNotFound,
			fmt.Sprintf("no gateway session %q has tunnelled lately (it never did, or was idle past its time)", session))
	case err != nil:
		return storeUnavailable(r.Context(), w, err)
	}
	reportsTotal.WithLabelValues(req.Result).Inc()
	if req.Result == lease.ResultRateLimited {
		s.pushBack(r.Context(), target, time.Duration(req.RetryAfterSeconds)*time.Second)
	}
	s.listeners.notify(SessionReport{Session: key, Target: target, Result: req.Result, Proxy: proxy})
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
		err = validateTarget(req.Target, false)
	case lease.ResultRateLimited, lease.ResultBlocked:
		err = validateTarget(req.Target, true)
	default:
		err = fmt.Errorf("result must be one of %s, %s, %s, %s; got %q", lease.ResultOK, lease.ResultError, lease.ResultRateLimited, lease.ResultBlocked, req.Result)
	}
	if err == nil && (req.RetryAfterSeconds < 0 || time.Duration(req.RetryAfterSeconds)*time.Second > MaxReportRetryAfter) {
		err = fmt.Errorf("retryAfterSeconds must be between 0 and %d, got %d", int64(MaxReportRetryAfter/time.Second), req.RetryAfterSeconds)
	}
	if err != nil {
		return req, 0, http.StatusBadRequest, CodeInvalidRequest, err
	}
	return req, max(s.opts.DefaultCooldown, time.Duration(req.RetryAfterSeconds)*time.Second), 0, "", nil
}

// leaseView shows a lease with its proxy as it is now; a proxy deleted since
// shows its id only, and healthy false.
func (s *Server) leaseView(ctx context.Context, l lease.Lease) leaseResponse {
	info, ok := s.opts.View.lookup(l.ProxyID, l.ProxyLeases)
	if !ok {
		info = ProxyInfo{ID: l.ProxyID, Attributes: map[string]string{}}
	}
	s.withCredentials(ctx, &info, &l)
	resp := leaseResponse{LeaseID: l.ID, Proxy: info, Target: l.Target, ExpiresAt: l.ExpiresAt.UTC(), State: LeaseActive, Why: l.Why, Exclusive: l.Exclusive}
	if why := s.opts.View.unavailable(l.ProxyID); why != "" {
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
