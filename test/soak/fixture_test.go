//go:build soak

package soak

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/providers/aws/fakeec2"
	"github.com/example/egress-proxies-operator/providers/gcp/fakecompute"
	"github.com/example/egress-proxies-operator/test/cluster"
	"github.com/example/egress-proxies-operator/test/redisserver"
	"github.com/example/egress-proxies-operator/test/squid"
)

const (
	// namespace holds every soak Proxy.
	namespace = "soak"
	// gcpProviders are two gcp provider instances in one project on the
	// fake Compute API, as the shipped sample has gcp-eu and gcp-us: each
	// GC must keep to its own VMs.
	gcpProvider  = "gcp-soak"
	gcpProviderB = "gcp-soak-b"
	gcpZone      = "europe-west1-b"
	// awsProvider is an aws provider instance on the fake EC2 API beside
	// them: another cloud, whose Spot instances are interrupted.
	awsProvider        = "aws-soak"
	awsZoneA, awsZoneB = "eu-west-1a", "eu-west-1b"
	// kubernetesProviderB is a second kubernetes provider instance beside
	// the harness's own, in the same cluster.
	kubernetesProviderB = "kind-b"
	// externalSquids are the Squid processes the External Proxies point
	// at, several Proxies to each, as a shared upstream would be.
	externalSquids = 20
	token          = "soak-token"

	// The operator's settings for the soak: probes often enough that a
	// dead Squid is seen within seconds, leases short enough that many
	// expire during the run, and a GC that runs several times.
	healthInterval   = 5 * time.Second
	healthTimeout    = 2 * time.Second
	failureThreshold = 3
	cooldown         = 20 * time.Second
	leaseMaxTTL      = 30 * time.Second
	gcInterval       = 15 * time.Second
	gcGracePeriod    = 10 * time.Second
	// replaceAfter is how long a Managed proxy may stay Unhealthy before
	// it is replaced; the instance watcher lists the VMs this often.
	replaceAfter   = 30 * time.Second
	resyncInterval = 5 * time.Second
)

// poolKey is the attribute that tells the three groups of Proxy apart, for
// the load's selectors and the checks ("pool" itself is derived: the
// ProxyPool a member belongs to, of which each Managed group has two).
const poolKey = "group"

const (
	poolKubernetes = "k8s"
	// poolVM is the cloud VMs' group: gcp and aws members alike.
	poolVM       = "vm"
	poolExternal = "ext"
)

// world is everything the soak runs: the local cluster (API server, Squid
// pods), the fake Compute and EC2 APIs with in-process proxies on their
// VMs' addresses, the External Proxies' Squids and the operator process.
type world struct {
	cluster *cluster.Cluster
	fake    *fakecompute.Server
	vms     *cluster.VMRunner
	ec2     *fakeec2.Server
	ec2VMs  *cluster.VMRunner
	squids  []*externalSquid
	bin     string

	discoveryURL, probeAddr, metricsAddr string
	// redis is the shared lease store, and second the other replica, when
	// the soak runs two operators (-soak.replicas=2); nil otherwise.
	redis  *redisserver.Server
	second *replica

	mu       sync.Mutex
	operator *cluster.Operator
	// logs are every operator process's log, for the GC audit.
	logs []string
	// replacements adds up proxy_operator_replacements_total by cause over
	// the operator processes that were killed (counters die with them).
	replacements map[string]float64
	// operatorUp is false from just before a kill until the new process
	// answers: discovery requests that fail then are not held against it.
	operatorUp atomic.Bool
	restarts   int
	// restartedAt is when the operator was last killed: with the memory
	// store, what it remembered (burned IPs) died with it.
	restartedAt time.Time
}

