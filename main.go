// Command egress-proxies-operator runs the operator: one controller-runtime
// manager that hosts the Proxy reconciler, the health engine, the discovery
// API and orphan GC. main only wires; every decision lives in a package.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"net/url"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/controllers"
	"github.com/example/egress-proxies-operator/controllers/pool"
	"github.com/example/egress-proxies-operator/credentials"
	"github.com/example/egress-proxies-operator/discovery"
	"github.com/example/egress-proxies-operator/discovery/redisstore"
	"github.com/example/egress-proxies-operator/gateway"
	"github.com/example/egress-proxies-operator/health"
	"github.com/example/egress-proxies-operator/intern"
	"github.com/example/egress-proxies-operator/kubeauth"
	"github.com/example/egress-proxies-operator/providers"
	"github.com/example/egress-proxies-operator/providers/gcp"
	"github.com/example/egress-proxies-operator/providers/kubernetes"
	"github.com/example/egress-proxies-operator/tenant"
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

// options are the operator's command-line settings.
type options struct {
	metricsAddr     string
	metricsSecure   bool
	enableHTTP2     bool
	probeAddr       string
	pprofAddr       string
	leaderElect     bool
	providersConfig string
	discoveryAddr   string
	clusterID       string
	// operatorID tells this operator from others in the cluster; scope is
	// the namespaces it keeps to (none: the whole cluster).
	operatorID       string
	scope            controllers.Scope
	leaderElectionID string
	gcInterval       time.Duration
	gcGracePeriod    time.Duration
	gcDryRun         bool
	kubeconfig       string
	health           health.Settings
	healthWorkers    int
	healthCABundle   string
	leaseMaxTTL      time.Duration
	cooldown         time.Duration
	adaptivePacing   bool
	tokenSecret      string
	discoveryAuth    string
	tenantAudience   string
	tenantReviewTTL  time.Duration
	ledgerFile       string
	ledgerRetention  time.Duration
	// leaseStore is memory (one replica) or redis (shared by replicas);
	// storeTimeout bounds each of its calls.
	leaseStore     string
	storeTimeout   time.Duration
	redis          redisstore.Connection
	redisKeyPrefix string
	// credentialsNamespace keeps the generated proxy credentials and the
	// record of each instance's.
	credentialsNamespace string
	// Throughput against the API server: one worker and controller-runtime's
	// 20 requests/s are too slow for thousands of proxies (docs/performance.md).
	maxConcurrentReconciles int
	kubeAPIQPS              float64
	kubeAPIBurst            int
	// Self-healing.
	instanceResyncInterval  time.Duration
	syncPeriod              time.Duration
	unhealthyReplaceAfter   time.Duration
	maxUnhealthyShare       float64
	maxReplacementsInFlight int
	// ProxyPools.
	poolAutoscaleInterval time.Duration
	// The rotating gateway (Addr "0": off).
	gateway gateway.Options
	zap     zap.Options
}

