package gateway

import (
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/example/egress-proxies-operator/broker"
)

// AddFlags registers the gateway's flags on o. Addr defaults to "0": no
// gateway.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.Addr, "gateway-bind-address", "0",
		"Address the rotating gateway (an HTTP proxy crawlers point at: http://<session>:<discovery token>@<address>) listens on; \"0\" turns it off. Needs the discovery API.")
	fs.IntVar(&o.MaxTunnels, "gateway-max-tunnels", DefaultMaxTunnels,
		"Tunnels and plain requests the gateway carries at once; beyond it a client waits up to 2s, then gets 503 with Retry-After.")
	fs.IntVar(&o.Attempts, "gateway-attempts", DefaultAttempts, "Upstream proxies one tunnel tries before the gateway answers 502.")
	fs.DurationVar(&o.ConnectTimeout, "gateway-connect-timeout", DefaultConnectTimeout, "Time to reach an upstream proxy and get its CONNECT answer.")
	fs.DurationVar(&o.IdleTimeout, "gateway-idle-timeout", DefaultIdleTimeout, "A tunnel that carries nothing either way for this long is closed.")
	fs.DurationVar(&o.MaxTunnelLifetime, "gateway-max-tunnel-lifetime", DefaultMaxTunnelLifetime, "Any tunnel is closed at this age.")
	fs.DurationVar(&o.SessionIdle, "gateway-session-idle", DefaultSessionIdle,
		"A gateway session's route (its own proxy, its detours) is forgotten this long after its last tunnel.")
	fs.Float64Var(&o.SessionMaxErrorScore, "gateway-session-max-error-score", broker.DefaultMaxErrorScore,
		"A session's stint on one proxy is retired once the blocks (1 each) and push-backs (0.5) of its requests, less its successes (0.5 each), reach this: a soft session moves to another proxy, a strict one ends (Proxy-Status session_retired). 0 never retires one.")
	o.PaceWait = DefaultPaceWait
	fs.Var((*paceWait)(&o.PaceWait), "gateway-pace-wait",
		"How long the gateway holds a tunnel or request for its host's next paced slot; beyond it (or with 0, at once) the client gets 429 with Retry-After and Proxy-Status.")
	fs.Var((*portList)(&o.Destinations.ConnectPorts), "gateway-connect-ports",
		"Ports a CONNECT may name, comma-separated, or * for any: the gateway refuses others itself (403 destination_denied) before it picks a proxy. Default: 443, as the Managed proxies' Squid allows.")
	fs.Var((*portList)(&o.Destinations.HTTPPorts), "gateway-http-ports",
		"Ports a plain-HTTP request may name, comma-separated, or * for any. Default: 80,443, as the Managed proxies' Squid allows.")
	_ = (*prefixList)(&o.Destinations.Denied).Set(DefaultDeniedDestinations)
	fs.Var((*prefixList)(&o.Destinations.Denied), "gateway-denied-destinations",
		"Address ranges (CIDRs, comma-separated) no proxy reaches: a CONNECT or request to an IP literal in one is refused by the gateway itself (403). Empty denies none.")
	fs.DurationVar(&o.PacedTunnelLifetime, "gateway-paced-tunnel-lifetime", DefaultPacedTunnelLifetime,
		"A tunnel to a paced host is closed at this age, whatever requests it still carries (each of them takes a slot of the host's pace too).")
	fs.BoolVar(&o.Inspect.On, "gateway-inspect", false,
		"Let crawler teams opt into the inspecting mode (the username flag -inspect): the gateway terminates their TLS with a CA per tenant, kept in a Secret of the operator's namespace (GET /v1/inspect/ca hands a team its certificate), to pace each request exactly and record the sites' refusals itself. Off: -inspect is refused. See docs/inspecting.md.")
	fs.StringVar(&o.Inspect.RootCAsFile, "gateway-inspect-root-cas", "",
		"PEM file of CAs an inspected site's certificate may chain to, besides the system's.")
	fs.Var((*markerList)(&o.BlockMarkers), "gateway-block-markers",
		"Strings, comma-separated, whose presence in the first 64 KiB of a 200 HTML answer the gateway sees (plain HTTP, inspected tunnels) makes it a block page: recorded as a block, as a 403 is, and retried once on another IP when inspected. Empty: none.")
}

// markerList is --gateway-block-markers: comma-separated strings.
type markerList []string

// String is the flag's value as --help shows it.
func (m *markerList) String() string {
	if m == nil {
		return ""
	}
	return strings.Join(*m, ",")
}

// Set reads the flag's value.
func (m *markerList) Set(s string) error {
	*m = nil
	for v := range strings.SplitSeq(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			*m = append(*m, v)
		}
	}
	return nil
}

// Enabled says whether the flags ask for a gateway.
func (o *Options) Enabled() bool { return o.Addr != "" && o.Addr != "0" }

// Validate checks the gateway's flags (none when it is off).
func (o *Options) Validate() error {
	if !o.Enabled() {
		return nil
	}
	var errs []error
	for _, n := range []struct {
		flag  string
		value int
	}{{"gateway-max-tunnels", o.MaxTunnels}, {"gateway-attempts", o.Attempts}} {
		if n.value < 1 {
			errs = append(errs, fmt.Errorf("--%s must be at least 1, got %d", n.flag, n.value))
		}
	}
	for _, d := range []struct {
		flag  string
		value time.Duration
	}{
		{"gateway-connect-timeout", o.ConnectTimeout}, {"gateway-idle-timeout", o.IdleTimeout},
		{"gateway-max-tunnel-lifetime", o.MaxTunnelLifetime}, {"gateway-session-idle", o.SessionIdle},
		{"gateway-paced-tunnel-lifetime", o.PacedTunnelLifetime},
	} {
		if d.value <= 0 {
			errs = append(errs, fmt.Errorf("--%s must be positive, got %s", d.flag, d.value))
		}
	}
	if o.SessionMaxErrorScore < 0 {
		errs = append(errs, fmt.Errorf("--gateway-session-max-error-score must not be negative, got %g", o.SessionMaxErrorScore))
	}
	if o.Inspect.RootCAsFile != "" && !o.Inspect.On {
		errs = append(errs, errors.New("--gateway-inspect-root-cas needs --gateway-inspect"))
	}
	if err := o.Inspect.LoadRootCAs(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// paceWait is --gateway-pace-wait: a duration where 0 means "never wait",
// which Options spells as a negative PaceWait (its zero is the default).
type paceWait time.Duration

// String is the flag's value as --help shows it.
func (p *paceWait) String() string {
	if p == nil || *p < 0 {
		return "0s"
	}
	return time.Duration(*p).String()
}

// Set reads the flag's value.
func (p *paceWait) Set(s string) error {
	d, err := time.ParseDuration(s)
	switch {
	case err != nil:
		return err
	case d < 0:
		return fmt.Errorf("must not be negative, got %s", d)
	case d == 0:
		d = -1
	}
	*p = paceWait(d)
	return nil
}
