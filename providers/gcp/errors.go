package gcp

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/api/googleapi"

	"github.com/example/egress-proxies-operator/providers"
)

// The Compute API's errors as the provider error kinds the reconciler
// acts on.

// classify maps an API error to the provider error kinds: 404 not found; 429,
// 5xx, timeouts and transport errors transient; other 4xx terminal, with the
// API's message, and quota errors named as such.
func classify(err error) error {
	var gerr *googleapi.Error
	switch {
	case errors.As(err, &gerr) && gerr.Code == http.StatusNotFound:
		return fmt.Errorf("%w: %w", providers.ErrNotFound, err)
	case errors.As(err, &gerr) && (gerr.Code == http.StatusTooManyRequests || gerr.Code >= 500 || isRateLimit(gerr)):
		return providers.Transient(err)
	case errors.As(err, &gerr) && isQuota(gerr):
		return providers.Quota("quota exceeded: %s", gerr.Message)
	case errors.As(err, &gerr):
		return providers.Terminal("%s (HTTP %d)", gerr.Message, gerr.Code)
	default:
		return providers.Transient(err)
	}
}

func isNotFound(err error) bool {
	var gerr *googleapi.Error
	return errors.As(err, &gerr) && gerr.Code == http.StatusNotFound
}

func isAlreadyExists(err error) bool {
	var gerr *googleapi.Error
	return errors.As(err, &gerr) && gerr.Code == http.StatusConflict
}

func isQuota(gerr *googleapi.Error) bool {
	for _, item := range gerr.Errors {
		if strings.Contains(strings.ToLower(item.Reason), "quota") {
			return true
		}
	}
	return strings.Contains(strings.ToLower(gerr.Message), "quota")
}

func isRateLimit(gerr *googleapi.Error) bool {
	for _, item := range gerr.Errors {
		if item.Reason == "rateLimitExceeded" || item.Reason == "userRateLimitExceeded" {
			return true
		}
	}
	return false
}

// capacityCodes are the insert operation errors of a zone without room:
// another zone, or a standard VM for a Spot one, may have it.
var capacityCodes = []string{"ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", "RESOURCE_POOL_EXHAUSTED"}

// operationError reports a failed insert operation; GCE returns it again for
// every retry with the same requestId, so it is terminal until the spec
// changes.
func operationError(name string, opErr *computepb.Error) error {
	var msgs []string
	quota, capacity := false, false
	for _, e := range opErr.GetErrors() {
		msgs = append(msgs, e.GetCode()+": "+e.GetMessage())
		quota = quota || strings.Contains(e.GetCode(), "QUOTA")
		capacity = capacity || slices.Contains(capacityCodes, e.GetCode())
	}
	switch {
	case quota:
		return providers.Quota("quota exceeded creating VM %s: %s", name, strings.Join(msgs, "; "))
	case capacity:
		return providers.Capacity("no capacity for VM %s: %s", name, strings.Join(msgs, "; "))
	}
	return providers.Terminal("creating VM %s failed: %s", name, strings.Join(msgs, "; "))
}