// parseFlags turns the command line into options, rejecting anything the
// operator could not run with. Errors name the flag at fault.
func parseFlags(args []string, output io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("egress-proxies-operator", flag.ContinueOnError)
	fs.SetOutput(output)
	fs.StringVar(&o.metricsAddr, "metrics-bind-address", ":8443",
		"Address the metrics endpoint binds to; \"0\" disables it.")
	fs.BoolVar(&o.metricsSecure, "metrics-secure", true,
		"Serve metrics over HTTPS behind Kubernetes authentication and authorization.")
	fs.BoolVar(&o.enableHTTP2, "enable-http2", false,
		"Allow HTTP/2 on the metrics server (off by default: HTTP/2 Rapid Reset and Stream Cancellation).")
	fs.StringVar(&o.pprofAddr, "pprof-bind-address", "0",
		"Address Go's /debug/pprof endpoints bind to, for profiling a running operator; \"0\" (the default) disables them. Keep it off a Service: profiles show internals.")
	fs.StringVar(&o.probeAddr, "health-probe-bind-address", ":8081",
		"Address the /healthz and /readyz endpoints bind to; \"0\" disables them.")
	fs.BoolVar(&o.leaderElect, "leader-elect", false,
		"Elect a leader among replicas; the reconciler, health engine and GC run only on the leader.")
	fs.StringVar(&o.providersConfig, "providers-config", "",
		"Path of the YAML file naming the provider instances (for example gcp-eu). Empty: no providers, so only External proxies work.")
	fs.StringVar(&o.discoveryAddr, "discovery-bind-address", ":8090",
		"Address the discovery API binds to; \"0\" disables it.")
	fs.StringVar(&o.clusterID, "cluster-id", "",
		"Identifier labelled on every instance this operator creates, so orphan GC never touches another cluster's. Default: the UID of the kube-system namespace; with --watch-namespaces, the UID of the operator's own namespace.")
	fs.StringVar(&o.operatorID, "operator-id", "",
		"Identifier of this operator among those of one cluster, labelled on every instance beside the cluster id: two operators never list, watch or collect each other's instances. Default: <operator namespace>_<$OPERATOR_NAME, or egress-proxies-operator>.")
	watchNamespaces := fs.String("watch-namespaces", defaultWatchNamespaces(),
		"Comma-separated namespaces the operator keeps to: its caches, watches, discovery and GC. Empty: the whole cluster. Default: $WATCH_NAMESPACE (OLM's target namespaces).")
	fs.StringVar(&o.leaderElectionID, "leader-election-id", operatorName()+".crawl.example.com",
		"Name of the leader election Lease in the operator's namespace; two releases in one namespace need two. Default: <$OPERATOR_NAME, or egress-proxies-operator>.crawl.example.com.")
	fs.DurationVar(&o.gcInterval, "gc-interval", controllers.DefaultGCInterval,
		"How often orphan GC lists every provider's instances.")
	fs.DurationVar(&o.gcGracePeriod, "gc-grace-period", controllers.DefaultGCGracePeriod,
		"Orphan GC spares instances younger than this (a Proxy may not have recorded its new instance yet).")
	fs.BoolVar(&o.gcDryRun, "gc-dry-run", false,
		"Orphan GC logs what it would delete and deletes nothing.")
	fs.StringVar(&o.health.URL, "health-probe-url", health.DefaultURL,
		"HTTPS URL fetched through every proxy to prove it can egress; a Proxy's spec.healthCheck.url overrides it.")
	fs.DurationVar(&o.health.Interval, "health-interval", health.DefaultInterval, "Time between probes of one proxy.")
	fs.DurationVar(&o.health.Timeout, "health-timeout", health.DefaultTimeout, "Time one probe may take.")
	fs.IntVar(&o.health.FailureThreshold, "health-failure-threshold", health.DefaultFailureThreshold,
		"Consecutive failed probes that make a proxy Unhealthy.")
	fs.IntVar(&o.health.SuccessThreshold, "health-success-threshold", health.DefaultSuccessThreshold,
		"Consecutive successful probes that make a proxy Healthy.")
	fs.IntVar(&o.healthWorkers, "health-workers", health.DefaultWorkers, "Probes running at once.")
	fs.StringVar(&o.healthCABundle, "health-ca-bundle", "",
		"PEM file of CAs trusted for probe targets, added to the system roots (for private probe targets).")
	fs.DurationVar(&o.leaseMaxTTL, "lease-max-ttl", discovery.DefaultMaxTTL,
		"Longest lease the discovery API grants; longer requests are capped.")
	fs.DurationVar(&o.cooldown, "rate-limit-cooldown", discovery.DefaultCooldown,
		"How long a proxy reported rate_limited for a target is not leased for it (a longer retryAfterSeconds wins).")
	fs.StringVar(&o.leaseStore, "lease-store", leaseStoreMemory,
		"Where discovery keeps leases, cooldowns and refused requests: memory (this process only; lost on restart; one replica) or redis (shared by every replica, survives restarts).")
	fs.DurationVar(&o.storeTimeout, "lease-store-timeout", discovery.DefaultStoreTimeout,
		"Bound on each lease store call: with the store away, discovery answers 503 store_unavailable within it.")
	fs.StringVar(&o.redis.Address, "redis-address", "",
		"host:port of the Redis server (standalone or primary; not Redis Cluster), with --lease-store=redis.")
	fs.StringVar(&o.redis.Username, "redis-username", "", "Redis ACL user; empty: the default user.")
	fs.StringVar(&o.redis.PasswordFile, "redis-password-file", "",
		"File holding the Redis password (a mounted Secret key), read again for every new connection so a rotated Secret needs no restart.")
	fs.BoolVar(&o.redis.TLS, "redis-tls", false, "Connect to Redis over TLS.")
	fs.StringVar(&o.redis.CAFile, "redis-tls-ca-file", "", "PEM file of CAs trusted for Redis's certificate, added to the system roots.")
	fs.StringVar(&o.redis.ServerName, "redis-tls-server-name", "", "Name checked in Redis's certificate; default: the host of --redis-address.")
	fs.IntVar(&o.redis.DB, "redis-db", 0, "Redis database number.")
	fs.StringVar(&o.redisKeyPrefix, "redis-key-prefix", redisstore.DefaultKeyPrefix,
		"Prefix of every key the operator writes in Redis; operators sharing one Redis need prefixes of their own.")
	fs.StringVar(&o.credentialsNamespace, "credentials-namespace", "",
		"namespace where the operator keeps the proxy credentials it generates per provider instance and the record of each instance's. Default: the operator's namespace.")
	fs.StringVar(&o.tokenSecret, "discovery-token-secret", "",
		"namespace/name of the Secret whose key \"token\" is the discovery API's bearer token. Default: discovery-token in the operator's namespace. The operator creates it with a random token when it is missing.")
	fs.StringVar(&o.discoveryAuth, "discovery-auth", authRequired,
		"required: the discovery API and the gateway ask every client for a token (a missing or empty token Secret refuses everyone); none: the API serves unauthenticated and hands out no proxy credentials, and the gateway refuses everyone.")
	fs.StringVar(&o.tenantAudience, "tenant-audience", tenant.DefaultAudience,
		"Audience a crawler team's ServiceAccount token must be issued for: such a token is accepted beside the discovery token, and RBAC (create on proxypools/lease, proxies/lease) says which proxies it may lease. Empty: the discovery token only.")
	fs.StringVar(&o.ledgerFile, "ledger-file", "",
		"File the ledger (every lease and gateway tunnel: tenant, session, proxy, exit IP, target, start, end, bytes) is appended to as JSON lines. Empty: the operator's log, under the logger \"ledger\".")
	fs.DurationVar(&o.ledgerRetention, "ledger-retention", discovery.DefaultLedgerRetention,
		"How long the lease store keeps ledger records for GET /v1/attribution (the memory store keeps at most the last 50000).")
	fs.DurationVar(&o.tenantReviewTTL, "tenant-review-ttl", kubeauth.DefaultReviewTTL,
		"How long the API server's answers on a ServiceAccount token and on what it may lease are reused: a revoked RoleBinding or a deleted ServiceAccount stops leases within it.")
	fs.IntVar(&o.maxConcurrentReconciles, "max-concurrent-reconciles", controllers.DefaultMaxConcurrentReconciles,
		"Proxies reconciled at once (never the same Proxy twice); each reconcile makes at most one provider call.")
	fs.Float64Var(&o.kubeAPIQPS, "kube-api-qps", controllers.DefaultKubeAPIQPS,
		"Sustained requests per second the operator may send the API server (client-side limit).")
	fs.IntVar(&o.kubeAPIBurst, "kube-api-burst", controllers.DefaultKubeAPIBurst,
		"Requests the operator may send the API server in a burst above --kube-api-qps.")
	fs.DurationVar(&o.instanceResyncInterval, "instance-resync-interval", controllers.DefaultInstanceResyncInterval,
		"How often the instances of Ready proxies that no watch covers (gcp VMs) are listed again, one List per provider instance, so a VM terminated or deleted behind the operator's back is replaced (jittered by 20%).")
	fs.DurationVar(&o.syncPeriod, "sync-period", controllers.DefaultSyncPeriod,
		"How often the manager's informers resync every cached object, reconciling every Proxy again.")
	fs.DurationVar(&o.unhealthyReplaceAfter, "unhealthy-replace-after", controllers.DefaultUnhealthyReplaceAfter,
		"How long a Managed proxy may stay Unhealthy without a break before its instance is replaced; 0 never replaces for failing probes. A Proxy's spec.healthCheck.replaceAfter overrides it.")
	fs.DurationVar(&o.poolAutoscaleInterval, "pool-autoscale-interval", pool.DefaultAutoscaleInterval,
		"How often an autoscaled ProxyPool reads its demand from the discovery API and resizes.")
	fs.Float64Var(&o.maxUnhealthyShare, "max-unhealthy-share", controllers.DefaultMaxUnhealthyShare,
		"When more than this share (0-1] of the Managed proxies probed against one URL are Unhealthy at once (3 at least), the probe target is suspected and none of them is replaced.")
	fs.IntVar(&o.maxReplacementsInFlight, "max-replacements-in-flight", controllers.DefaultMaxReplacementsInFlight,
		"Unhealthy proxies being replaced at once, per provider instance; more wait their turn.")
	fs.StringVar(&o.gateway.Addr, "gateway-bind-address", "0",
		"Address the rotating gateway (an HTTP proxy crawlers point at: http://<session>:<discovery token>@<address>) listens on; \"0\" turns it off. Needs the discovery API.")
	fs.IntVar(&o.gateway.MaxTunnels, "gateway-max-tunnels", gateway.DefaultMaxTunnels,
		"Tunnels and plain requests the gateway carries at once; beyond it a client waits up to 2s, then gets 503 with Retry-After.")
	fs.IntVar(&o.gateway.Attempts, "gateway-attempts", gateway.DefaultAttempts, "Upstream proxies one tunnel tries before the gateway answers 502.")
	fs.DurationVar(&o.gateway.ConnectTimeout, "gateway-connect-timeout", gateway.DefaultConnectTimeout, "Time to reach an upstream proxy and get its CONNECT answer.")
	fs.DurationVar(&o.gateway.IdleTimeout, "gateway-idle-timeout", gateway.DefaultIdleTimeout, "A tunnel that carries nothing either way for this long is closed.")
	fs.DurationVar(&o.gateway.MaxTunnelLifetime, "gateway-max-tunnel-lifetime", gateway.DefaultMaxTunnelLifetime, "Any tunnel is closed at this age.")
	fs.DurationVar(&o.gateway.SessionIdle, "gateway-session-idle", gateway.DefaultSessionIdle,
		"A gateway session's route (its own proxy, its detours) is forgotten this long after its last tunnel.")
	fs.DurationVar(&o.gateway.PaceWait, "gateway-pace-wait", gateway.DefaultPaceWait,
		"How long the gateway holds a tunnel or request for its host's next paced slot; beyond it (or with 0, at once) the client gets 429 with Retry-After and Proxy-Status.")
	fs.DurationVar(&o.gateway.PacedTunnelLifetime, "gateway-paced-tunnel-lifetime", gateway.DefaultPacedTunnelLifetime,
		"A tunnel to a paced host is closed at this age: the gateway paces tunnels, not the requests a keep-alive tunnel carries.")
	fs.BoolVar(&o.adaptivePacing, "adaptive-pacing", true,
		"Pace each host by what its push-backs taught (429 or 503 reported through the API, or seen by the gateway on plain HTTP): slower on push-back, faster slowly without.")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "",
		"Path of a kubeconfig. Default: $KUBECONFIG, the in-cluster config, then ~/.kube/config.")
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
	var errs []error
	for _, a := range []struct{ flag, value string }{
		{"metrics-bind-address", o.metricsAddr},
		{"health-probe-bind-address", o.probeAddr},
		{"pprof-bind-address", o.pprofAddr},
		{"discovery-bind-address", o.discoveryAddr},
		{"gateway-bind-address", o.gateway.Addr},
	} {
		if err := validateBindAddress(a.value); err != nil {
			errs = append(errs, fmt.Errorf("%w: --%s: %w", errUsage, a.flag, err))
		}
	}
	if o.gcInterval <= 0 {
		errs = append(errs, fmt.Errorf("%w: --gc-interval must be positive, got %s", errUsage, o.gcInterval))
	}
	if o.gcGracePeriod < 0 {
		errs = append(errs, fmt.Errorf("%w: --gc-grace-period must not be negative, got %s", errUsage, o.gcGracePeriod))
	}
	if u, err := url.Parse(o.health.URL); err != nil || u.Scheme != "https" || u.Host == "" {
		errs = append(errs, fmt.Errorf("%w: --health-probe-url %q must be an absolute https URL: the probe proves a TLS tunnel", errUsage, o.health.URL))
	}
	for _, d := range []struct {
		flag  string
		value time.Duration
	}{{"health-interval", o.health.Interval}, {"health-timeout", o.health.Timeout}} {
		if d.value <= 0 {
			errs = append(errs, fmt.Errorf("%w: --%s must be positive, got %s", errUsage, d.flag, d.value))
		}
	}
	for _, n := range []struct {
		flag  string
		value int
	}{{"health-failure-threshold", o.health.FailureThreshold}, {"health-success-threshold", o.health.SuccessThreshold}, {"health-workers", o.healthWorkers}} {
		if n.value < 1 {
			errs = append(errs, fmt.Errorf("%w: --%s must be at least 1, got %d", errUsage, n.flag, n.value))
		}
	}
	if o.maxConcurrentReconciles < 1 {
		errs = append(errs, fmt.Errorf("%w: --max-concurrent-reconciles must be at least 1, got %d", errUsage, o.maxConcurrentReconciles))
	}
	if o.kubeAPIQPS <= 0 || o.kubeAPIBurst < 1 {
		errs = append(errs, fmt.Errorf("%w: --kube-api-qps must be positive and --kube-api-burst at least 1, got %g and %d", errUsage, o.kubeAPIQPS, o.kubeAPIBurst))
	}
	if o.leaseMaxTTL < time.Second || o.cooldown < 0 {
		errs = append(errs, fmt.Errorf("%w: --lease-max-ttl must be at least 1s and --rate-limit-cooldown not negative", errUsage))
	}
	for _, d := range []struct {
		flag  string
		value time.Duration
	}{{"instance-resync-interval", o.instanceResyncInterval}, {"sync-period", o.syncPeriod}, {"pool-autoscale-interval", o.poolAutoscaleInterval}} {
		if d.value <= 0 {
			errs = append(errs, fmt.Errorf("%w: --%s must be positive, got %s", errUsage, d.flag, d.value))
		}
	}
	if o.unhealthyReplaceAfter < 0 {
		errs = append(errs, fmt.Errorf("%w: --unhealthy-replace-after must not be negative (0 turns replacement off), got %s", errUsage, o.unhealthyReplaceAfter))
	}
	if !(o.maxUnhealthyShare > 0 && o.maxUnhealthyShare <= 1) {
		errs = append(errs, fmt.Errorf("%w: --max-unhealthy-share must be a share in (0, 1], got %g", errUsage, o.maxUnhealthyShare))
	}
	if o.maxReplacementsInFlight < 1 {
		errs = append(errs, fmt.Errorf("%w: --max-replacements-in-flight must be at least 1, got %d", errUsage, o.maxReplacementsInFlight))
	}
	errs = append(errs, checkGateway(o))
	o.redis.Timeout = o.storeTimeout // Redis's dial, reads and writes share the bound
	errs = append(errs, checkLeaseStore(fs, o))
	if o.tokenSecret == "" {
		o.tokenSecret = operatorNamespace() + "/discovery-token"
	}
	if o.credentialsNamespace == "" {
		o.credentialsNamespace = operatorNamespace()
	}
	if errs1123 := validation.IsDNS1123Label(o.credentialsNamespace); len(errs1123) > 0 {
		errs = append(errs, fmt.Errorf("%w: --credentials-namespace %q is not a namespace name: %s", errUsage, o.credentialsNamespace, strings.Join(errs1123, "; ")))
	}
	if o.ledgerRetention <= 0 {
		errs = append(errs, fmt.Errorf("%w: --ledger-retention must be positive, got %s", errUsage, o.ledgerRetention))
	}
	if o.tenantReviewTTL <= 0 {
		errs = append(errs, fmt.Errorf("%w: --tenant-review-ttl must be positive, got %s", errUsage, o.tenantReviewTTL))
	}
	if o.discoveryAuth != authRequired && o.discoveryAuth != authNone {
		errs = append(errs, fmt.Errorf("%w: --discovery-auth must be %s or %s, got %q", errUsage, authRequired, authNone, o.discoveryAuth))
	}
	if ns, name, ok := strings.Cut(o.tokenSecret, "/"); !ok || ns == "" || name == "" {
		errs = append(errs, fmt.Errorf("%w: --discovery-token-secret %q must be namespace/name", errUsage, o.tokenSecret))
	}
	if o.clusterID != "" && !providers.LabelValuePattern.MatchString(o.clusterID) {
		errs = append(errs, fmt.Errorf("%w: --cluster-id %q must be 1-63 lowercase letters, digits, '-' or '_': it is a label value on every instance, in Kubernetes and in GCE", errUsage, o.clusterID))
	}
	if o.operatorID == "" {
		o.operatorID = providers.OperatorID(operatorNamespace(), operatorName())
	}
	if !providers.LabelValuePattern.MatchString(o.operatorID) {
		errs = append(errs, fmt.Errorf("%w: --operator-id %q must be 1-63 lowercase letters, digits, '-' or '_': it is a label value on every instance, in Kubernetes and in GCE", errUsage, o.operatorID))
	}
	scope, err := parseScope(*watchNamespaces)
	o.scope = scope
	if err != nil {
		errs = append(errs, fmt.Errorf("%w: --watch-namespaces: %w", errUsage, err))
	}
	if errs1123 := validation.IsDNS1123Subdomain(o.leaderElectionID); len(errs1123) > 0 {
		errs = append(errs, fmt.Errorf("%w: --leader-election-id %q is not a Lease name: %s", errUsage, o.leaderElectionID, strings.Join(errs1123, "; ")))
	}
	return o, errors.Join(errs...)
}

