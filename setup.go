package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"maps"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/bans"
	"github.com/example/egress-proxies-operator/broker"
	"github.com/example/egress-proxies-operator/controllers"
	"github.com/example/egress-proxies-operator/controllers/geo"
	"github.com/example/egress-proxies-operator/controllers/pool"
	"github.com/example/egress-proxies-operator/credentials"
	"github.com/example/egress-proxies-operator/discovery"
	"github.com/example/egress-proxies-operator/gateway"
	"github.com/example/egress-proxies-operator/geoip"
	"github.com/example/egress-proxies-operator/health"
	"github.com/example/egress-proxies-operator/inspect"
	"github.com/example/egress-proxies-operator/intern"
	"github.com/example/egress-proxies-operator/kubeauth"
	"github.com/example/egress-proxies-operator/lease"
	"github.com/example/egress-proxies-operator/netid"
	"github.com/example/egress-proxies-operator/operator"
	"github.com/example/egress-proxies-operator/providers"
	"github.com/example/egress-proxies-operator/providers/kubernetes"
	"github.com/example/egress-proxies-operator/shard"
	"github.com/example/egress-proxies-operator/tenant"
)

// wiring is what the setup functions share: the manager, the operator's
// identity and providers, and the cache of proxy credentials.
type wiring struct {
	opts       options
	restConfig *rest.Config
	mgr        manager.Manager
	providers  providers.Set
	// clouds: each provider instance on a cloud -> that cloud (its type).
	clouds map[string]string
	// prices: provider instance -> its pricing (the usage's cost).
	prices   map[string]broker.Price
	owner    providers.Owner
	recorder events.EventRecorder
	// credentialsCache holds only Secrets labelled
	// crawl.example.com/proxy-credentials=true: in the watched namespaces
	// (the ones Proxies name) and the credentials namespace (the generated
	// ones and the records).
	credentialsCache cache.Cache
}

// newWiring connects: the manager, the provider instances, the cluster id
// and the credentials cache.
func newWiring(ctx context.Context, opts options, providersConfig providers.Config) (*wiring, error) {
	restConfig, err := loadRESTConfig(opts.manager.Kubeconfig)
	if err != nil {
		return nil, err
	}
	restConfig.QPS, restConfig.Burst = float32(opts.manager.KubeAPIQPS), opts.manager.KubeAPIBurst
	mgr, err := newManager(restConfig, opts)
	if err != nil {
		return nil, err
	}
	set, err := providerRegistry.Build(providersConfig, providers.Dependencies{Client: mgr.GetClient()})
	if err != nil {
		return nil, fmt.Errorf("--providers-config %s: %w", opts.providers.ConfigPath, err)
	}
	if err := opts.identity.Resolve(ctx, mgr.GetAPIReader()); err != nil {
		return nil, err
	}
	credentialsCache, err := cache.New(restConfig, opts.identity.Scope.Cache(credentials.CacheOptions(cache.Options{
		Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper(), SyncPeriod: &opts.manager.SyncPeriod,
	}), opts.identity.CredentialsNamespace))
	if err != nil {
		return nil, fmt.Errorf("creating the credentials cache: %w", err)
	}
	if err := mgr.Add(everyReplica{credentialsCache}); err != nil {
		return nil, fmt.Errorf("adding the credentials cache: %w", err)
	}
	return &wiring{
		opts: opts, restConfig: restConfig, mgr: mgr, providers: set, clouds: cloudsOf(providersConfig), prices: pricesOf(providersConfig), owner: opts.identity.Owner(),
		recorder: mgr.GetEventRecorder("egress-proxies-operator"), credentialsCache: credentialsCache,
	}, nil
}

