package discovery

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"

	"github.com/example/egress-proxies-operator/broker"
	"github.com/example/egress-proxies-operator/credentials"
	"github.com/example/egress-proxies-operator/kubeauth"
	"github.com/example/egress-proxies-operator/lease"
	"github.com/example/egress-proxies-operator/tenant"
)

// The values of --discovery-auth.
const (
	// AuthRequired: every client presents a token (the default).
	AuthRequired = "required"
	// AuthNone: the API serves unauthenticated and hands out no proxy
	// credentials; the gateway refuses everyone.
	AuthNone = "none"
)

// Config is the discovery API's flags: where it listens, its leases and
// cooldowns, who may use it and where its ledger goes. The lease store's
// are its own (package leasestore).
type Config struct {
	Addr            string
	MaxTTL          time.Duration
	Cooldown        time.Duration
	AdaptivePacing  bool
	TokenSecret     string
	Auth            string
	TenantAudience  string
	TenantReviewTTL time.Duration
	LedgerFile      string
	LedgerRetention time.Duration
	UsageRetention  time.Duration
}

// AddFlags registers the discovery API's flags.
func (c *Config) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Addr, "discovery-bind-address", ":8090",
		"Address the discovery API binds to; \"0\" disables it.")
	fs.DurationVar(&c.MaxTTL, "lease-max-ttl", broker.DefaultMaxTTL,
		"Longest lease the discovery API grants; longer requests are capped.")
	fs.DurationVar(&c.Cooldown, "rate-limit-cooldown", broker.DefaultCooldown,
		"How long a proxy reported rate_limited for a target is not leased for it (a longer retryAfterSeconds wins).")
	fs.BoolVar(&c.AdaptivePacing, "adaptive-pacing", true,
		"Pace each host by what its push-backs taught (429 or 503 reported through the API, or seen by the gateway on plain HTTP): slower on push-back, faster slowly without.")
	fs.StringVar(&c.TokenSecret, "discovery-token-secret", "",
		"namespace/name of the Secret whose key \"token\" is the discovery API's bearer token. Default: discovery-token in the operator's namespace. The operator creates it with a random token when it is missing.")
	fs.StringVar(&c.Auth, "discovery-auth", AuthRequired,
		"required: the discovery API and the gateway ask every client for a token (a missing or empty token Secret refuses everyone); none: the API serves unauthenticated and hands out no proxy credentials, and the gateway refuses everyone.")
	fs.StringVar(&c.TenantAudience, "tenant-audience", tenant.DefaultAudience,
		"Audience a crawler team's ServiceAccount token must be issued for: such a token is accepted beside the discovery token, and RBAC (create on proxypools/lease, proxies/lease) says which proxies it may lease. Empty: the discovery token only.")
	fs.DurationVar(&c.TenantReviewTTL, "tenant-review-ttl", kubeauth.DefaultReviewTTL,
		"How long the API server's answers on a ServiceAccount token and on what it may lease are reused: a revoked RoleBinding or a deleted ServiceAccount stops leases within it.")
	fs.StringVar(&c.LedgerFile, "ledger-file", "",
		"File the ledger (every lease and gateway tunnel: tenant, session, proxy, exit IP, target, start, end, bytes) is appended to as JSON lines. Empty: the operator's log, under the logger \"ledger\".")
	fs.DurationVar(&c.LedgerRetention, "ledger-retention", lease.DefaultLedgerRetention,
		"How long the lease store keeps ledger records for GET /v1/attribution (the memory store keeps at most the last 50000).")
	fs.DurationVar(&c.UsageRetention, "usage-retention", lease.DefaultUsageRetention,
		"How long the lease store keeps each day's usage (per tenant, host and provider instance) for GET /v1/usage after the day ends.")
}

// Enabled says whether the flags ask for the discovery API.
func (c *Config) Enabled() bool { return c.Addr != "" && c.Addr != "0" }

// Validate checks the discovery API's flags (a bind address is the
// caller's to check, with the others).
func (c *Config) Validate() error {
	var errs []error
	if c.MaxTTL < time.Second || c.MaxTTL > credentials.MaxLifetime || c.Cooldown < 0 {
		errs = append(errs, fmt.Errorf("--lease-max-ttl must be from 1s to %s (the longest a proxy takes a lease's credentials), and --rate-limit-cooldown not negative", credentials.MaxLifetime))
	}
	if c.Auth != AuthRequired && c.Auth != AuthNone {
		errs = append(errs, fmt.Errorf("--discovery-auth must be %s or %s, got %q", AuthRequired, AuthNone, c.Auth))
	}
	if c.TokenSecret != "" {
		if ns, name, ok := strings.Cut(c.TokenSecret, "/"); !ok || ns == "" || name == "" {
			errs = append(errs, fmt.Errorf("--discovery-token-secret %q must be namespace/name", c.TokenSecret))
		}
	}
	if c.TenantReviewTTL <= 0 {
		errs = append(errs, fmt.Errorf("--tenant-review-ttl must be positive, got %s", c.TenantReviewTTL))
	}
	if c.UsageRetention <= 0 {
		errs = append(errs, fmt.Errorf("--usage-retention must be positive, got %s", c.UsageRetention))
	}
	if c.LedgerRetention <= 0 {
		errs = append(errs, fmt.Errorf("--ledger-retention must be positive, got %s", c.LedgerRetention))
	}
	return errors.Join(errs...)
}

// TokenSecretKey is the token Secret: --discovery-token-secret, or
// discovery-token in operatorNamespace.
func (c *Config) TokenSecretKey(operatorNamespace string) types.NamespacedName {
	if ns, name, ok := strings.Cut(c.TokenSecret, "/"); ok {
		return types.NamespacedName{Namespace: ns, Name: name}
	}
	return types.NamespacedName{Namespace: operatorNamespace, Name: "discovery-token"}
}

// Tenants says whether crawler teams' ServiceAccount tokens are accepted.
func (c *Config) Tenants() bool { return c.Auth == AuthRequired && c.TenantAudience != "" }

// OpenLedger is where ledger records are written: --ledger-file, opened
// for appending (and created), or log.
func (c *Config) OpenLedger(log logr.Logger) (lease.LedgerSink, error) {
	if c.LedgerFile == "" {
		return lease.LogSink{Log: log}, nil
	}
	f, err := os.OpenFile(c.LedgerFile, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening --ledger-file: %w", err)
	}
	return lease.NewJSONLines(f, log), nil
}