// checkGateway rejects gateway settings it could not run with.
func checkGateway(o options) error {
	if o.gateway.Addr == "0" {
		return nil
	}
	var errs []error
	if o.discoveryAddr == "0" {
		errs = append(errs, fmt.Errorf("%w: --gateway-bind-address needs the discovery API (its token, view and lease store): --discovery-bind-address must not be \"0\"", errUsage))
	}
	for _, n := range []struct {
		flag  string
		value int
	}{{"gateway-max-tunnels", o.gateway.MaxTunnels}, {"gateway-attempts", o.gateway.Attempts}} {
		if n.value < 1 {
			errs = append(errs, fmt.Errorf("%w: --%s must be at least 1, got %d", errUsage, n.flag, n.value))
		}
	}
	for _, d := range []struct {
		flag  string
		value time.Duration
	}{
		{"gateway-connect-timeout", o.gateway.ConnectTimeout}, {"gateway-idle-timeout", o.gateway.IdleTimeout},
		{"gateway-max-tunnel-lifetime", o.gateway.MaxTunnelLifetime}, {"gateway-session-idle", o.gateway.SessionIdle},
		{"gateway-paced-tunnel-lifetime", o.gateway.PacedTunnelLifetime},
	} {
		if d.value <= 0 {
			errs = append(errs, fmt.Errorf("%w: --%s must be positive, got %s", errUsage, d.flag, d.value))
		}
	}
	if o.gateway.PaceWait < 0 {
		errs = append(errs, fmt.Errorf("%w: --gateway-pace-wait must not be negative, got %s", errUsage, o.gateway.PaceWait))
	}
	return errors.Join(errs...)
}