// setupHealth adds the health engine, which tells triggers of every
// verdict change, and the metrics that read it.
func (w *wiring) setupHealth(roots *x509.CertPool, triggers chan<- event.GenericEvent, outcomes health.OutcomeSink, traffic *leaseTraffic) (*health.Engine, error) {
	prober := health.NewHTTPProber(roots)
	var member health.Shard
	var engine *health.Engine
	if w.opts.health.ShardProbes {
		// The replica joins once its engine knows the fleet.
		m, err := w.setupShard(operator.Name()+"-probes", func(ctx context.Context) bool { return engine.WaitSynced(ctx) })
		if err != nil {
			return nil, err
		}
		member = m
	}
	var trafficSource health.Traffic // nil without discovery: a nil *leaseTraffic is not
	if traffic != nil {
		trafficSource = traffic
	}
	engine = health.NewEngine(health.Options{
		Cache:                w.mgr.GetCache(),
		Client:               w.mgr.GetClient(),
		Prober:               prober,
		Canaries:             prober,
		Outcomes:             outcomes,
		CanaryInterval:       w.opts.health.CanaryInterval,
		CanaryHostInterval:   w.opts.health.CanaryHostInterval,
		EchoURL:              w.opts.health.EchoURL,
		Defaults:             w.opts.health.Defaults,
		Workers:              w.opts.health.Workers,
		MaxProbesPerSecond:   w.opts.health.MaxProbesPerSecond,
		Clock:                clock.RealClock{},
		Jitter:               health.DefaultJitter,
		Recorder:             w.recorder,
		Notify:               triggers,
		Credentials:          credentials.Reader{Client: w.credentialsCache},
		CredentialsNamespace: w.opts.identity.CredentialsNamespace,
		Shard:                member,
		Elected:              w.mgr.Elected(),
		TargetSuspect:        w.opts.controllers.Replacement.TargetSuspect,
		IdleInterval:         w.opts.health.IdleInterval,
		Traffic:              trafficSource,
	})
	if err := w.mgr.Add(engine); err != nil {
		return nil, fmt.Errorf("adding the health engine: %w", err)
	}
	return engine, register(health.ProxiesCollector{Reader: w.mgr.GetClient()}, engine.LastProbeCollector())
}

// setupShard adds this replica's membership of group, a shard of the
// replicas in the operator's namespace, on every replica; it joins once
// ready returns true.
func (w *wiring) setupShard(group string, ready func(context.Context) bool) (*shard.Member, error) {
	typed, err := clientset.NewForConfigAndClient(w.restConfig, w.mgr.GetHTTPClient())
	if err != nil {
		return nil, fmt.Errorf("creating the Lease client for the shard %s: %w", group, err)
	}
	host, err := os.Hostname()
	if err != nil {
		return nil, fmt.Errorf("naming this replica in the shard %s: %w", group, err)
	}
	member, err := shard.New(shard.Options{Leases: typed.CoordinationV1(), Namespace: operator.Namespace(), Group: group, Identity: shard.NewIdentity(host),
		LeaseDuration: w.opts.health.ShardLeaseDuration, WaitReady: ready,
	})
	if err != nil {
		return nil, fmt.Errorf("the shard %s: %w", group, err)
	}
	if err := w.mgr.Add(member); err != nil {
		return nil, fmt.Errorf("adding the shard %s: %w", group, err)
	}
	return member, nil
}

// setupBans adds the ban judge on the leader: it reads the outcome memory
// and tells the Proxy reconciler of each ban through triggers.
func (w *wiring) setupBans(outcomes lease.OutcomeMemory, triggers chan<- event.GenericEvent) error {
	c := w.opts.bans
	judge := bans.New(bans.Options{
		Client: w.mgr.GetClient(), Memory: outcomes, Interval: c.Interval, MaxBlockedShare: c.MaxBlockedShare,
		BurnRetention: c.BurnRetention, Recorder: w.recorder, Clock: clock.RealClock{}, Notify: triggers, ReportCooldown: w.opts.discovery.Cooldown,
	})
	if err := w.mgr.Add(judge); err != nil {
		return fmt.Errorf("adding the ban judge: %w", err)
	}
	return nil
}

