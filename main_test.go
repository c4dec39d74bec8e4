package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/example/egress-proxies-operator/gateway"
	"github.com/example/egress-proxies-operator/lease"
	"github.com/example/egress-proxies-operator/netid"
	"github.com/example/egress-proxies-operator/providers"
	"github.com/example/egress-proxies-operator/providers/aws"
	"github.com/example/egress-proxies-operator/providers/gcp"
	"github.com/example/egress-proxies-operator/providers/kubernetes"
	"github.com/example/egress-proxies-operator/test/testenv"
)

func TestParseFlags(t *testing.T) {
	t.Run("defaults", func(t *testing.T) {
		o, err := parseFlags(nil, &bytes.Buffer{})
		require.NoError(t, err)
		assert.Equal(t, ":8090", o.discovery.Addr)
		assert.Equal(t, ":8443", o.manager.MetricsAddr)
		assert.Equal(t, ":8081", o.manager.ProbeAddr)
		assert.True(t, o.manager.MetricsSecure)
		assert.Empty(t, o.identity.ClusterID, "empty means: use the kube-system namespace's UID")
		assert.Equal(t, 8, o.controllers.MaxConcurrentReconciles)
		assert.InDelta(t, 50, o.manager.KubeAPIQPS, 0)
		assert.Equal(t, 100, o.manager.KubeAPIBurst)
		assert.Equal(t, time.Minute, o.controllers.InstanceResyncInterval)
		assert.Equal(t, 10*time.Hour, o.manager.SyncPeriod)
		assert.Equal(t, 10*time.Minute, o.controllers.Replacement.After)
		assert.InDelta(t, 0.3, o.controllers.Replacement.MaxUnhealthyShare, 0)
		assert.Equal(t, 5, o.controllers.MaxReplacementsInFlight)
		assert.Equal(t, "memory", o.leaseStore.Backend)
		assert.Equal(t, time.Second, o.leaseStore.Timeout)
		assert.Equal(t, "0", o.gateway.Addr, "the gateway is off by default")
		assert.True(t, o.identity.Scope.Cluster(), "the whole cluster by default")
		assert.Equal(t, "egress-proxies-operator-system_egress-proxies-operator", o.identity.OperatorID, "<namespace>_<name>")
		assert.Equal(t, "egress-proxies-operator.crawl.example.com", o.manager.LeaderElectionID)
		assert.Equal(t, "0", o.manager.PprofAddr, "profiling is off by default")
		assert.Equal(t, 64, o.senders.IPv6Prefix, "an IPv6 /64 is one sender")

		_, err = parseFlags([]string{"--ipv6-identity-prefix=8"}, &bytes.Buffer{})
		assert.ErrorContains(t, err, "--ipv6-identity-prefix must be between 32 and 128, got 8")
	})

	t.Run("a namespace-scoped install", func(t *testing.T) {
		t.Setenv("WATCH_NAMESPACE", "crawl-b,crawl-a")
		t.Setenv("OPERATOR_NAME", "tenant-a")
		t.Setenv("POD_NAMESPACE", "tenant-a-system")
		o, err := parseFlags(nil, &bytes.Buffer{})
		require.NoError(t, err)
		assert.Equal(t, []string{"crawl-a", "crawl-b"}, o.identity.Scope.Namespaces, "OLM's WATCH_NAMESPACE is the default")
		assert.Equal(t, "tenant-a-system_tenant-a", o.identity.OperatorID, "the release's namespace and name")
		assert.Equal(t, "tenant-a.crawl.example.com", o.manager.LeaderElectionID, "a Lease of its own")

		o, err = parseFlags([]string{"--watch-namespaces= crawl-c, crawl-c ,", "--operator-id=tenant_a", "--leader-election-id=a.example.com"}, &bytes.Buffer{})
		require.NoError(t, err)
		assert.Equal(t, []string{"crawl-c"}, o.identity.Scope.Namespaces, "the flag wins; blanks and repeats are dropped")
		assert.Equal(t, "tenant_a", o.identity.OperatorID)
		assert.Equal(t, "a.example.com", o.manager.LeaderElectionID)

		t.Setenv("WATCH_NAMESPACE", "")
		o, err = parseFlags(nil, &bytes.Buffer{})
		require.NoError(t, err)
		assert.True(t, o.identity.Scope.Cluster(), "OLM's AllNamespaces mode sets it empty")
	})

	t.Run("the gateway", func(t *testing.T) {
		o, err := parseFlags([]string{"--gateway-bind-address=:3128", "--gateway-max-tunnels=500", "--gateway-idle-timeout=30s",
			"--gateway-attempts=2", "--gateway-session-idle=5m"}, &bytes.Buffer{})
		require.NoError(t, err)
		assert.Equal(t, ":3128", o.gateway.Addr)
		assert.Equal(t, 500, o.gateway.MaxTunnels)
		assert.Equal(t, 2, o.gateway.Attempts)
		assert.Equal(t, 30*time.Second, o.gateway.IdleTimeout)
		assert.Equal(t, 5*time.Minute, o.gateway.SessionIdle)
		assert.Equal(t, time.Hour, o.gateway.MaxTunnelLifetime)
		assert.Equal(t, gateway.DefaultPaceWait, o.gateway.PaceWait)
		assert.Equal(t, gateway.DefaultPacedTunnelLifetime, o.gateway.PacedTunnelLifetime)
		assert.True(t, o.discovery.AdaptivePacing, "hosts are paced by their push-backs unless told otherwise")

		o, err = parseFlags([]string{"--gateway-bind-address=:3128", "--gateway-pace-wait=0", "--gateway-paced-tunnel-lifetime=2s", "--adaptive-pacing=false"}, &bytes.Buffer{})
		require.NoError(t, err)
		assert.Negative(t, o.gateway.PaceWait, "0: answer 429 at once, which the gateway spells as a negative wait")
		assert.Equal(t, 2*time.Second, o.gateway.PacedTunnelLifetime)
		assert.False(t, o.discovery.AdaptivePacing)
	})

	t.Run("the redis lease store", func(t *testing.T) {
		password := filepath.Join(t.TempDir(), "password")
		require.NoError(t, os.WriteFile(password, []byte("s3cret\n"), 0o600))
		o, err := parseFlags([]string{"--lease-store=redis", "--redis-address=redis.crawl.svc:6379", "--redis-password-file=" + password,
			"--redis-tls", "--redis-tls-server-name=redis.internal", "--redis-db=2", "--redis-username=operator",
			"--lease-store-timeout=250ms", "--redis-key-prefix=eu:"}, &bytes.Buffer{})
		require.NoError(t, err)
		assert.Equal(t, "redis", o.leaseStore.Backend)
		assert.Equal(t, "redis.crawl.svc:6379", o.leaseStore.Redis.Address)
		assert.Equal(t, 250*time.Millisecond, o.leaseStore.Timeout)
		assert.Equal(t, 250*time.Millisecond, o.leaseStore.Redis.Timeout, "Redis's dial, reads and writes share the bound")
		assert.True(t, o.leaseStore.Redis.TLS)
		assert.Equal(t, 2, o.leaseStore.Redis.DB)
		assert.Equal(t, "eu:", o.leaseStore.KeyPrefix)
	})

	t.Run("self-healing flags", func(t *testing.T) {
		o, err := parseFlags([]string{"--instance-resync-interval=30s", "--sync-period=1h", "--unhealthy-replace-after=0",
			"--max-unhealthy-share=0.5", "--max-replacements-in-flight=20"}, &bytes.Buffer{})
		require.NoError(t, err)
		assert.Equal(t, 30*time.Second, o.controllers.InstanceResyncInterval)
		assert.Equal(t, time.Hour, o.manager.SyncPeriod)
		assert.Zero(t, o.controllers.Replacement.After, "0 turns replacement off")
		assert.InDelta(t, 0.5, o.controllers.Replacement.MaxUnhealthyShare, 0)
		assert.Equal(t, 20, o.controllers.MaxReplacementsInFlight)
	})

	t.Run("every flag is accepted", func(t *testing.T) {
		o, err := parseFlags([]string{
			"--metrics-bind-address=0", "--health-probe-bind-address=127.0.0.1:9081",
			"--discovery-bind-address=127.0.0.1:18090", "--leader-elect",
			"--providers-config=/etc/providers.yaml", "--cluster-id=prod-eu_1",
			"--zap-log-level=debug", "--kubeconfig=/tmp/kubeconfig",
			"--max-concurrent-reconciles=16", "--kube-api-qps=200", "--kube-api-burst=300",
			"--health-shard-probes", "--health-shard-lease-duration=5s",
		}, &bytes.Buffer{})
		require.NoError(t, err)
		assert.Equal(t, 16, o.controllers.MaxConcurrentReconciles)
		assert.InDelta(t, 200, o.manager.KubeAPIQPS, 0)
		assert.Equal(t, 300, o.manager.KubeAPIBurst)
		assert.Equal(t, "prod-eu_1", o.identity.ClusterID)
		assert.Equal(t, "/etc/providers.yaml", o.providers.ConfigPath)
		assert.True(t, o.manager.LeaderElect)
		assert.Equal(t, "/tmp/kubeconfig", o.manager.Kubeconfig)
		assert.True(t, o.health.ShardProbes)
		assert.Equal(t, 5*time.Second, o.health.ShardLeaseDuration)
	})

	bad := []struct {
		name     string
		args     []string
		wantText string
	}{
		{"unknown flag", []string{"--no-such-flag"}, "no-such-flag"},
		{"auth neither required nor none", []string{"--discovery-auth=off"}, `--discovery-auth must be required or none, got "off"`},
		{"stray argument", []string{"serve"}, `unexpected arguments ["serve"]`},
		{"discovery address without port", []string{"--discovery-bind-address=localhost"}, "--discovery-bind-address"},
		{"metrics port not a number", []string{"--metrics-bind-address=:https"}, "--metrics-bind-address"},
		{"probe port out of range", []string{"--health-probe-bind-address=:70000"}, "--health-probe-bind-address"},
		{"pprof address without port", []string{"--pprof-bind-address=localhost"}, "--pprof-bind-address"},
		{"cluster id with capitals", []string{"--cluster-id=Prod"}, "--cluster-id"},
		{"cluster id too long", []string{"--cluster-id=" + string(bytes.Repeat([]byte("a"), 64))}, "--cluster-id"},
		{"operator id with a dot", []string{"--operator-id=tenant.a"}, "--operator-id"},
		{"namespace list with a bad name", []string{"--watch-namespaces=crawl-a,Crawl_B"}, `--watch-namespaces: "Crawl_B" is not a namespace name`},
		{"leader election id with a slash", []string{"--leader-election-id=a/b"}, "--leader-election-id"},
		{"bad log level", []string{"--zap-log-level=loud"}, "zap-log-level"},
		{"plain-http probe URL", []string{"--health-probe-url=http://example.com/"}, "--health-probe-url"},
		{"zero failure threshold", []string{"--health-failure-threshold=0"}, "--health-failure-threshold"},
		{"negative interval", []string{"--health-interval=-1s"}, "--health-interval"},
		{"a shard lease under 2s", []string{"--health-shard-probes", "--health-shard-lease-duration=1s"}, "--health-shard-lease-duration"},
		{"a shard lease of part seconds", []string{"--health-shard-probes", "--health-shard-lease-duration=2500ms"}, "--health-shard-lease-duration"},
		{"idle interval not above the interval", []string{"--health-interval=30s", "--health-idle-interval=30s"}, "--health-idle-interval must be 0 (off) or longer than --health-interval"},
		{"idle interval without discovery", []string{"--health-idle-interval=2m", "--discovery-bind-address=0"}, "--health-idle-interval needs the discovery API"},
		{"no reconcile workers", []string{"--max-concurrent-reconciles=0"}, "--max-concurrent-reconciles"},
		{"zero QPS", []string{"--kube-api-qps=0"}, "--kube-api-qps"},
		{"zero burst", []string{"--kube-api-burst=0"}, "--kube-api-burst"},
		{"zero resync interval", []string{"--instance-resync-interval=0"}, "--instance-resync-interval"},
		{"zero sync period", []string{"--sync-period=0s"}, "--sync-period"},
		{"negative replacement period", []string{"--unhealthy-replace-after=-1m"}, "--unhealthy-replace-after"},
		{"share above one", []string{"--max-unhealthy-share=1.5"}, "--max-unhealthy-share"},
		{"zero share", []string{"--max-unhealthy-share=0"}, "--max-unhealthy-share"},
		{"no replacements in flight", []string{"--max-replacements-in-flight=0"}, "--max-replacements-in-flight"},
		{"unknown lease store", []string{"--lease-store=etcd"}, "--lease-store must be memory or redis"},
		{"redis store without an address", []string{"--lease-store=redis"}, "--redis-address"},
		{"redis address without a port", []string{"--lease-store=redis", "--redis-address=redis"}, "--redis-address"},
		{"redis flags with the memory store", []string{"--redis-address=redis:6379"}, "--redis-address given with --lease-store=memory"},
		{"zero store timeout", []string{"--lease-store-timeout=0"}, "--lease-store-timeout"},
		{"missing password file", []string{"--lease-store=redis", "--redis-address=redis:6379", "--redis-password-file=/nonexistent/password"}, "--redis-password-file"},
		{"CA without TLS", []string{"--lease-store=redis", "--redis-address=redis:6379", "--redis-tls-ca-file=/etc/ca.pem"}, "--redis-tls"},
		{"gateway without discovery", []string{"--gateway-bind-address=:3128", "--discovery-bind-address=0"}, "--gateway-bind-address needs the discovery API"},
		{"gateway address without port", []string{"--gateway-bind-address=gw"}, "--gateway-bind-address"},
		{"no gateway tunnels", []string{"--gateway-bind-address=:3128", "--gateway-max-tunnels=0"}, "--gateway-max-tunnels"},
		{"zero gateway idle", []string{"--gateway-bind-address=:3128", "--gateway-idle-timeout=0"}, "--gateway-idle-timeout"},
		{"negative pace wait", []string{"--gateway-bind-address=:3128", "--gateway-pace-wait=-1s"}, "gateway-pace-wait: must not be negative"},
		{"zero paced tunnel lifetime", []string{"--gateway-bind-address=:3128", "--gateway-paced-tunnel-lifetime=0"}, "--gateway-paced-tunnel-lifetime"},
		{"adaptive pacing not a bool", []string{"--adaptive-pacing=sometimes"}, "adaptive-pacing"},
		{"negative session error score", []string{"--gateway-bind-address=:3128", "--gateway-session-max-error-score=-1"}, "--gateway-session-max-error-score"},
		{"sample ratio above one", []string{"--trace-sample-ratio=2"}, "--trace-sample-ratio"},
		{"OTLP endpoint without a scheme", []string{"--otlp-endpoint=collector:4318"}, "--otlp-endpoint"},
		{"zero geo refresh", []string{"--geoip-database=/var/lib/geoip/city.mmdb", "--geoip-refresh-interval=0"}, "--geoip-refresh-interval"},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			_, err := parseFlags(tc.args, &out)
			require.Error(t, err)
			assert.True(t, errors.Is(err, errUsage), "a command-line error exits 2: %v", err)
			assert.Contains(t, err.Error()+out.String(), tc.wantText)
		})
	}
}