// burnedSince is from when a burned IP is remembered: always on Redis,
// since the last restart with the memory store.
func (w *world) burnedSince() time.Time {
	if w.redis != nil {
		return time.Time{}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.restartedAt
}

// keepLogs copies, when the soak failed, every operator's log out of dir
// (which the test removes) and says where: a soak takes twenty minutes to
// replay, and its figures alone seldom tell why.
func keepLogs(t *testing.T, dir string) {
	if !t.Failed() {
		return
	}
	logs, _ := filepath.Glob(filepath.Join(dir, "operator-*.log"))
	kept, err := os.MkdirTemp("", "soak-logs-")
	if err != nil {
		t.Logf("keeping the operators' logs: %v", err)
		return
	}
	for _, log := range logs {
		if err := os.Rename(log, filepath.Join(kept, filepath.Base(log))); err != nil {
			t.Logf("keeping %s: %v", log, err)
		}
	}
	t.Logf("the operators' logs are kept in %s", kept)
}

func newWorld(t *testing.T) *world {
	t.Helper()
	dir := t.TempDir()
	t.Cleanup(func() { keepLogs(t, dir) })
	fake := fakecompute.New(clock.RealClock{}, fakecompute.Timings{Provisioning: time.Second, Staging: time.Second, Stopping: 2 * time.Second})
	t.Cleanup(fake.Close)
	ec2 := fakeec2.New()
	ec2API := httptest.NewServer(ec2)
	t.Cleanup(ec2API.Close)
	gcpSettings := func(name string) string { return cluster.GCPProvider(name, "soak", gcpZone, fake.URL) }
	c, err := cluster.Start(dir, cluster.Options{ExtraProviders: gcpSettings(gcpProvider) + gcpSettings(gcpProviderB) +
		cluster.AWSProvider(awsProvider, "eu-west-1", awsZoneA, ec2API.URL) + `- name: ` + kubernetesProviderB + `
  type: kubernetes
  settings:
    allowedSourceRanges: [127.0.0.0/8]
    deniedDestinationRanges: []
`})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	// Runs once every operator has stopped (cleanups run last first).
	t.Cleanup(func() {
		if races := c.DataRaces(); races != "" {
			t.Errorf("the operator (built with -race) found data races:\n%s", races)
		}
	})
	w := &world{cluster: c, fake: fake, vms: cluster.NewVMRunner(fake), ec2: ec2, ec2VMs: cluster.NewEC2Runner(ec2), replacements: map[string]float64{}}
	// New instances get released addresses back, as clouds hand a new VM
	// an IP someone released: a banned member's burned IP comes back.
	c.Runner.ReuseReleasedIPs(true)
	fake.ReuseReleasedIPs(true)
	for _, vms := range []*cluster.VMRunner{w.vms, w.ec2VMs} {
		go vms.Run(t.Context())
		t.Cleanup(vms.CloseAll)
	}

	for i := range externalSquids {
		s := &externalSquid{cfg: squid.Config{Address: fmt.Sprintf("127.5.0.%d", i+1), Port: int(crawlv1alpha1.DefaultPort)},
			dir: filepath.Join(dir, "external", strconv.Itoa(i))}
		if err := s.start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.stop)
		w.squids = append(w.squids, s)
	}

	ctx := context.Background()
	for _, obj := range []*corev1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: namespace}}} {
		if err := c.Env.Client.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Env.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: cluster.OperatorNamespace, Name: "discovery-token"},
		Data: map[string][]byte{"token": []byte(token)}}); err != nil {
		t.Fatal(err)
	}
	if w.bin, err = cluster.BuildRaceOperator(dir); err != nil {
		t.Fatal(err)
	}
	discovery := cluster.FreeAddr()
	w.discoveryURL, w.probeAddr, w.metricsAddr = "http://"+discovery, cluster.FreeAddr(), cluster.FreeAddr()
	if *soakReplicas > 1 {
		w.redis = redisserver.Start(t, "")
	}
	if err := w.startOperator(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.operator.Stop()
	})
	if w.redis != nil {
		w.second = &replica{w: w, discoveryURL: "http://" + cluster.FreeAddr(), probeAddr: cluster.FreeAddr(), metricsAddr: cluster.FreeAddr()}
		if err := w.second.start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(w.second.stop)
	}
	return w
}

// operatorArgs are the flags every operator process of the soak runs with.
func (w *world) operatorArgs(metricsAddr string) []string {
	args := []string{
		"--metrics-bind-address=" + metricsAddr, "--metrics-secure=false",
		"--health-interval=" + healthInterval.String(), "--health-timeout=" + healthTimeout.String(),
		"--health-failure-threshold=" + strconv.Itoa(failureThreshold),
		"--rate-limit-cooldown=" + cooldown.String(), "--lease-max-ttl=" + leaseMaxTTL.String(),
		"--gc-interval=" + gcInterval.String(), "--gc-grace-period=" + gcGracePeriod.String(),
		"--unhealthy-replace-after=" + replaceAfter.String(), "--instance-resync-interval=" + resyncInterval.String(),
		"--ban-check-interval=2s",
	}
	if w.redis != nil {
		args = append(args, "--leader-elect", "--lease-store=redis", "--redis-address="+w.redis.Addr, "--lease-store-timeout=500ms")
		if *soakShardProbes {
			args = append(args, "--health-shard-probes", "--health-shard-lease-duration="+shardLeaseDuration.String())
		}
	} else {
		// The memory store's ledger fills up to MaxMemoryLedger records by
		// design; a short retention keeps it from filling during the
		// run, so the memory check judges leaks alone.
		args = append(args, "--ledger-retention=1m")
	}
	return args
}