// setupControllers adds the Proxy and CrawlTarget controllers and the
// leader's runnables beside them: the instance watcher, orphan GC and the
// firewall keeper. burned is nil without the discovery API (and its
// outcome memory).
func (w *wiring) setupControllers(engine *health.Engine, triggers chan event.GenericEvent, burned controllers.BurnedIPs) error {
	o := w.opts.controllers
	if err := (&controllers.ProxyReconciler{
		Client: w.mgr.GetClient(), Providers: w.providers, Owner: w.owner, Recorder: w.recorder,
		Workers: o.MaxConcurrentReconciles, Health: engineHealth{engine},
		Replacement: o.Replacement, MaxReplacementsInFlight: o.MaxReplacementsInFlight, Triggers: triggers,
		CredentialsCache: w.credentialsCache, CredentialsNamespace: w.opts.identity.CredentialsNamespace,
		Burned: burned, MaxBurnedIPRerolls: o.MaxBurnedIPRerolls,
	}).SetupWithManager(w.mgr); err != nil {
		return fmt.Errorf("setting up the Proxy controller: %w", err)
	}
	if err := (&controllers.CrawlTargetReconciler{Client: w.mgr.GetClient()}).SetupWithManager(w.mgr); err != nil {
		return fmt.Errorf("setting up the CrawlTarget controller: %w", err)
	}
	for name, r := range map[string]manager.Runnable{
		"the instance watcher": &controllers.InstanceWatcher{
			Client: w.mgr.GetClient(), Providers: w.providers, Owner: w.owner, Interval: o.InstanceResyncInterval, Triggers: triggers,
		},
		"orphan GC": &controllers.OrphanCollector{
			Client: w.mgr.GetClient(), Providers: w.providers, Owner: w.owner, Scope: w.opts.identity.Scope,
			Interval: o.GCInterval, GracePeriod: o.GCGracePeriod, DryRun: o.GCDryRun, Clock: clock.RealClock{},
			Credentials: w.credentialsCache, Deleter: w.mgr.GetClient(), CredentialsNamespace: w.opts.identity.CredentialsNamespace,
		},
		"the firewall keeper": &controllers.FirewallKeeper{Providers: w.providers, Owner: w.owner},
	} {
		if err := w.mgr.Add(r); err != nil {
			return fmt.Errorf("adding %s: %w", name, err)
		}
	}
	return nil
}

// setupPools adds the ProxyPool controller; demand is nil without the
// discovery API.
func (w *wiring) setupPools(demand pool.DemandSource) error {
	pools := &pool.Reconciler{Client: w.mgr.GetClient(), Recorder: w.recorder, AutoscaleInterval: w.opts.pools.AutoscaleInterval, Demand: demand}
	if err := pools.SetupWithManager(w.mgr); err != nil {
		return fmt.Errorf("setting up the ProxyPool controller: %w", err)
	}
	return nil
}

// setupGeo adds, on the leader, the geo controller and the refresh of its
// database's files.
func (w *wiring) setupGeo(db *geoip.Database) error {
	r := &geo.Reconciler{Client: w.mgr.GetClient(), Database: db, Recorder: w.recorder}
	if err := r.SetupWithManager(w.mgr); err != nil {
		return fmt.Errorf("setting up the geo controller: %w", err)
	}
	refresh := manager.RunnableFunc(func(ctx context.Context) error {
		db.Run(ctx, w.opts.geo.RefreshInterval, logf.FromContext(ctx).WithName("geoip"))
		return nil
	})
	if err := w.mgr.Add(refresh); err != nil {
		return fmt.Errorf("adding the geo database's refresh: %w", err)
	}
	return nil
}