// Lease store backends.
const (
	leaseStoreMemory = "memory"
	leaseStoreRedis  = "redis"
)

// checkLeaseStore checks --lease-store and the Redis flags together: a
// Redis flag given with the memory store is a mistake worth naming, not a
// setting to ignore.
func checkLeaseStore(fs *flag.FlagSet, o options) error {
	switch o.leaseStore {
	case leaseStoreMemory:
		var set []string
		fs.Visit(func(f *flag.Flag) {
			if strings.HasPrefix(f.Name, "redis-") {
				set = append(set, "--"+f.Name)
			}
		})
		if len(set) > 0 {
			return fmt.Errorf("%w: %s given with --lease-store=memory: add --lease-store=redis", errUsage, strings.Join(set, ", "))
		}
		if o.storeTimeout <= 0 {
			return fmt.Errorf("%w: --lease-store-timeout must be positive, got %s", errUsage, o.storeTimeout)
		}
	case leaseStoreRedis:
		if o.redis.Address == "" {
			return fmt.Errorf("%w: --lease-store=redis needs --redis-address host:port", errUsage)
		}
		if o.redisKeyPrefix == "" {
			return fmt.Errorf("%w: --redis-key-prefix must not be empty", errUsage)
		}
		if err := o.redis.Check(); err != nil {
			return fmt.Errorf("%w: %w", errUsage, err)
		}
	default:
		return fmt.Errorf("%w: --lease-store must be %s or %s, got %q", errUsage, leaseStoreMemory, leaseStoreRedis, o.leaseStore)
	}
	return nil
}

