package operator

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Defaults of the manager's flags.
const (
	// DefaultKubeAPIQPS and DefaultKubeAPIBurst are the operator's limits
	// on API server requests, most of which are the reconciler's writes.
	// At controller-runtime's 20/s a thousand Managed proxies would take
	// minutes to bring up; 50/s sustained stays well inside what an API
	// server's priority and fairness gives one workload, and the burst
	// absorbs a batch of new Proxies.
	DefaultKubeAPIQPS   = 50
	DefaultKubeAPIBurst = 100
	// DefaultSyncPeriod is how often the informers resync every cached
	// object, reconciling every Proxy again.
	DefaultSyncPeriod = 10 * time.Hour
)

// ManagerOptions are how the operator's controller-runtime manager runs:
// its endpoints, leader election and its client's limits.
type ManagerOptions struct {
	MetricsAddr      string
	MetricsSecure    bool
	EnableHTTP2      bool
	ProbeAddr        string
	PprofAddr        string
	LeaderElect      bool
	LeaderElectionID string
	Kubeconfig       string
	KubeAPIQPS       float64
	KubeAPIBurst     int
	SyncPeriod       time.Duration
}

// AddFlags registers the manager's flags.
func (o *ManagerOptions) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.MetricsAddr, "metrics-bind-address", ":8443",
		"Address the metrics endpoint binds to; \"0\" disables it.")
	fs.BoolVar(&o.MetricsSecure, "metrics-secure", true,
		"Serve metrics over HTTPS behind Kubernetes authentication and authorization.")
	fs.BoolVar(&o.EnableHTTP2, "enable-http2", false,
		"Allow HTTP/2 on the metrics server (off by default: HTTP/2 Rapid Reset and Stream Cancellation).")
	fs.StringVar(&o.PprofAddr, "pprof-bind-address", "0",
		"Address Go's /debug/pprof endpoints bind to, for profiling a running operator; \"0\" (the default) disables them. Keep it off a Service: profiles show internals.")
	fs.StringVar(&o.ProbeAddr, "health-probe-bind-address", ":8081",
		"Address the /healthz and /readyz endpoints bind to; \"0\" disables them.")
	fs.BoolVar(&o.LeaderElect, "leader-elect", false,
		"Elect a leader among replicas; the reconciler, health engine and GC run only on the leader.")
	fs.StringVar(&o.LeaderElectionID, "leader-election-id", Name()+".crawl.example.com",
		"Name of the leader election Lease in the operator's namespace; two releases in one namespace need two. Default: <$OPERATOR_NAME, or egress-proxies-operator>.crawl.example.com.")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", "",
		"Path of a kubeconfig. Default: $KUBECONFIG, the in-cluster config, then ~/.kube/config.")
	fs.Float64Var(&o.KubeAPIQPS, "kube-api-qps", DefaultKubeAPIQPS,
		"Sustained requests per second the operator may send the API server (client-side limit).")
	fs.IntVar(&o.KubeAPIBurst, "kube-api-burst", DefaultKubeAPIBurst,
		"Requests the operator may send the API server in a burst above --kube-api-qps.")
	fs.DurationVar(&o.SyncPeriod, "sync-period", DefaultSyncPeriod,
		"How often the manager's informers resync every cached object, reconciling every Proxy again.")
}

// Validate checks the manager's flags.
func (o *ManagerOptions) Validate() error {
	errs := []error{
		CheckBindAddress("metrics-bind-address", o.MetricsAddr),
		CheckBindAddress("health-probe-bind-address", o.ProbeAddr),
		CheckBindAddress("pprof-bind-address", o.PprofAddr),
	}
	if o.KubeAPIQPS <= 0 || o.KubeAPIBurst < 1 {
		errs = append(errs, fmt.Errorf("--kube-api-qps must be positive and --kube-api-burst at least 1, got %g and %d", o.KubeAPIQPS, o.KubeAPIBurst))
	}
	if o.SyncPeriod <= 0 {
		errs = append(errs, fmt.Errorf("--sync-period must be positive, got %s", o.SyncPeriod))
	}
	if bad := validation.IsDNS1123Subdomain(o.LeaderElectionID); len(bad) > 0 {
		errs = append(errs, fmt.Errorf("--leader-election-id %q is not a Lease name: %s", o.LeaderElectionID, strings.Join(bad, "; ")))
	}
	return errors.Join(errs...)
}

// CheckBindAddress accepts "0" (disabled) or host:port with a numeric port
// for the flag called name.
func CheckBindAddress(name, addr string) error {
	if addr == "0" {
		return nil
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--%s: %q is not host:port or \"0\": %w", name, addr, err)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("--%s: %q has port %q, want a number 0-65535", name, addr, port)
	}
	return nil
}
