package discovery

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/example/egress-proxies-operator/broker"
	"github.com/example/egress-proxies-operator/lease"
)

// decode reads a size-limited JSON body strictly: unknown fields and
// trailing data are errors naming what was wrong. The Content-Type header is
// not checked: `curl -d` sends application/x-www-form-urlencoded, and the
// body itself must be JSON whatever the header says.
func decode(w http.ResponseWriter, r *http.Request, into any) (int, string, error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		return http.StatusRequestEntityTooLarge, CodeBodyTooLarge, fmt.Errorf("request body is larger than %d bytes", MaxBodyBytes)
	}
	if err != nil {
		return http.StatusBadRequest, CodeInvalidJSON, fmt.Errorf("reading the request body: %w", err)
	}
	return decodeJSON(body, into)
}

// decodeJSON is decode without the transport: the part the fuzz test drives.
func decodeJSON(body []byte, into any) (int, string, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(into); err != nil {
		var syntax *json.SyntaxError
		var typeErr *json.UnmarshalTypeError
		switch {
		case errors.As(err, &typeErr):
			return http.StatusBadRequest, CodeInvalidRequest, fmt.Errorf("field %s must be a %s, got %s", typeErr.Field, typeErr.Type, typeErr.Value)
		case strings.HasPrefix(err.Error(), "json: unknown field "):
			return http.StatusBadRequest, CodeInvalidRequest, fmt.Errorf("unknown field %s", strings.TrimPrefix(err.Error(), "json: unknown field "))
		case errors.As(err, &syntax), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
			return http.StatusBadRequest, CodeInvalidJSON, fmt.Errorf("request body is not valid JSON: %w", err)
		default:
			return http.StatusBadRequest, CodeInvalidJSON, fmt.Errorf("request body: %w", err)
		}
	}
	if dec.More() {
		return http.StatusBadRequest, CodeInvalidJSON, errors.New("request body has data after the JSON object")
	}
	return 0, "", nil
}

// parseListQuery reads GET /v1/proxies' query: healthy=true|false, and every
// other parameter an attribute to match.
func parseListQuery(rawQuery string) (broker.Selector, *bool, error) {
	values, err := url.ParseQuery(rawQuery)
	if err != nil {
		return nil, nil, fmt.Errorf("query string: %w", err)
	}
	sel := broker.Selector{}
	var healthy *bool
	for k, vs := range values {
		if len(vs) != 1 {
			return nil, nil, fmt.Errorf("query parameter %q is given %d times; give it once", k, len(vs))
		}
		if k == "healthy" {
			b, err := strconv.ParseBool(vs[0])
			if err != nil {
				return nil, nil, fmt.Errorf("query parameter healthy must be true or false, got %q", vs[0])
			}
			healthy = &b
			continue
		}
		sel[k] = vs[0]
	}
	if err := broker.ValidateSelector("query parameter", sel); err != nil {
		return nil, nil, err
	}
	return sel, healthy, nil
}

type errorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func writeError(w http.ResponseWriter, status int, code, message string) int {
	var body errorBody
	body.Error.Code, body.Error.Message = code, message
	return writeJSON(w, status, body)
}

// leaseError answers a store error about one lease: 404 when the store
// says it is not live, 503 when the store did not answer.
func leaseError(ctx context.Context, w http.ResponseWriter, id string, err error) int {
	if errors.Is(err, lease.ErrLeaseNotFound) {
		return writeError(w, http.StatusNotFound, CodeLeaseNotFound, fmt.Sprintf("lease %q does not exist: it was released or expired (or, with the in-memory lease store, lost when the operator restarted)", id))
	}
	return storeUnavailable(ctx, w, err)
}

// authUnavailable answers 503 auth_unavailable: the API server did not say
// what the tenant may lease.
func authUnavailable(ctx context.Context, w http.ResponseWriter, err error) int {
	logf.FromContext(ctx).Error(err, "could not review what a tenant may lease")
	setRetryAfter(w, retryAfterStoreUnavailable)
	return writeError(w, http.StatusServiceUnavailable, CodeAuthUnavailable,
		"the API server could not say which proxies you may lease; retry after Retry-After seconds")
}

// storeUnavailable answers 503 store_unavailable with a Retry-After. The
// cause goes to the operator's log, not to the client: it names the
// store's address.
func storeUnavailable(ctx context.Context, w http.ResponseWriter, err error) int {
	logf.FromContext(ctx).Error(err, "the lease store did not answer")
	setRetryAfter(w, retryAfterStoreUnavailable)
	return writeError(w, http.StatusServiceUnavailable, CodeStoreUnavailable,
		"the lease store did not answer in time; retry after Retry-After seconds (the operator's log has the cause)")
}

func setRetryAfter(w http.ResponseWriter, d time.Duration) {
	w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(d.Seconds()))))
}

func writeJSON(w http.ResponseWriter, status int, v any) int {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
	return status
}