// validateBindAddress accepts "0" (disabled) or host:port with a numeric port.
func validateBindAddress(addr string) error {
	if addr == "0" {
		return nil
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not host:port or \"0\": %w", addr, err)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("%q has port %q, want a number 0-65535", addr, port)
	}
	return nil
}

// run starts the operator and blocks until ctx ends. Every check that needs
// no cluster (flags, the providers file) runs before connecting, so a bad
// command line fails fast and offline.
func run(ctx context.Context, args []string, output io.Writer) error {
	opts, err := parseFlags(args, output)
	if err != nil {
		return err
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts.zap)))
	log := ctrl.Log.WithName("setup")

	var providersConfig providers.Config
	if opts.providersConfig != "" {
		if providersConfig, err = providers.LoadConfig(opts.providersConfig); err != nil {
			return fmt.Errorf("--providers-config: %w", err)
		}
	}
	// Every provider's settings are checked before anything connects, so an
	// offline start with a bad file reports the file.
	if err := providerRegistry.Check(providersConfig); err != nil {
		return fmt.Errorf("--providers-config %s: %w", opts.providersConfig, err)
	}
	roots, err := probeRoots(opts.healthCABundle)
	if err != nil {
		return err
	}
	restConfig, err := loadRESTConfig(opts.kubeconfig)
	if err != nil {
		return err
	}
	restConfig.QPS, restConfig.Burst = float32(opts.kubeAPIQPS), opts.kubeAPIBurst
	mgr, err := newManager(restConfig, opts)
	if err != nil {
		return err
	}
	providerSet, err := providerRegistry.Build(providersConfig, providers.Dependencies{Client: mgr.GetClient()})
	if err != nil {
		return fmt.Errorf("--providers-config %s: %w", opts.providersConfig, err)
	}
	clusterID := opts.clusterID
	if clusterID == "" {
		if clusterID, err = defaultClusterID(ctx, mgr.GetAPIReader(), opts.scope, operatorNamespace()); err != nil {
			return err
		}
	}
	owner := providers.Owner{ClusterID: clusterID, OperatorID: opts.operatorID}
	// Proxy credentials are read from a cache of their own, holding only
	// Secrets labelled crawl.example.com/proxy-credentials=true: in the
	// watched namespaces (the ones Proxies name) and the credentials
	// namespace (the generated ones and the records).
	credentialsCache, err := cache.New(restConfig, scopedCache(credentials.CacheOptions(cache.Options{
		Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper(), SyncPeriod: &opts.syncPeriod,
	}), opts.scope, opts.credentialsNamespace))
	if err != nil {
		return fmt.Errorf("creating the credentials cache: %w", err)
	}
	if err := mgr.Add(everyReplica{credentialsCache}); err != nil {
		return fmt.Errorf("adding the credentials cache: %w", err)
	}
	creds := credentials.Reader{Client: credentialsCache}
	recorder := mgr.GetEventRecorder("egress-proxies-operator")
	// One channel of Proxies to look at now: verdict changes from the
	// health engine, lost instances from the instance watcher.
	triggers := make(chan event.GenericEvent, 1024)
	engine := health.NewEngine(health.Options{
		Cache:    mgr.GetCache(),
		Client:   mgr.GetClient(),
		Prober:   health.NewHTTPProber(roots),
		Defaults: opts.health,
		Workers:  opts.healthWorkers,
		Clock:    clock.RealClock{},
		Jitter:   health.DefaultJitter,
		Recorder: recorder,
		Notify:   triggers,

		Credentials:          creds,
		CredentialsNamespace: opts.credentialsNamespace,
	})
	if err := mgr.Add(engine); err != nil {
		return fmt.Errorf("adding the health engine: %w", err)
	}
	if err := (&controllers.ProxyReconciler{
		Client:    mgr.GetClient(),
		Providers: providerSet,
		Owner:     owner,
		Recorder:  recorder,
		Workers:   opts.maxConcurrentReconciles,
		Health:    engineHealth{engine},
		Replacement: controllers.ReplacementPolicy{
			After: opts.unhealthyReplaceAfter, MaxUnhealthyShare: opts.maxUnhealthyShare,
		},
		MaxReplacementsInFlight: opts.maxReplacementsInFlight,
		Triggers:                triggers,
		CredentialsCache:        credentialsCache,
		CredentialsNamespace:    opts.credentialsNamespace,
	}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the Proxy controller: %w", err)
	}
	if err := (&controllers.CrawlTargetReconciler{Client: mgr.GetClient()}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the CrawlTarget controller: %w", err)
	}
	if err := mgr.Add(&controllers.InstanceWatcher{
		Client:    mgr.GetClient(),
		Providers: providerSet,
		Owner:     owner,
		Interval:  opts.instanceResyncInterval,
		Triggers:  triggers,
	}); err != nil {
		return fmt.Errorf("adding the instance watcher: %w", err)
	}
	if err := mgr.Add(&controllers.OrphanCollector{
		Client:      mgr.GetClient(),
		Providers:   providerSet,
		Owner:       owner,
		Scope:       opts.scope,
		Interval:    opts.gcInterval,
		GracePeriod: opts.gcGracePeriod,
		DryRun:      opts.gcDryRun,
		Clock:       clock.RealClock{},

		Credentials:          credentialsCache,
		Deleter:              mgr.GetClient(),
		CredentialsNamespace: opts.credentialsNamespace,
	}); err != nil {
		return fmt.Errorf("adding orphan GC: %w", err)
	}
	if err := mgr.Add(&controllers.FirewallKeeper{Providers: providerSet, Owner: owner}); err != nil {
		return fmt.Errorf("adding the firewall keeper: %w", err)
	}
	if err := ctrlmetrics.Registry.Register(health.ProxiesCollector{Reader: mgr.GetClient()}); err != nil {
		return fmt.Errorf("registering the proxies metric: %w", err)
	}
	if err := ctrlmetrics.Registry.Register(engine.LastProbeCollector()); err != nil {
		return fmt.Errorf("registering the last-probe metric: %w", err)
	}
	pools := &pool.Reconciler{
		Client:            mgr.GetClient(),
		Recorder:          recorder,
		AutoscaleInterval: opts.poolAutoscaleInterval,
	}
	if opts.discoveryAddr != "0" {
		server, err := addDiscovery(ctx, mgr, restConfig, engine, creds, opts)
		if err != nil {
			return err
		}
		pools.Demand = poolDemand{server}
	}
	if err := pools.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the ProxyPool controller: %w", err)
	}
	log.Info("starting manager", "clusterID", owner.ClusterID, "operatorID", owner.OperatorID,
		"namespaces", scopeForLog(opts.scope), "providers", providerSet.Names())
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("running manager: %w", err)
	}
	return nil
}