// setupDiscovery adds the discovery API on every replica: a view of Proxies
// fed by the manager's informer with the health engine's verdicts, the
// politeness policies and tenant quotas, the lease store, the token and
// the tenants. The manager's /readyz then also waits for them.
func (w *wiring) setupDiscovery(ctx context.Context, engine *health.Engine) (*discovery.Server, error) {
	d := w.opts.discovery
	view := broker.NewView(engineHealth{engine}, w.opts.identity.CredentialsNamespace)
	view.SetClouds(w.clouds)
	view.SetIdentity(w.opts.senders)
	policies, quotas := broker.NewPolicyIndex(), broker.NewQuotaIndex()
	var synced []func() bool
	for _, feed := range []struct {
		obj     client.Object
		handler toolscache.ResourceEventHandler
	}{{&crawlv1alpha1.Proxy{}, view.Handler()}, {&crawlv1alpha1.CrawlTarget{}, policies.Handler()}, {&crawlv1alpha1.TenantQuota{}, quotas.Handler()}} {
		informer, err := w.mgr.GetCache().GetInformer(ctx, feed.obj)
		if err != nil {
			return nil, fmt.Errorf("getting the %T informer for discovery: %w", feed.obj, err)
		}
		reg, err := informer.AddEventHandler(feed.handler)
		if err != nil {
			return nil, fmt.Errorf("feeding discovery from %T: %w", feed.obj, err)
		}
		synced = append(synced, reg.HasSynced)
	}
	tokens, waitForTokens, err := w.setupTokens(ctx)
	if err != nil {
		return nil, err
	}
	var tenants broker.Tenants
	if d.Tenants() {
		// The reviewer's answers and the broker's sets narrowed from them
		// are each reused for half the TTL: a revoked binding stops the
		// next lease within the whole.
		reviewer, err := kubeauth.NewReviewerFor(w.restConfig, w.mgr.GetHTTPClient(), d.TenantAudience, d.TenantReviewTTL/2)
		if err != nil {
			return nil, fmt.Errorf("reviewing crawler teams' ServiceAccount tokens: %w", err)
		}
		tenants = tenant.NewChecker(reviewer)
	}
	store, storeMetrics, err := w.opts.leaseStore.Open()
	if err != nil {
		return nil, err
	}
	ledger, err := d.OpenLedger(ctrl.Log.WithName("ledger"))
	if err != nil {
		return nil, err
	}
	if w.opts.gateway.Enabled() && w.opts.gateway.Inspect.On {
		w.opts.gateway.Inspect.Authority = &inspect.Secrets{Reader: w.mgr.GetAPIReader(), Writer: w.mgr.GetClient(), Namespace: operator.Namespace()}
	}
	server := discovery.NewServer(discovery.Options{
		Addr: d.Addr, DefaultTTL: broker.DefaultTTL, MaxTTL: d.MaxTTL, DefaultCooldown: d.Cooldown,
		Store: store, StoreTimeout: w.opts.leaseStore.Timeout, View: view, Tokens: tokens, WaitForTokens: waitForTokens,
		Ready: func() bool {
			for _, s := range synced {
				if !s() {
					return false
				}
			}
			return true
		},
		Clock: clock.RealClock{}, Credentials: credentials.Reader{Client: w.credentialsCache},
		Politeness: broker.Politeness{Policies: policies, Adaptive: d.AdaptivePacing},
		Tenants:    tenants, Quotas: quotas, TenantReviewTTL: d.TenantReviewTTL / 2, Ledger: ledger, LedgerRetention: d.LedgerRetention,
		Prices: w.prices, UsageRetention: d.UsageRetention,
		InspectCA: w.opts.gateway.Inspect.Authority,
	})
	if err := register(append(storeMetrics, server.Broker().LearnedPaceCollector(policies, w.opts.leaseStore.Timeout))...); err != nil {
		return nil, err
	}
	if err := w.mgr.Add(server); err != nil {
		return nil, fmt.Errorf("adding the discovery API: %w", err)
	}
	if err := w.mgr.AddReadyzCheck("discovery", server.ReadyCheck); err != nil {
		return nil, fmt.Errorf("adding the discovery readiness check: %w", err)
	}
	return server, nil
}

// setupTokens is the discovery token: with --discovery-auth=none no token
// at all; otherwise the token Secret, followed through a cache that holds
// only it, and kept in place by a TokenKeeper (created with a random token
// when missing). The wait is nil when there is nothing to wait for.
func (w *wiring) setupTokens(ctx context.Context) (discovery.TokenSource, func(context.Context) bool, error) {
	if w.opts.discovery.Auth == discovery.AuthNone {
		return discovery.StaticToken(""), nil, nil
	}
	key := w.opts.discovery.TokenSecretKey(operator.Namespace())
	token, tokenCache, err := discovery.WatchTokenSecret(ctx, w.restConfig, w.mgr.GetScheme(), key.Namespace, key.Name)
	if err != nil {
		return nil, nil, err
	}
	if err := w.mgr.Add(everyReplica{tokenCache}); err != nil {
		return nil, nil, fmt.Errorf("adding the discovery token cache: %w", err)
	}
	keeper := &discovery.TokenKeeper{Client: w.mgr.GetClient(), Key: key, Token: token, Synced: tokenCache.WaitForCacheSync}
	if err := w.mgr.Add(keeper); err != nil {
		return nil, nil, fmt.Errorf("adding the discovery token keeper: %w", err)
	}
	return token, tokenCache.WaitForCacheSync, nil
}

// setupGateway adds the rotating gateway, whose tunnels go through the
// discovery server's lease store, and which has the replica that probes a
// proxy its tunnels could not reach probe it soon.
func (w *wiring) setupGateway(server *discovery.Server, engine *health.Engine) error {
	gwOpts := w.opts.gateway
	gwOpts.Upstreams = server.Tunnels()
	gwOpts.OnUnreachable = func(proxyID string) {
		if namespace, name, ok := strings.Cut(proxyID, "/"); ok {
			engine.AskProbe(types.NamespacedName{Namespace: namespace, Name: name})
		}
	}
	gw := gateway.New(gwOpts)
	server.Broker().OnSessionReport(gw.OnSessionReport)
	if err := w.mgr.Add(gw); err != nil {
		return fmt.Errorf("adding the rotating gateway: %w", err)
	}
	return nil
}

