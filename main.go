// Command egress-proxies-operator runs the operator: one controller-runtime
// manager that hosts the Proxy reconciler, the health engine, the discovery
// API and orphan GC. main only composes each component's options and wires
// the components (setup.go); every decision lives in a package.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/example/egress-proxies-operator/bans"
	"github.com/example/egress-proxies-operator/broker"
	"github.com/example/egress-proxies-operator/controllers"
	"github.com/example/egress-proxies-operator/controllers/geo"
	"github.com/example/egress-proxies-operator/controllers/pool"
	"github.com/example/egress-proxies-operator/discovery"
	"github.com/example/egress-proxies-operator/gateway"
	"github.com/example/egress-proxies-operator/geoip"
	"github.com/example/egress-proxies-operator/health"
	"github.com/example/egress-proxies-operator/lease"
	"github.com/example/egress-proxies-operator/lease/leasestore"
	"github.com/example/egress-proxies-operator/netid"
	"github.com/example/egress-proxies-operator/operator"
	"github.com/example/egress-proxies-operator/providers"
	"github.com/example/egress-proxies-operator/providers/aws"
	"github.com/example/egress-proxies-operator/providers/gcp"
	"github.com/example/egress-proxies-operator/providers/kubernetes"
	"github.com/example/egress-proxies-operator/tracing"
)

// RBAC the manager itself needs; each component declares its own next to
// its code.
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// errUsage marks errors in the command line itself; main exits 2 for them,
// as the flag package does.
var errUsage = errors.New("usage")

func main() {
	useDefaultGCPercent()
	err := run(ctrl.SetupSignalHandler(), os.Args[1:], os.Stderr)
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return
	case errors.Is(err, errUsage):
		fmt.Fprintf(os.Stderr, "egress-proxies-operator: %v\n", err)
		os.Exit(2)
	default:
		fmt.Fprintf(os.Stderr, "egress-proxies-operator: %v\n", err)
		os.Exit(1)
	}
}

// defaultGCPercent is the collector's target when GOGC is unset. Most of
// the operator's heap is long-lived (its caches and per-proxy tables), and
// probing allocates steadily, so at Go's 100 the heap runs to twice what it
// holds. At 50 a fleet of 10,000 costs about a fifth less memory for no CPU
// the benchmarks can tell apart (docs/performance.md), the trade Prometheus
// made in 2.53. GOGC, or the chart's goGC, still decides when set.
const defaultGCPercent = 50

// useDefaultGCPercent sets defaultGCPercent unless GOGC says otherwise.
func useDefaultGCPercent() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(defaultGCPercent)
	}
}

// options are the operator's command line: each component's own options,
// composed.
type options struct {
	manager     operator.ManagerOptions
	identity    operator.Identity
	providers   providers.Options
	controllers controllers.Options
	pools       pool.Options
	geo         geo.Options
	tracing     tracing.Options
	health      health.Config
	discovery   discovery.Config
	leaseStore  leasestore.Options
	gateway     gateway.Options
	bans        bans.Config
	senders     netid.Rule
	zap         zap.Options
}

// component is what every options type offers.
type component interface {
	AddFlags(fs *flag.FlagSet)
	Validate() error
}

// components are the options that register flags and validate alike.
func (o *options) components() []component {
	return []component{&o.manager, &o.identity, &o.controllers, &o.pools, &o.geo, &o.tracing, &o.health, &o.discovery, &o.leaseStore, &o.gateway, &o.bans, &o.senders}
}

// parseFlags turns the command line into options, rejecting anything the
// operator could not run with. Errors name the flag at fault.
func parseFlags(args []string, output io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("egress-proxies-operator", flag.ContinueOnError)
	fs.SetOutput(output)
	o.providers.AddFlags(fs)
	for _, c := range o.components() {
		c.AddFlags(fs)
	}
	o.zap.BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return o, err
		}
		return o, fmt.Errorf("%w: %w", errUsage, err)
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("%w: unexpected arguments %q: all settings are flags", errUsage, fs.Args())
	}
	errs := []error{
		operator.CheckBindAddress("discovery-bind-address", o.discovery.Addr),
		operator.CheckBindAddress("gateway-bind-address", o.gateway.Addr),
	}
	for _, c := range o.components() {
		errs = append(errs, c.Validate())
	}
	if o.health.IdleInterval > 0 && !o.discovery.Enabled() {
		errs = append(errs, errors.New("--health-idle-interval needs the discovery API (its lease store says which proxies carry traffic): --discovery-bind-address must not be \"0\""))
	}
	if o.gateway.Enabled() && !o.discovery.Enabled() {
		errs = append(errs, errors.New("--gateway-bind-address needs the discovery API (its token, view and lease store): --discovery-bind-address must not be \"0\""))
	}
	if err := errors.Join(errs...); err != nil {
		return o, fmt.Errorf("%w: %w", errUsage, err)
	}
	return o, nil
}