// providerRegistry is every provider type this build knows: the one place a
// concrete provider is named.
var providerRegistry = providers.Registry{
	kubernetes.Type: kubernetes.New,
	gcp.Type:        gcp.New,
}

// addDiscovery adds the discovery API on every replica: a view of Proxies
// fed by the manager's informer, the health engine's verdicts, the lease
// store (memory, or Redis shared by the replicas), and a bearer token
// followed through a cache that holds only the token Secret. The manager's
// /readyz then also waits for the view and the store.
func addDiscovery(ctx context.Context, mgr manager.Manager, restConfig *rest.Config, engine *health.Engine, creds credentials.Reader, opts options) (*discovery.Server, error) {
	view := discovery.NewView(engineHealth{engine}, opts.credentialsNamespace)
	proxyInformer, err := mgr.GetCache().GetInformer(ctx, &crawlv1alpha1.Proxy{})
	if err != nil {
		return nil, fmt.Errorf("getting the Proxy informer for discovery: %w", err)
	}
	reg, err := proxyInformer.AddEventHandler(view.Handler())
	if err != nil {
		return nil, fmt.Errorf("feeding the discovery view: %w", err)
	}
	policies := discovery.NewPolicyIndex()
	policyInformer, err := mgr.GetCache().GetInformer(ctx, &crawlv1alpha1.CrawlTarget{})
	if err != nil {
		return nil, fmt.Errorf("getting the CrawlTarget informer for discovery: %w", err)
	}
	policiesReg, err := policyInformer.AddEventHandler(policies.Handler())
	if err != nil {
		return nil, fmt.Errorf("feeding discovery's politeness policies: %w", err)
	}
	quotas := discovery.NewQuotaIndex()
	quotaInformer, err := mgr.GetCache().GetInformer(ctx, &crawlv1alpha1.TenantQuota{})
	if err != nil {
		return nil, fmt.Errorf("getting the TenantQuota informer for discovery: %w", err)
	}
	quotasReg, err := quotaInformer.AddEventHandler(quotas.Handler())
	if err != nil {
		return nil, fmt.Errorf("feeding discovery's tenant quotas: %w", err)
	}

	tokens, waitForTokens, err := addTokenSource(ctx, mgr, restConfig, opts)
	if err != nil {
		return nil, err
	}
	var tenants discovery.Tenants
	if opts.discoveryAuth == authRequired && opts.tenantAudience != "" {
		reviewer, err := kubeauth.NewReviewerFor(restConfig, mgr.GetHTTPClient(), opts.tenantAudience, opts.tenantReviewTTL)
		if err != nil {
			return nil, fmt.Errorf("reviewing crawler teams' ServiceAccount tokens: %w", err)
		}
		tenants = tenant.NewChecker(reviewer)
	}

	store, storeMetrics, err := newLeaseStore(opts)
	if err != nil {
		return nil, err
	}
	ledger, err := newLedgerSink(opts)
	if err != nil {
		return nil, err
	}
	server := discovery.NewServer(discovery.Options{
		Addr:            opts.discoveryAddr,
		DefaultTTL:      discovery.DefaultTTL,
		MaxTTL:          opts.leaseMaxTTL,
		DefaultCooldown: opts.cooldown,
		Store:           store,
		StoreTimeout:    opts.storeTimeout,
		View:            view,
		Tokens:          tokens,
		Ready:           func() bool { return reg.HasSynced() && policiesReg.HasSynced() && quotasReg.HasSynced() },
		WaitForTokens:   waitForTokens,
		Clock:           clock.RealClock{},
		Credentials:     creds,
		Politeness:      discovery.Politeness{Policies: policies, Adaptive: opts.adaptivePacing},
		Tenants:         tenants,
		Quotas:          quotas,
		Ledger:          ledger,
		LedgerRetention: opts.ledgerRetention,
	})
	storeMetrics = append(storeMetrics, server.LearnedPaceCollector(policies, opts.storeTimeout))
	for _, c := range append(discovery.Collectors(), storeMetrics...) {
		if err := ctrlmetrics.Registry.Register(c); err != nil {
			return nil, fmt.Errorf("registering discovery metrics: %w", err)
		}
	}
	if err := mgr.Add(server); err != nil {
		return nil, fmt.Errorf("adding the discovery API: %w", err)
	}
	if err := mgr.AddReadyzCheck("discovery", server.ReadyCheck); err != nil {
		return nil, fmt.Errorf("adding the discovery readiness check: %w", err)
	}
	if opts.gateway.Addr != "0" {
		gwOpts := opts.gateway
		if gwOpts.PaceWait == 0 {
			gwOpts.PaceWait = -1 // never wait: the gateway's zero is its default
		}
		gwOpts.Upstreams = server.Tunnels()
		gw := gateway.New(gwOpts)
		server.OnSessionReport(gw.OnSessionReport)
		for _, c := range gateway.Collectors() {
			if err := ctrlmetrics.Registry.Register(c); err != nil {
				return nil, fmt.Errorf("registering gateway metrics: %w", err)
			}
		}
		if err := mgr.Add(gw); err != nil {
			return nil, fmt.Errorf("adding the rotating gateway: %w", err)
		}
	}
	return server, nil
}