// register adds collectors that read a component's state at scrape time
// to the manager's registry. (Package-level metrics register themselves.)
func register(collectors ...prometheus.Collector) error {
	for _, c := range collectors {
		if err := ctrlmetrics.Registry.Register(c); err != nil {
			return fmt.Errorf("registering metrics: %w", err)
		}
	}
	return nil
}

// everyReplica makes a cache of the operator's own start on every replica,
// before leader election, as the manager's cache does. Added bare,
// controller-runtime would start it on the leader only, and a replica that
// does not lead would never serve discovery (it waits for the token
// Secret's cache) nor hand out credentials.
type everyReplica struct{ cache.Cache }

// GetCache puts it in the manager's group of caches.
func (c everyReplica) GetCache() cache.Cache { return c.Cache }

// poolDemand lets the pool controller read discovery's demand signals;
// neither package imports the other.
type poolDemand struct{ server *discovery.Server }

func (d poolDemand) PoolDemand(ctx context.Context, namespace, name string) (pool.Demand, error) {
	got, err := d.server.Broker().PoolDemand(ctx, namespace, name)
	return pool.Demand{ActiveLeases: got.ActiveLeases, Held: got.Held, HeldLeases: got.HeldLeases, LastRefused: got.LastRefused}, err
}

// senderBurns keys the burned-IP memory by sender (netid): a ban burns
// the whole /64 of an IPv6 exit IP, and a new instance that comes up
// anywhere in a burned /64 is on a burned address.
type senderBurns struct {
	lease.OutcomeMemory
	senders netid.Rule
}

func (s senderBurns) sender(ip string) string {
	if sender := s.senders.Of(ip); sender != "" {
		return sender
	}
	return ip
}

// BurnIP burns ip's sender.
func (s senderBurns) BurnIP(ctx context.Context, scope, ip string, retention time.Duration) error {
	return s.OutcomeMemory.BurnIP(ctx, scope, s.sender(ip), retention)
}

// BurnedUntil is when ip's sender stops being burned.
func (s senderBurns) BurnedUntil(ctx context.Context, scope, ip string) (time.Time, error) {
	return s.OutcomeMemory.BurnedUntil(ctx, scope, s.sender(ip))
}

// canaryOutcomes hands the health engine's canary results to the lease
// store's outcome memory (a blocked canary cools the proxy for its host
// and counts toward its ban); memory is set once discovery is, before the
// manager starts. Without the discovery API nothing records them.
type canaryOutcomes struct{ memory lease.OutcomeMemory }

func (c *canaryOutcomes) CanaryOutcome(ctx context.Context, proxy types.NamespacedName, host string, blocked bool, hold time.Duration) {
	if c.memory == nil {
		return
	}
	o := lease.Outcome{Blocked: blocked, Source: lease.OutcomeCanary, Client: lease.ClientCanary}
	if blocked {
		o.Cooldown = hold
	}
	if err := c.memory.RecordOutcome(ctx, proxy.String(), host, o); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "recording a canary's outcome", "proxy", proxy, "host", host)
	}
}

func (c *canaryOutcomes) EndCanaryHold(ctx context.Context, proxy types.NamespacedName, host string, notAfter time.Time) {
	if c.memory == nil {
		return
	}
	if err := c.memory.EndCooldown(ctx, proxy.String(), host, notAfter); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "ending a canary's hold; it ends by itself", "proxy", proxy, "host", host)
	}
}

// leaseTraffic tells the health engine which proxies carry leases, and
// carries tunnels' asks for probes between replicas, through the lease
// store discovery opens after the engine is built; store is set before
// the manager starts.
type leaseTraffic struct{ store lease.Store }

// ActiveLeases counts each proxy's live leases.
func (t *leaseTraffic) ActiveLeases(ctx context.Context, ids []string) ([]int, error) {
	return t.store.ActiveLeases(ctx, ids)
}

// AskProbe passes on a tunnel's ask for a probe of proxy.
func (t *leaseTraffic) AskProbe(ctx context.Context, proxy string) error {
	return t.store.AskProbe(ctx, proxy)
}

// ProbesAsked reads the asks passed on after the cursor.
func (t *leaseTraffic) ProbesAsked(ctx context.Context, after int64) ([]string, int64, error) {
	return t.store.ProbesAsked(ctx, after)
}

// engineHealth lets discovery and the reconciler read the health engine's
// verdicts. Without --health-shard-probes, on a replica that is not the
// leader the engine probes nothing, so nothing is known and discovery goes
// by the recorded status; with it, every replica's engine knows its share
// by its probes and the others' by their status.
type engineHealth struct{ engine *health.Engine }