func TestRunRejectsABadProvidersConfigBeforeConnecting(t *testing.T) {
	// No kubeconfig exists for this test: run must fail on the file first.
	t.Setenv("KUBECONFIG", filepath.Join(t.TempDir(), "absent"))
	missing := filepath.Join(t.TempDir(), "providers.yaml")

	err := run(context.Background(), []string{"--providers-config=" + missing}, &bytes.Buffer{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--providers-config")
	assert.Contains(t, err.Error(), missing, "the message names the file")

	malformed := filepath.Join(t.TempDir(), "providers.yaml")
	require.NoError(t, os.WriteFile(malformed, []byte("providers:\n- name: gcp-eu\n  type: gcp\n  zone: x\n"), 0o600))
	err = run(context.Background(), []string{"--providers-config=" + malformed}, &bytes.Buffer{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), malformed)
	assert.Contains(t, err.Error(), `providers[0] "gcp-eu": json: unknown field "zone"`)

	// A file that parses but whose settings a provider rejects: still
	// reported before any connection is tried, naming instance and field.
	badSettings := filepath.Join(t.TempDir(), "providers.yaml")
	require.NoError(t, os.WriteFile(badSettings, []byte(`providers:
- name: gcp-eu
  type: gcp
  settings: {zone: europe-west1-b}
- name: kind-local
  type: kubernetes
  settings: {allowedSourceRanges: [10.0.0.0/33]}
`), 0o600))
	err = run(context.Background(), []string{"--providers-config=" + badSettings}, &bytes.Buffer{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), badSettings)
	assert.Contains(t, err.Error(), `providers[0] "gcp-eu" (type gcp): settings.project is required`)
	assert.Contains(t, err.Error(), `providers[1] "kind-local" (type kubernetes): settings.allowedSourceRanges[0]`)
	assert.NotContains(t, err.Error(), "kubeconfig", "the config error, not a connection error")
}

// TestRunRejectsABadGeoDatabaseBeforeConnecting: a geo database that is
// missing or no database stops the operator at start, naming the file,
// before any connection; several files are taken from one flag or many.
func TestRunRejectsABadGeoDatabaseBeforeConnecting(t *testing.T) {
	t.Setenv("KUBECONFIG", filepath.Join(t.TempDir(), "absent"))
	providersConfig := filepath.Join(t.TempDir(), "providers.yaml")
	require.NoError(t, os.WriteFile(providersConfig, []byte("providers: []\n"), 0o600))
	junk := filepath.Join(t.TempDir(), "city.mmdb")
	require.NoError(t, os.WriteFile(junk, []byte("not a database"), 0o600))
	err := run(context.Background(), []string{"--providers-config=" + providersConfig, "--geoip-database=" + junk}, &bytes.Buffer{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), junk)
	assert.Contains(t, err.Error(), "not a MaxMind-format database")
	assert.NotContains(t, err.Error(), "kubeconfig", "the file's error, not a connection error")

	o, err := parseFlags([]string{"--geoip-database=/a/city.mmdb, /a/asn.mmdb", "--geoip-database=/b/extra.mmdb"}, &bytes.Buffer{})
	require.NoError(t, err)
	assert.Equal(t, []string{"/a/city.mmdb", "/a/asn.mmdb", "/b/extra.mmdb"}, o.geo.Databases)
}

// TestRunRejectsUnknownProviderTypesAndSettings points the operator at a real
// API server with a providers file that parses but names an unknown type and
// a bad setting: it must refuse to start, reporting both.
func TestRunRejectsUnknownProviderTypesAndSettings(t *testing.T) {
	env := testenv.Start(t)
	t.Setenv("KUBECONFIG", env.Kubeconfig(t))

	path := filepath.Join(t.TempDir(), "providers.yaml")
	require.NoError(t, os.WriteFile(path, []byte(`providers:
- name: kind-local
  type: kubernetes
  settings: {allowedSourceRanges: [10.0.0.0/33]}
- name: gcp-eu
  type: gce
`), 0o600))
	err := run(context.Background(), []string{"--providers-config=" + path, "--metrics-bind-address=0", "--health-probe-bind-address=0"}, &bytes.Buffer{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), path)
	assert.Contains(t, err.Error(), `providers[0] "kind-local" (type kubernetes): settings.allowedSourceRanges[0]: "10.0.0.0/33" is not a CIDR`)
	assert.Contains(t, err.Error(), `providers[1] "gcp-eu": unknown type "gce" (known: [aws gcp kubernetes])`)
}

// TestBinaryExitCodes builds the real binary and checks what a user or a
// kubelet sees: a non-zero exit and a message naming the flag or the file.
func TestBinaryExitCodes(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "egress-proxies-operator")
	build := exec.CommandContext(t.Context(), "go", "build", "-o", bin, ".")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)

	cases := []struct {
		name     string
		args     []string
		wantCode int
		wantText string
	}{
		{"unknown flag", []string{"--bogus"}, 2, "flag provided but not defined: -bogus"},
		{"bad bind address", []string{"--discovery-bind-address=nope"}, 2, "--discovery-bind-address"},
		{"unreadable providers config", []string{"--providers-config=/nonexistent/providers.yaml"}, 1, `reading providers config "/nonexistent/providers.yaml"`},
		{"help", []string{"--help"}, 0, "-providers-config"},
		{"unreadable CA bundle", []string{"--health-ca-bundle=/nonexistent/ca.pem"}, 1, "--health-ca-bundle"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.CommandContext(t.Context(), bin, tc.args...)
			cmd.Env = append(os.Environ(), "KUBECONFIG="+filepath.Join(t.TempDir(), "absent"))
			out, err := cmd.CombinedOutput()
			code := 0
			var exitErr *exec.ExitError
			if errors.As(err, &exitErr) {
				code = exitErr.ExitCode()
			} else {
				require.NoError(t, err)
			}
			assert.Equal(t, tc.wantCode, code, "output: %s", out)
			assert.Contains(t, string(out), tc.wantText)
		})
	}
}

