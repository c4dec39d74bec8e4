package health

import (
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"time"
)

// Config is the health engine's flags: the probe defaults a Proxy's
// spec.healthCheck overrides, how many probes run at once, and the CAs
// probe targets are checked against.
type Config struct {
	Defaults Settings
	Workers  int
	// CABundle is a PEM file of CAs added to the system roots.
	CABundle string
	// CanaryInterval, CanaryHostInterval and EchoURL are Options'.
	CanaryInterval     time.Duration
	CanaryHostInterval time.Duration
	EchoURL            string
	// ShardProbes divides probing among the replicas (Options.Shard);
	// ShardLeaseDuration is each replica's Lease's (shard.Options).
	ShardProbes        bool
	ShardLeaseDuration time.Duration
	// MaxProbesPerSecond and IdleInterval are Options'.
	MaxProbesPerSecond float64
	IdleInterval       time.Duration
}

// AddFlags registers the engine's flags.
func (c *Config) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Defaults.URL, "health-probe-url", DefaultURL,
		"HTTPS URL fetched through every proxy to prove it can egress; a Proxy's spec.healthCheck.url overrides it.")
	fs.DurationVar(&c.Defaults.Interval, "health-interval", DefaultInterval, "Time between probes of one proxy.")
	fs.DurationVar(&c.Defaults.Timeout, "health-timeout", DefaultTimeout, "Time one probe may take.")
	fs.IntVar(&c.Defaults.FailureThreshold, "health-failure-threshold", DefaultFailureThreshold,
		"Consecutive failed probes that make a proxy Unhealthy.")
	fs.IntVar(&c.Defaults.SuccessThreshold, "health-success-threshold", DefaultSuccessThreshold,
		"Consecutive successful probes that make a proxy Healthy.")
	fs.IntVar(&c.Workers, "health-workers", DefaultWorkers, "Probes running at once.")
	fs.Float64Var(&c.MaxProbesPerSecond, "health-max-probes-per-second", 0,
		"Probes this replica starts each second at most (0: no bound). Each opens a connection that stays in the node's connection-tracking table for about 120s after it closes: the bound holds this replica's entries under 120 × it (twice that for Managed proxies, which are also checked for being open). Probes beyond it wait, and the last-probe metric shows them late.")
	fs.DurationVar(&c.IdleInterval, "health-idle-interval", 0,
		"How often a Healthy proxy without a live lease is probed, instead of every --health-interval (0: off, every proxy at its interval). The probing replica reads which proxies carry leases from the lease store once per --health-interval, so a proxy's first leases wait at most that long for probes at the full rate, and a gateway tunnel that cannot reach its proxy has it probed at once (at most once per 10s per proxy). Needs the discovery API. An idle proxy's verdict is up to this old.")
	fs.DurationVar(&c.CanaryInterval, "canary-interval", DefaultCanaryInterval,
		"How often each canary (spec.healthCheck.targets) is fetched through each proxy that passes its probes.")
	fs.DurationVar(&c.CanaryHostInterval, "canary-host-interval", DefaultCanaryHostInterval,
		"The least time between two canaries to one host, across the whole fleet.")
	fs.StringVar(&c.EchoURL, "egress-echo-url", "",
		"An http(s) URL that answers with the address a request came from (a bare IP, or JSON with \"ip\" or \"origin\"): probes that pass ask it through the proxy, every 10m, and record status.egressIP when it differs from the proxy's IP. Empty: not asked.")
	fs.BoolVar(&c.ShardProbes, "health-shard-probes", false,
		"Divide probing among the operator's replicas: each holds a coordination.k8s.io Lease in the operator's namespace and probes the proxies a rendezvous hash gives it; a replica that dies hands its share over within 1.4 --health-shard-lease-duration. Off: the leader probes every proxy.")
	fs.DurationVar(&c.ShardLeaseDuration, "health-shard-lease-duration", 10*time.Second,
		"With --health-shard-probes, how long a replica's Lease lasts unrenewed (whole seconds); it is renewed every fifth of it. A dead replica's share is taken up within 1.4 times this: keep that under --health-interval for a handover within one interval.")
	fs.StringVar(&c.CABundle, "health-ca-bundle", "",
		"PEM file of CAs trusted for probe targets, added to the system roots (for private probe targets).")
}

// Validate checks the engine's flags.
func (c *Config) Validate() error {
	var errs []error
	if u, err := url.Parse(c.Defaults.URL); err != nil || u.Scheme != "https" || u.Host == "" {
		errs = append(errs, fmt.Errorf("--health-probe-url %q must be an absolute https URL: the probe proves a TLS tunnel", c.Defaults.URL))
	}
	if c.Defaults.Interval <= 0 {
		errs = append(errs, fmt.Errorf("--health-interval must be positive, got %s", c.Defaults.Interval))
	}
	if c.Defaults.Timeout <= 0 {
		errs = append(errs, fmt.Errorf("--health-timeout must be positive, got %s", c.Defaults.Timeout))
	}
	if c.CanaryInterval < 10*time.Second || c.CanaryHostInterval < 0 {
		errs = append(errs, fmt.Errorf("--canary-interval must be at least 10s and --canary-host-interval not negative, got %s and %s", c.CanaryInterval, c.CanaryHostInterval))
	}
	if c.ShardProbes && (c.ShardLeaseDuration < 2*time.Second || c.ShardLeaseDuration%time.Second != 0) {
		errs = append(errs, fmt.Errorf("--health-shard-lease-duration must be whole seconds and at least 2s, got %s", c.ShardLeaseDuration))
	}
	if c.IdleInterval != 0 && c.IdleInterval <= c.Defaults.Interval {
		errs = append(errs, fmt.Errorf("--health-idle-interval must be 0 (off) or longer than --health-interval (%s), got %s", c.Defaults.Interval, c.IdleInterval))
	}
	if c.MaxProbesPerSecond < 0 {
		errs = append(errs, fmt.Errorf("--health-max-probes-per-second must not be negative, got %g", c.MaxProbesPerSecond))
	}
	if c.EchoURL != "" {
		if u, err := url.Parse(c.EchoURL); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			errs = append(errs, fmt.Errorf("--egress-echo-url %q must be an absolute http or https URL", c.EchoURL))
		}
	}
	for _, n := range []struct {
		flag  string
		value int
	}{{"health-failure-threshold", c.Defaults.FailureThreshold}, {"health-success-threshold", c.Defaults.SuccessThreshold}, {"health-workers", c.Workers}} {
		if n.value < 1 {
			errs = append(errs, fmt.Errorf("--%s must be at least 1, got %d", n.flag, n.value))
		}
	}
	return errors.Join(errs...)
}

// Roots is the system roots plus --health-ca-bundle (nil, the system
// roots, without one).
func (c *Config) Roots() (*x509.CertPool, error) {
	if c.CABundle == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(c.CABundle)
	if err != nil {
		return nil, fmt.Errorf("--health-ca-bundle: %w", err)
	}
	roots, err := x509.SystemCertPool()
	if err != nil {
		roots = x509.NewCertPool()
	}
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--health-ca-bundle %s: no PEM certificate in it", c.CABundle)
	}
	return roots, nil
}