func (e engineHealth) Healthy(key types.NamespacedName, address string) (healthy, known bool) {
	v, ok := e.engine.VerdictAt(key, address)
	return v == health.Healthy, ok
}

func (e engineHealth) Generation() uint64 { return e.engine.Generation() }

// Health lets the reconciler read how long a proxy has failed its probes,
// and how its probe URL fares across the fleet.
func (e engineHealth) Health(key types.NamespacedName) (controllers.ProxyHealth, bool) {
	h, ok := e.engine.Health(key)
	if !ok {
		return controllers.ProxyHealth{}, false
	}
	return controllers.ProxyHealth{UnhealthySince: h.UnhealthySince, URL: h.URL, Probed: h.Probed, Unhealthy: h.Unhealthy, LastSuspect: h.LastSuspect}, true
}

// loadRESTConfig reads the kubeconfig named by --kubeconfig, or finds one the
// way kubectl does.
func loadRESTConfig(path string) (*rest.Config, error) {
	if path != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", path)
		if err != nil {
			return nil, fmt.Errorf("--kubeconfig %s: %w", path, err)
		}
		return cfg, nil
	}
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return nil, fmt.Errorf("loading kubeconfig: %w", err)
	}
	return cfg, nil
}

// newScheme registers every API type the operator reads or writes through
// the manager: its own, and core/v1's (Pods, Secrets). Events, leases and
// reviews go through client-go's typed clients, which bring their own.
// client-go's whole scheme (every built-in group, about 600 kinds) held
// 1.5 MiB of heap for kinds nothing here touches.
func newScheme() *runtime.Scheme {
	scheme := runtime.NewScheme()
	utilruntime.Must(corev1.AddToScheme(scheme))
	utilruntime.Must(crawlv1alpha1.AddToScheme(scheme))
	return scheme
}

// newManager builds the controller-runtime manager with secure metrics
// (kubebuilder v4's TokenReview and SubjectAccessReview, through package
// kubeauth), health probes and leader election.
func newManager(restConfig *rest.Config, opts options) (manager.Manager, error) {
	m := opts.manager
	metricsOpts := metricsserver.Options{BindAddress: m.MetricsAddr, SecureServing: m.MetricsSecure}
	if m.MetricsSecure {
		metricsOpts.FilterProvider = kubeauth.WithAuthenticationAndAuthorization
	}
	if !m.EnableHTTP2 {
		metricsOpts.TLSOpts = []func(*tls.Config){func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }}
	}
	mgr, err := ctrl.NewManager(restConfig, ctrl.Options{
		Scheme:                 newScheme(),
		Cache:                  opts.identity.Scope.Cache(cacheOptions(m)),
		Metrics:                metricsOpts,
		HealthProbeBindAddress: m.ProbeAddr,
		PprofBindAddress:       m.PprofAddr,
		LeaderElection:         m.LeaderElect,
		LeaderElectionID:       m.LeaderElectionID,
		// In the operator's namespace: controller-runtime would otherwise
		// find it only in-cluster, and --leader-elect would fail on a laptop.
		LeaderElectionNamespace: operator.Namespace(),
		Controller:              controllers.ControllerDefaults(),
	})
	if err != nil {
		return nil, fmt.Errorf("creating manager: %w", err)
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return nil, fmt.Errorf("adding healthz check: %w", err)
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return nil, fmt.Errorf("adding readyz check: %w", err)
	}
	return mgr, nil
}

// cacheOptions keeps the operator's memory to what it owns: Secrets only
// when labelled for cloud-init, instance objects only when labelled with a
// cluster id, and no object's managedFields, which nothing here reads and
// which are a large share of each cached object. (Writes are applies of
// the writer's own fields, which need none of them.) Proxies, the objects
// there are thousands of, also share the strings and maps a fleet repeats.
func cacheOptions(m operator.ManagerOptions) cache.Options {
	byObject := controllers.CacheByObject()
	maps.Copy(byObject, kubernetes.CacheByObject())
	byObject[&crawlv1alpha1.Proxy{}] = cache.ByObject{Transform: intern.ProxyTransform(intern.NewStringMaps(intern.DefaultStringMaps))}
	return cache.Options{ByObject: byObject, DefaultTransform: cache.TransformStripManagedFields(), SyncPeriod: &m.SyncPeriod}
}
