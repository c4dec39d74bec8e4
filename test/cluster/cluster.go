// Package cluster runs the whole operator on one machine without Docker or
// kind: a real API server and etcd (built by `make envtest`) with the Proxy
// CRD, a pod runner that plays the kubelet for the kubernetes provider's
// Squid pods by running real Squid processes on loopback addresses, a local
// HTTPS probe target, and the operator binary as a process of its own. The
// e2e tests and `make demo` share it. Everything it starts ends when Stop is
// called. It is test support only; production code must never import it.
package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/example/egress-proxies-operator/test/testenv"
)

// OperatorNamespace is where the operator "runs": its token Secret lives
// here.
const OperatorNamespace = "egress-proxies-operator-system"

// ProviderName is the kubernetes provider instance the harness configures.
const ProviderName = "kind-local"

// The prices the harness gives ProviderName's proxies, for the usage's
// cost: per proxy-hour and per GiB carried (1 a second and 1 a MiB, so the
// short tunnels of a test cost more than the cost's rounding).
const (
	PriceProxyHour = 3600
	PriceGiB       = 1024
)

// Cluster is a running local cluster.
type Cluster struct {
	Env *testenv.Env
	// Dir holds the kubeconfig, the providers config, the probe target's CA
	// and every process's files.
	Dir           string
	Kubeconfig    string
	ProvidersFile string
	Target        *Target
	// Runner runs a real Squid per proxy pod; nil with Options.MarkPods.
	Runner *PodRunner
	// Marker marks proxy pods running behind in-process proxies; nil
	// unless Options.MarkPods.
	Marker         *PodMarker
	cancelRunner   context.CancelFunc
	runnerFinished chan struct{}
}

// Options change what Start runs.
type Options struct {
	// MarkPods runs proxy pods as in-process CONNECT proxies (PodMarker)
	// instead of real Squid processes: for benchmarks with thousands of
	// pods. Tests of Squid itself leave it false.
	MarkPods bool
	// ExtraProviders are appended, verbatim, to the providers config's list
	// (a gcp instance pointing at a fake Compute API, say).
	ExtraProviders string
}

// Start starts a cluster with its files under dir.
func Start(dir string, opts Options) (*Cluster, error) {
	c := &Cluster{Dir: dir}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var err error
	if c.Target, err = StartTarget(dir); err != nil {
		return nil, err
	}
	if c.Env, err = testenv.New(); err != nil {
		c.Target.Close()
		return nil, err
	}
	ctx := context.Background()
	if err := c.Env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: OperatorNamespace}}); err != nil {
		c.Stop()
		return nil, fmt.Errorf("creating the operator namespace: %w", err)
	}
	c.Kubeconfig = filepath.Join(dir, "kubeconfig")
	if err := c.Env.WriteKubeconfig(c.Kubeconfig); err != nil {
		c.Stop()
		return nil, err
	}
	// Proxies on loopback serve clients on loopback, and the probe target
	// is on loopback too: widen the provider's defaults accordingly.
	c.ProvidersFile = filepath.Join(dir, "providers.yaml")
	if err := os.WriteFile(c.ProvidersFile, []byte(`providers:
- name: `+ProviderName+`
  type: kubernetes
  pricing: {proxyHour: `+strconv.FormatFloat(PriceProxyHour, 'f', -1, 64)+`, gib: `+strconv.FormatFloat(PriceGiB, 'f', -1, 64)+`}
  settings:
    allowedSourceRanges: [127.0.0.0/8]
    deniedDestinationRanges: []
`+opts.ExtraProviders), 0o644); err != nil {
		c.Stop()
		return nil, err
	}
	runCtx, cancel := context.WithCancel(ctx)
	c.cancelRunner, c.runnerFinished = cancel, make(chan struct{})
	if opts.MarkPods {
		c.Marker = NewPodMarker(c.Env.Client, 8)
		go func() {
			defer close(c.runnerFinished)
			if err := c.Marker.Run(runCtx, c.Env.Config); err != nil {
				fmt.Fprintf(os.Stderr, "pod marker: %v\n", err)
			}
		}()
		return c, nil
	}
	c.Runner = NewPodRunner(c.Env.Client, filepath.Join(dir, "pods"))
	go func() { defer close(c.runnerFinished); c.Runner.Run(runCtx) }()
	return c, nil
}

// Stop stops everything the cluster started.
func (c *Cluster) Stop() {
	if c.cancelRunner != nil {
		c.cancelRunner()
		<-c.runnerFinished
	}
	if c.Runner != nil {
		c.Runner.StopAll()
	}
	if c.Env != nil {
		_ = c.Env.Stop()
	}
	if c.Target != nil {
		c.Target.Close()
	}
}

// OperatorOptions are the addresses an operator process listens on.
type OperatorOptions struct {
	DiscoveryAddr, ProbeAddr string
	// ExtraArgs are appended to the command line; Env to the environment.
	ExtraArgs []string
	Env       []string
}

// Operator is the operator binary running against the cluster.
type Operator struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
	// Log is the path of its combined output.
	Log string
}

// ShippedBuild is how the Dockerfile builds the image's binary: static,
// without paths or symbol tables, and without gRPC's request tracing
// (grpcnotrace: its debug pages' templates would keep every exported method
// of the binary, decision 106). The tests and benchmarks build the binary
// the same way, so what they measure (its memory above all: the binary's
// pages are a third of its RSS) is what ships; test/manifests keeps the two
// equal.
var ShippedBuild = struct {
	Env   []string
	Flags []string
}{
	Env:   []string{"CGO_ENABLED=0"},
	Flags: []string{"-trimpath", "-tags", BuildTags, "-ldflags", "-s -w"},
}