func (w *world) startOperator() error {
	op, err := w.cluster.StartOperator(w.bin, cluster.OperatorOptions{
		DiscoveryAddr: w.discoveryURL[len("http://"):], ProbeAddr: w.probeAddr,
		ExtraArgs: w.operatorArgs(w.metricsAddr),
	})
	if err != nil {
		return err
	}
	w.mu.Lock()
	w.operator = op
	w.logs = append(w.logs, op.Log)
	w.mu.Unlock()
	w.operatorUp.Store(true)
	return nil
}

// restartOperator kills the operator as a crash would and starts it again
// after pause; idle drops the crawlers' connections to the dead process.
func (w *world) restartOperator(pause time.Duration, idle func()) error {
	// What it replaced dies with it: count it first.
	w.keepReplacements(w.metricsAddr)
	w.operatorUp.Store(false)
	w.mu.Lock()
	w.operator.Kill()
	w.restarts++
	w.restartedAt = time.Now()
	w.mu.Unlock()
	time.Sleep(pause)
	// Connections kept alive to the dead process must not be reused.
	idle()
	return w.startOperator()
}

// currentOperator is the operator process running now.
func (w *world) currentOperator() *cluster.Operator {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.operator
}

// newProxy is External Proxy number i (the Managed ones are pool members).
func (w *world) newProxy(group string, i int) *crawlv1alpha1.Proxy {
	s := w.squids[i%len(w.squids)]
	return &crawlv1alpha1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: fmt.Sprintf("%s-%04d", group, i)},
		Spec: crawlv1alpha1.ProxySpec{Mode: crawlv1alpha1.ModeExternal, Attributes: map[string]string{poolKey: group},
			External: &crawlv1alpha1.ExternalEndpoint{Address: s.cfg.Address, Port: int32(s.cfg.Port)}},
	}
}

// externalSquid is a Squid an External Proxy points at; the soak kills and
// restarts it.
type externalSquid struct {
	cfg squid.Config
	dir string

	mu sync.Mutex
	sq *squid.Squid
}

func (s *externalSquid) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sq != nil && s.sq.Running() {
		return nil
	}
	sq, err := squid.StartProcess(s.cfg, s.dir)
	if err != nil {
		return err
	}
	s.sq = sq
	return nil
}

func (s *externalSquid) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sq != nil {
		s.sq.Stop()
	}
}

// httpClient is what the soak's crawlers use; each restart closes its idle
// connections.
var httpClient = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}

// keepReplacements adds the replacements of the process serving metrics on
// addr to those of processes gone, before it is killed.
func (w *world) keepReplacements(addr string) {
	now, err := replacementsAt(addr)
	if err != nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for cause, n := range now {
		w.replacements[cause] += n
	}
}

// replacementsNow is the running operators' proxy_operator_replacements_total
// by cause, beside their pools' proxy_operator_pool_replacements_total by
// cause with the prefix "pool/". With two replicas, whichever leads does
// the replacing: both are added up.
func (w *world) replacementsNow() (map[string]float64, error) {
	out, err := replacementsAt(w.metricsAddr)
	if err != nil || w.second == nil {
		return out, err
	}
	second, err := replacementsAt(w.second.metricsAddr)
	if err != nil {
		return nil, err
	}
	for cause, n := range second {
		out[cause] += n
	}
	return out, nil
}

func replacementsAt(metricsAddr string) (map[string]float64, error) {
	out, err := metricByLabel(metricsAddr, "proxy_operator_replacements_total", "cause")
	if err != nil {
		return nil, err
	}
	pools, err := metricByLabel(metricsAddr, "proxy_operator_pool_replacements_total", "cause")
	if err != nil {
		return nil, err
	}
	for cause, n := range pools {
		out[poolCause(cause)] = n
	}
	return out, nil
}

// poolCause is how the soak's figures name a pool's replacement cause.
func poolCause(cause string) string { return "pool/" + cause }

// metricByLabel sums a counter of the operator serving metrics on addr by
// one label.
func metricByLabel(addr, name, label string) (map[string]float64, error) {
	families, err := cluster.ScrapeMetrics("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	if f := families[name]; f != nil {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label {
					out[l.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	return out, nil
}