// TestShippedProvidersConfigs decodes the shipped providers files strictly,
// each instance's settings into its type's struct, so a typo in a sample
// fails here rather than at a user's startup.
func TestShippedProvidersConfigs(t *testing.T) {
	settingsOf := map[string]func() any{
		kubernetes.Type: func() any { return &kubernetes.Settings{} },
		gcp.Type:        func() any { return &gcp.Settings{} },
		aws.Type:        func() any { return &aws.Settings{} },
	}
	for _, path := range []string{"config/manager/providers_config.yaml", "config/samples/providers-config.yaml"} {
		t.Run(path, func(t *testing.T) {
			cfg, err := providers.LoadConfig(path)
			require.NoError(t, err)
			require.NotEmpty(t, cfg.Providers)
			for _, inst := range cfg.Providers {
				newSettings, ok := settingsOf[inst.Type]
				require.True(t, ok, "instance %s has type %s, which main does not register", inst.Name, inst.Type)
				assert.NoError(t, providers.DecodeSettings(inst.Settings, newSettings()), inst.Name)
			}
		})
	}
	cfg, err := providers.LoadConfig("config/samples/providers-config.yaml")
	require.NoError(t, err)
	assert.Equal(t, []string{"kind-local", "gcp-eu", "gcp-us", "aws-eu"}, cfg.Names())
	for _, inst := range cfg.Providers {
		if inst.Type == aws.Type { // connects nowhere and needs no credentials to build
			_, err := aws.New(inst.Name, inst.Settings, providers.Dependencies{})
			require.NoError(t, err, "%s passes the provider's own checks", inst.Name)
		}
	}
}