// providerRegistry is every provider type this build knows: the one place a
// concrete provider is named.
var providerRegistry = providers.Registry{
	kubernetes.Type: kubernetes.New,
	gcp.Type:        gcp.New,
	aws.Type:        aws.New,
}

// cloudTypes are the provider types that run proxies on a public cloud's
// network: a Managed proxy of one carries its type as the discovery
// attribute cloud, since sites block whole clouds by ASN.
var cloudTypes = map[string]bool{gcp.Type: true, aws.Type: true}

// cloudsOf maps each provider instance on a cloud to that cloud.
func cloudsOf(cfg providers.Config) map[string]string {
	out := map[string]string{}
	for _, inst := range cfg.Providers {
		if cloudTypes[inst.Type] {
			out[inst.Name] = inst.Type
		}
	}
	return out
}

// pricesOf is each provider instance's pricing, for the usage's cost.
func pricesOf(cfg providers.Config) map[string]broker.Price {
	out := map[string]broker.Price{}
	for _, inst := range cfg.Providers {
		if p := inst.Pricing; p != nil {
			out[inst.Name] = broker.Price{ProxyHour: p.ProxyHour, GiB: p.GiB}
		}
	}
	return out
}

// run starts the operator and blocks until ctx ends. Every check that needs
// no cluster (flags, the providers file, the probe CAs) runs before
// connecting, so a bad command line fails fast and offline.
func run(ctx context.Context, args []string, output io.Writer) error {
	opts, err := parseFlags(args, output)
	if err != nil {
		return err
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts.zap)))
	providersConfig, err := opts.providers.Load(providerRegistry)
	if err != nil {
		return err
	}
	roots, err := opts.health.Roots()
	if err != nil {
		return err
	}
	var geoDB *geoip.Database
	if opts.geo.Enabled() {
		if geoDB, err = geoip.Open(opts.geo.Databases); err != nil {
			return err
		}
	}
	stopTracing, err := tracing.Setup(ctx, opts.tracing, "egress-proxies-operator")
	if err != nil {
		return err
	}
	defer func() {
		// What is left of the traces goes out, within a bound.
		flush, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = stopTracing(flush)
	}()
	w, err := newWiring(ctx, opts, providersConfig)
	if err != nil {
		return err
	}
	// One channel of Proxies to look at now: verdict changes from the
	// health engine, lost instances from the instance watcher.
	triggers := make(chan event.GenericEvent, 1024)
	canaries := &canaryOutcomes{}
	var traffic *leaseTraffic
	if opts.discovery.Enabled() {
		traffic = &leaseTraffic{}
	}
	engine, err := w.setupHealth(roots, triggers, canaries, traffic)
	if err != nil {
		return err
	}
	var demand pool.DemandSource
	var outcomes lease.OutcomeMemory
	if opts.discovery.Enabled() {
		server, err := w.setupDiscovery(ctx, engine)
		if err != nil {
			return err
		}
		if opts.gateway.Enabled() {
			if err := w.setupGateway(server, engine); err != nil {
				return err
			}
		}
		demand, outcomes = poolDemand{server}, senderBurns{server.Outcomes(), w.opts.senders}
		canaries.memory = outcomes
		traffic.store = server.Broker().Store()
		if err := w.setupBans(outcomes, triggers); err != nil {
			return err
		}
	}
	if err := w.setupControllers(engine, triggers, outcomes); err != nil {
		return err
	}
	if err := w.setupPools(demand); err != nil {
		return err
	}
	if geoDB != nil {
		if err := w.setupGeo(geoDB); err != nil {
			return err
		}
	}
	ctrl.Log.WithName("setup").Info("starting manager", "clusterID", w.opts.identity.ClusterID, "operatorID", w.opts.identity.OperatorID,
		"namespaces", w.opts.identity.Scope.String(), "providers", w.providers.Names())
	if err := w.mgr.Start(ctx); err != nil {
		return fmt.Errorf("running manager: %w", err)
	}
	return nil
}