// newLeaseStore builds the store --lease-store names, with its metrics.
func newLeaseStore(opts options) (discovery.Store, []prometheus.Collector, error) {
	if opts.leaseStore != leaseStoreRedis {
		store := discovery.NewMemoryStore(clock.RealClock{})
		return store, store.Collectors(), nil
	}
	client, err := redisstore.NewClient(opts.redis)
	if err != nil {
		return nil, nil, err
	}
	store := redisstore.New(redisstore.Options{Client: client, KeyPrefix: opts.redisKeyPrefix})
	return store, store.Collectors(opts.storeTimeout), nil
}

// newLedgerSink is where ledger records are written: --ledger-file,
// opened for appending (and created), or the operator's log.
func newLedgerSink(opts options) (discovery.LedgerSink, error) {
	log := ctrl.Log.WithName("ledger")
	if opts.ledgerFile == "" {
		return discovery.LogSink{Log: log}, nil
	}
	f, err := os.OpenFile(opts.ledgerFile, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening --ledger-file: %w", err)
	}
	return discovery.NewJSONLines(f, log), nil
}

// The values of --discovery-auth.
const (
	authRequired = "required"
	authNone     = "none"
)

// addTokenSource is the discovery token: with --discovery-auth=none no
// token at all; otherwise the token Secret, followed through a cache that
// holds only it, and kept in place by a TokenKeeper (created with a random
// token when missing). The wait is nil when there is nothing to wait for.
func addTokenSource(ctx context.Context, mgr manager.Manager, restConfig *rest.Config, opts options) (discovery.TokenSource, func(context.Context) bool, error) {
	if opts.discoveryAuth == authNone {
		return discovery.StaticToken(""), nil, nil
	}
	ns, name, _ := strings.Cut(opts.tokenSecret, "/")
	token, tokenCache, err := discovery.WatchTokenSecret(ctx, restConfig, mgr.GetScheme(), ns, name)
	if err != nil {
		return nil, nil, err
	}
	if err := mgr.Add(everyReplica{tokenCache}); err != nil {
		return nil, nil, fmt.Errorf("adding the discovery token cache: %w", err)
	}
	keeper := &discovery.TokenKeeper{Client: mgr.GetClient(), Key: types.NamespacedName{Namespace: ns, Name: name}, Token: token, Synced: tokenCache.WaitForCacheSync}
	if err := mgr.Add(keeper); err != nil {
		return nil, nil, fmt.Errorf("adding the discovery token keeper: %w", err)
	}
	return token, tokenCache.WaitForCacheSync, nil
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
	got, err := d.server.PoolDemand(ctx, namespace, name)
	return pool.Demand{ActiveLeases: got.ActiveLeases, LastRefused: got.LastRefused}, err
}