// TestDefaultGCPercent: the operator runs its collector at
// defaultGCPercent unless GOGC is set, and then at what GOGC says.
func TestDefaultGCPercent(t *testing.T) {
	original := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(original) })
	current := func() int {
		v := debug.SetGCPercent(100)
		debug.SetGCPercent(v)
		return v
	}

	t.Setenv("GOGC", "")
	useDefaultGCPercent()
	assert.Equal(t, defaultGCPercent, current(), "GOGC unset (or empty, as the chart leaves it): the operator's default")

	debug.SetGCPercent(80) // as the runtime reads GOGC=80 at start
	t.Setenv("GOGC", "80")
	useDefaultGCPercent()
	assert.Equal(t, 80, current(), "GOGC set: left as the runtime read it")
}

// TestABanBurnsTheWholeSender: the burned-IP memory the judge and the
// reconciler share keys an exit IP by its sender: burning one address of
// an IPv6 /64 burns every address of it (a new instance there comes up
// burned), not the next /64; an IPv4 address burns only itself.
func TestABanBurnsTheWholeSender(t *testing.T) {
	ctx := context.Background()
	burns := senderBurns{lease.NewMemoryStore(nil), netid.Rule{}}
	require.NoError(t, burns.BurnIP(ctx, "gcp-eu", "2001:db8:1:2::5", time.Hour))
	require.NoError(t, burns.BurnIP(ctx, "gcp-eu", "203.0.113.5", time.Hour))
	for ip, burned := range map[string]bool{
		"2001:db8:1:2:ffff::1": true, "2001:db8:1:3::5": false, "203.0.113.5": true, "203.0.113.6": false,
	} {
		until, err := burns.BurnedUntil(ctx, "gcp-eu", ip)
		require.NoError(t, err)
		assert.Equal(t, burned, !until.IsZero(), ip)
	}
}
