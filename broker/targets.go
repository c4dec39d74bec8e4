package broker

import (
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/example/egress-proxies-operator/lease"
)

// NormalizeTarget compares targets as hosts: case, a trailing dot and a port
// are ignored, so Example.COM.:443 cools down with example.com.
func NormalizeTarget(target string) string {
	if host, _, err := net.SplitHostPort(target); err == nil {
		target = host
	}
	target = strings.TrimSuffix(strings.Trim(target, "[]"), ".")
	return strings.ToLower(target)
}

// ValidateTarget checks a request's target site: a host name, at most 253
// characters.
func ValidateTarget(target string, required bool) error {
	switch {
	case target == "" && required:
		return fmt.Errorf("target is required when result is %s or %s", lease.ResultRateLimited, lease.ResultBlocked)
	case len(target) > 253:
		return errors.New("target is longer than 253 characters")
	case strings.ContainsAny(target, " /\t\n\r"):
		return fmt.Errorf("target must be a host name such as example.com, got %q", target)
	}
	return nil
}