// engineHealth lets discovery read the health engine's verdicts. On a
// replica that is not the leader the engine probes nothing, so nothing is
// known and discovery falls back to the Healthy condition in status.
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
	return controllers.ProxyHealth{UnhealthySince: h.UnhealthySince, URL: h.URL, Probed: h.Probed, Unhealthy: h.Unhealthy}, true
}

// operatorNamespace is the namespace the operator runs in: $POD_NAMESPACE,
// the service account's namespace in-cluster, or the default deploy
// namespace.
func operatorNamespace() string {
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns
	}
	if data, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace"); err == nil {
		if ns := strings.TrimSpace(string(data)); ns != "" {
			return ns
		}
	}
	return "egress-proxies-operator-system"
}

// probeRoots is the system roots plus --health-ca-bundle, if given.
func probeRoots(bundle string) (*x509.CertPool, error) {
	if bundle == "" {
		return nil, nil // the system roots
	}
	pem, err := os.ReadFile(bundle)
	if err != nil {
		return nil, fmt.Errorf("--health-ca-bundle: %w", err)
	}
	roots, err := x509.SystemCertPool()
	if err != nil {
		roots = x509.NewCertPool()
	}
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--health-ca-bundle %s: no PEM certificate in it", bundle)
	}
	return roots, nil
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
	metricsOpts := metricsserver.Options{
		BindAddress:   opts.metricsAddr,
		SecureServing: opts.metricsSecure,
	}
	if opts.metricsSecure {
		metricsOpts.FilterProvider = kubeauth.WithAuthenticationAndAuthorization
	}
	if !opts.enableHTTP2 {
		metricsOpts.TLSOpts = []func(*tls.Config){func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }}
	}
	mgr, err := ctrl.NewManager(restConfig, ctrl.Options{
		Scheme:                 newScheme(),
		Cache:                  scopedCache(cacheOptions(opts.syncPeriod), opts.scope),
		Metrics:                metricsOpts,
		HealthProbeBindAddress: opts.probeAddr,
		PprofBindAddress:       opts.pprofAddr,
		LeaderElection:         opts.leaderElect,
		LeaderElectionID:       opts.leaderElectionID,
		// In the operator's namespace: controller-runtime would otherwise
		// find it only in-cluster, and --leader-elect would fail on a laptop.
		LeaderElectionNamespace: operatorNamespace(),
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
// which are a large share of each cached object. (An update sent without
// them leaves the server's as they are.) Proxies, the objects there are
// thousands of, also share the strings and maps a fleet repeats.
func cacheOptions(syncPeriod time.Duration) cache.Options {
	byObject := controllers.CacheByObject()
	maps.Copy(byObject, kubernetes.CacheByObject())
	byObject[&crawlv1alpha1.Proxy{}] = cache.ByObject{Transform: intern.ProxyTransform(intern.NewStringMaps(intern.DefaultStringMaps))}
	return cache.Options{ByObject: byObject, DefaultTransform: cache.TransformStripManagedFields(), SyncPeriod: &syncPeriod}
}