// BuildTags are the operator binary's build tags, every build of it alike.
const BuildTags = "grpcnotrace"

// BuildOperator builds the operator binary into dir, as the image does,
// and returns its path.
func BuildOperator(dir string) (string, error) {
	return BuildShipped(dir, "egress-proxies-operator", ".")
}

// BuildRaceOperator builds the operator binary into dir with the race
// detector, for the tests that run the whole process (e2e, HA, soak): the
// only place discovery, the gateway, the health engine and the reconciler
// run together. Operator.DataRaces reads what it found. Benchmarks build
// the shipped binary instead, since the detector slows everything down.
func BuildRaceOperator(dir string) (string, error) {
	bin := filepath.Join(dir, "egress-proxies-operator-race")
	cmd := exec.Command("go", "build", "-race", "-tags", BuildTags, "-o", bin, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1") // the detector needs cgo
	cmd.Dir = testenv.RepoRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building the operator with -race (it needs gcc: apt-get install gcc): %w\n%s", err, out)
	}
	return bin, nil
}

// raceReport opens each report the race detector writes.
const raceReport = "WARNING: DATA RACE"

// DataRaces is every race report in the operator's log so far, or "".
func (o *Operator) DataRaces() string { return racesIn(o.Log) }

// DataRaces is every race report in the logs of every operator this
// cluster ran, or "".
func (c *Cluster) DataRaces() string {
	logs, _ := filepath.Glob(filepath.Join(c.Dir, "operator-*.log"))
	var all []string
	for _, log := range logs {
		if races := racesIn(log); races != "" {
			all = append(all, log+":\n"+races)
		}
	}
	return strings.Join(all, "\n")
}

// racesIn is the race reports in one log.
func racesIn(path string) string {
	out, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("reading %s: %v", path, err)
	}
	var reports []string
	for _, chunk := range strings.Split(string(out), "==================\n")[1:] {
		if strings.HasPrefix(chunk, raceReport) {
			reports = append(reports, chunk)
		}
	}
	return strings.Join(reports, "==================\n")
}

// BuildShipped builds the main package pkg (relative to the repository's
// root) into dir/name with the image's build flags and returns its path.
func BuildShipped(dir, name, pkg string) (string, error) {
	bin := filepath.Join(dir, name)
	args := append(append([]string{"build"}, ShippedBuild.Flags...), "-o", bin, pkg)
	cmd := exec.Command("go", args...)
	cmd.Env = append(os.Environ(), ShippedBuild.Env...)
	cmd.Dir = testenv.RepoRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building %s: %w\n%s", pkg, err, out)
	}
	return bin, nil
}

// StartOperator runs the operator binary bin against the cluster and waits
// until its health probe endpoint answers.
func (c *Cluster) StartOperator(bin string, opts OperatorOptions) (*Operator, error) {
	args := []string{
		"--kubeconfig=" + c.Kubeconfig,
		"--providers-config=" + c.ProvidersFile,
		"--cluster-id=local",
		"--metrics-bind-address=0",
		"--health-probe-bind-address=" + opts.ProbeAddr,
		"--discovery-bind-address=" + opts.DiscoveryAddr,
		"--discovery-token-secret=" + OperatorNamespace + "/discovery-token",
		"--health-probe-url=" + c.Target.URL,
		"--health-ca-bundle=" + c.Target.CAFile,
		"--egress-echo-url=" + c.Target.EchoURL,
		"--health-interval=1s",
		"--health-timeout=2s",
		// The local cluster's sites live on loopback addresses, which its
		// Squid pods reach (their provider denies no destination).
		"--gateway-denied-destinations=",
	}
	args = append(args, opts.ExtraArgs...)
	logPath := filepath.Join(c.Dir, "operator-"+strconv.FormatInt(time.Now().UnixNano(), 36)+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), opts.Env...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("starting the operator: %w", err)
	}
	op := &Operator{cmd: cmd, done: make(chan struct{}), Log: logPath}
	go func() { op.err = cmd.Wait(); _ = logFile.Close(); close(op.done) }()

	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-op.done:
			out, _ := os.ReadFile(logPath)
			return nil, fmt.Errorf("the operator exited at startup: %w\n%s", op.err, out)
		default:
		}
		// Ready when the manager is, and the discovery API listens with its
		// view synced (it waits for the token Secret's cache first).
		managerReady, err1 := httpGet("http://" + opts.ProbeAddr + "/readyz")
		discoveryReady, err2 := httpGet("http://" + opts.DiscoveryAddr + "/readyz")
		if err1 == nil && err2 == nil && managerReady == 200 && discoveryReady == 200 {
			return op, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	op.Kill()
	out, _ := os.ReadFile(logPath)
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return nil, fmt.Errorf("the operator did not become ready within 60s; the last lines of %s:\n%s", logPath, strings.Join(lines[max(0, len(lines)-25):], "\n"))
}

// PID is the operator process's id, for reading its resource use.
func (o *Operator) PID() int { return o.cmd.Process.Pid }

// Kill stops the operator at once, as a crash would, and waits for it.
func (o *Operator) Kill() {
	select {
	case <-o.done:
		return
	default:
	}
	_ = syscall.Kill(-o.cmd.Process.Pid, syscall.SIGKILL)
	<-o.done
}

// Stop asks the operator to shut down and waits for it.
func (o *Operator) Stop() {
	select {
	case <-o.done:
		return
	default:
	}
	_ = o.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-o.done:
	case <-time.After(15 * time.Second):
		o.Kill()
	}
}
