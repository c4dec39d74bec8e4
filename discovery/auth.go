package discovery

import (
	"context"
	"crypto/subtle"
	"errors"
	"net/http"
	"strings"

	"github.com/julienschmidt/httprouter"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/example/egress-proxies-operator/broker"
	"github.com/example/egress-proxies-operator/operator"
	"github.com/example/egress-proxies-operator/tenant"
	"github.com/example/egress-proxies-operator/tracing"
)

// TokenSource supplies the bearer token. required false means the API was
// configured to serve unauthenticated (--discovery-auth=none), and then
// never hands out proxy credentials; required with an empty token means the
// token is missing, and every request is refused until it is there.
type TokenSource interface {
	Token() (token string, required bool)
}

// Auth states, as the proxy_operator_discovery_auth_enabled metric does not
// tell them apart: open (--discovery-auth=none), enforced, locked (the
// token Secret is missing or empty).
const (
	authUnknown int32 = iota - 1
	authOpen
	authEnforced
	authLocked
)

// handle is an API handler that returns the status it answered with.
type handle func(w http.ResponseWriter, r *http.Request, ps httprouter.Params) int

// authed wraps a handler with bearer-token auth and metrics.
func (s *Server) authed(route string, h handle) httprouter.Handle {
	return func(w http.ResponseWriter, r *http.Request, ps httprouter.Params) {
		start := s.opts.Clock.Now()
		token, required := s.opts.Tokens.Token()
		state := authStateOf(token, required)
		s.noteAuth(r.Context(), state)
		if state == authLocked {
			// Locked: nobody is let in, whatever token they hold, as the
			// gateway refuses everyone (Authorize).
			setRetryAfter(w, broker.LockedRetryAfter)
			s.count(route, writeError(w, http.StatusServiceUnavailable, CodeLocked,
				"the discovery token Secret is missing or its key is empty: the API and the gateway refuse every client, ServiceAccount tokens included, until a token is there (the operator recreates a deleted Secret; an emptied key stays so until someone writes a token)"),
				s.opts.Clock.Since(start))
			return
		}
		if required {
			got, _ := bearerToken(r.Header.Get("Authorization"))
			t, err := s.identify(tenant.WithClient(r.Context(), r.RemoteAddr), got, token)
			if err != nil {
				logf.FromContext(r.Context()).Error(err, "could not review a bearer token")
				setRetryAfter(w, retryAfterStoreUnavailable)
				s.count(route, writeError(w, http.StatusServiceUnavailable, CodeAuthUnavailable,
					"the API server could not review the bearer token; retry after Retry-After seconds"), s.opts.Clock.Since(start))
				return
			}
			if t == nil {
				msg := "a valid bearer token is required (Authorization: Bearer <token>): the discovery token, or a ServiceAccount token for the operator's audience"
				w.Header().Set("WWW-Authenticate", `Bearer realm="egress-proxies-operator"`)
				s.count(route, writeError(w, http.StatusUnauthorized, CodeUnauthorized, msg), s.opts.Clock.Since(start))
				return
			}
			r = r.WithContext(withTenant(r.Context(), t))
		}
		// A span per call, in the trace the client's traceparent names:
		// the handlers add what they did (a lease's proxy and host).
		ctx, span := tracing.Tracer(tracerName).Start(tracing.FromRequest(r),
			r.Method+" "+route, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(tracing.KeyTenant.String(tenantOf(r.Context()).Name)))
		status := h(w, r.WithContext(ctx), ps)
		span.SetAttributes(semconv.HTTPResponseStatusCode(status))
		if status >= http.StatusInternalServerError {
			span.SetStatus(codes.Error, http.StatusText(status))
		}
		span.End()
		s.count(route, status, s.opts.Clock.Since(start))
	}
}

// tracerName names the discovery API's spans' instrumentation scope.
const tracerName = "github.com/example/egress-proxies-operator/discovery"

// identify is who presents got: the Platform tenant for the discovery
// token (want; never when it is missing), a ServiceAccount's tenant for a
// token the API server issued for the operator's audience, nil for
// anything else.
func (s *Server) identify(ctx context.Context, got, want string) (*tenant.Tenant, error) {
	switch {
	case got == "":
		return nil, nil
	case want != "" && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1:
		return tenant.Platform, nil
	case s.opts.Tenants == nil:
		return nil, nil
	}
	return s.opts.Tenants.Identify(ctx, got)
}

// bearerToken reads an Authorization header of the Bearer scheme, whose name
// is case-insensitive (RFC 9110), trimmed of surrounding whitespace.
func bearerToken(header string) (string, bool) {
	scheme, token, ok := strings.Cut(strings.TrimSpace(header), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

func authStateOf(token string, required bool) int32 {
	switch {
	case !required:
		return authOpen
	case token == "":
		return authLocked
	}
	return authEnforced
}

// plain wraps an unauthenticated handler with metrics.
func (s *Server) plain(route string, h httprouter.Handle) httprouter.Handle {
	return func(w http.ResponseWriter, r *http.Request, ps httprouter.Params) {
		start := s.opts.Clock.Now()
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		h(rec, r, ps)
		s.count(route, rec.status, s.opts.Clock.Since(start))
	}
}

// noteAuth keeps the auth metrics current and logs a change: serving
// unauthenticated is a warning, a lost token an error.
func (s *Server) noteAuth(ctx context.Context, state int32) {
	old := s.authState.Swap(state)
	if old == state {
		return
	}
	authEnabled.Set(boolGauge(state != authOpen))
	authLockedGauge.Set(boolGauge(state == authLocked))
	log := logf.FromContext(ctx).WithName("discovery")
	switch state {
	case authOpen:
		operator.Warn(log, "--discovery-auth=none: the discovery API serves UNAUTHENTICATED and hands out no proxy credentials")
	case authLocked:
		log.Error(errors.New("discovery token missing"),
			"the discovery token Secret is missing or has no token key: the API refuses every request until a token is there")
	case authEnforced:
		if old != authUnknown {
			log.Info("discovery API authentication enforced")
		}
	}
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

type tenantKey struct{}

// withTenant is ctx carrying the request's tenant.
func withTenant(ctx context.Context, t *tenant.Tenant) context.Context {
	return context.WithValue(ctx, tenantKey{}, t)
}

// tenantOf is the request's tenant (Anonymous when the API is open).
func tenantOf(ctx context.Context) *tenant.Tenant {
	if t, ok := ctx.Value(tenantKey{}).(*tenant.Tenant); ok {
		return t
	}
	return tenant.Anonymous
}
