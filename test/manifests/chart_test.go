package manifests

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/v2/lint/support"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	releasev1 "helm.sh/helm/v4/pkg/release/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/example/egress-proxies-operator/bans"
	"github.com/example/egress-proxies-operator/broker"
	"github.com/example/egress-proxies-operator/controllers"
	"github.com/example/egress-proxies-operator/gateway"
	"github.com/example/egress-proxies-operator/geoip"
	"github.com/example/egress-proxies-operator/health"
	"github.com/example/egress-proxies-operator/operator"
	"github.com/example/egress-proxies-operator/providers/aws"
	"github.com/example/egress-proxies-operator/providers/gcp"
	"github.com/example/egress-proxies-operator/providers/kubernetes"
	"github.com/example/egress-proxies-operator/test/testenv"
	"github.com/example/egress-proxies-operator/tracing"
)

const (
	chartDir = "charts/egress-proxies-operator"
	// The release of most tests: named after the chart, as most installs
	// are, so objects are called egress-proxies-operator-*.
	releaseName      = "egress-proxies-operator"
	releaseNamespace = "crawl-system"
	// serviceMonitorAPI is what the Prometheus Operator serves.
	serviceMonitorAPI = "monitoring.coreos.com/v1/ServiceMonitor"
	// prometheusRuleAPI is what the Prometheus Operator serves for alerts.
	prometheusRuleAPI = "monitoring.coreos.com/v1/PrometheusRule"
)

// chartInstall says how to render the chart: values files (relative to the
// chart) and then set, merged over values.yaml in that order, as
// `helm template -f ... --set ...` would.
type chartInstall struct {
	release     string
	namespace   string
	valuesFiles []string
	set         map[string]any
	apiVersions []string
}

type rendered struct {
	objects objects
	notes   string
}

// render renders the chart through helm's own install action, client-only
// (what `helm template` runs): values are checked against values.schema.json
// and kubeVersion against Chart.yaml, exactly as for a user.
func (in chartInstall) render(t *testing.T) (rendered, error) {
	t.Helper()
	chrt, err := loader.Load(filepath.Join(testenv.RepoRoot(), chartDir))
	require.NoError(t, err)
	vals := map[string]any{}
	for _, f := range in.valuesFiles {
		v, err := common.ReadValuesFile(filepath.Join(testenv.RepoRoot(), chartDir, f))
		require.NoError(t, err)
		vals = loader.MergeMaps(vals, v)
	}
	vals = loader.MergeMaps(vals, in.set)

	install := action.NewInstall(action.NewConfiguration())
	install.DryRunStrategy = action.DryRunClient
	install.Replace = true
	install.ReleaseName = cmpOr(in.release, releaseName)
	install.Namespace = cmpOr(in.namespace, releaseNamespace)
	install.KubeVersion = kubeVersion(t)
	install.APIVersions = in.apiVersions
	rel, err := install.Run(chrt, vals)
	if err != nil {
		return rendered{}, err
	}
	r, ok := rel.(*releasev1.Release)
	require.True(t, ok, "helm returned a %T", rel)
	return rendered{objects: parseManifests(t, []byte(r.Manifest)), notes: r.Info.Notes}, nil
}

// mustRender renders and fails the test on an error.
func (in chartInstall) mustRender(t *testing.T) rendered {
	t.Helper()
	r, err := in.render(t)
	require.NoError(t, err, "rendering the chart with %v and %v", in.valuesFiles, in.set)
	return r
}

// kubeVersion is the Kubernetes the tests run against (built by make envtest).
func kubeVersion(t *testing.T) *common.KubeVersion {
	t.Helper()
	kv, err := common.ParseKubeVersion("v1.36.3")
	require.NoError(t, err)
	return kv
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func TestChartRendersForEachRegion(t *testing.T) {
	for _, tc := range []struct {
		values, provider, gsa, role string
		tokenCreated                bool // every region's values do; TestChartAuth covers the rest
	}{
		{"", "kind-local", "", "", true},
		{"values-gcp-eu.yaml", "gcp-eu", "egress-proxies-operator@my-crawl-project.iam.gserviceaccount.com", "", true},
		{"values-gcp-us.yaml", "gcp-us", "egress-proxies-operator@my-crawl-project.iam.gserviceaccount.com", "", true},
		{"values-aws-eu.yaml", "aws-eu", "", "arn:aws:iam::111122223333:role/egress-proxies-operator", true},
	} {
		t.Run(cmpOr(tc.values, "defaults"), func(t *testing.T) {
			in := chartInstall{}
			if tc.values != "" {
				in.valuesFiles = []string{tc.values}
			}
			r := in.mustRender(t)

			var deploy appsv1.Deployment
			require.True(t, r.objects.one(t, "Deployment", &deploy))
			assert.Empty(t, restrictedViolations(deploy.Spec.Template.Spec), "the manager pod must pass Pod Security restricted and OpenShift restricted-v2")
			assert.Equal(t, releaseName, deploy.Name)

			var cm corev1.ConfigMap
			require.True(t, r.objects.one(t, "ConfigMap", &cm))
			assert.Equal(t, []string{tc.provider}, providerNames(t, cm), "the region's providers")
			assert.Contains(t, configMapVolumes(deploy), cm.Name)

			var sa corev1.ServiceAccount
			require.True(t, r.objects.one(t, "ServiceAccount", &sa))
			assert.Equal(t, deploy.Spec.Template.Spec.ServiceAccountName, sa.Name)
			assert.Equal(t, tc.gsa, sa.Annotations["iam.gke.io/gcp-service-account"], "the Workload Identity annotation")
			assert.Equal(t, tc.role, sa.Annotations["eks.amazonaws.com/role-arn"], "the IRSA annotation")

			flag := managerArg(t, deploy, "--discovery-token-secret")
			var secret corev1.Secret
			if tc.tokenCreated {
				require.True(t, r.objects.one(t, "Secret", &secret))
				assert.Equal(t, releaseNamespace+"/"+secret.Name, flag, "the operator reads the Secret the chart creates")
				assert.Regexp(t, `^[A-Za-z0-9]{48}$`, string(secret.Data["token"]), "a random token")
				assert.NotContains(t, r.notes, "UNAUTHENTICATED")
			}
			assert.Equal(t, "required", managerArg(t, deploy, "--discovery-auth"), "secure by default")

			for _, u := range r.objects {
				for _, label := range []string{"app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version", "app.kubernetes.io/managed-by", "helm.sh/chart"} {
					assert.NotEmpty(t, u.GetLabels()[label], "%s %s lacks the label %s", u.GetKind(), u.GetName(), label)
				}
				if !clusterScoped[u.GetKind()] {
					assert.Equal(t, releaseNamespace, u.GetNamespace(), "%s %s", u.GetKind(), u.GetName())
				}
			}

			crds := crdsByName(t, r.objects)
			require.Len(t, crds, len(crdFiles), "the chart installs every CRD")
			for name, crd := range crds {
				assert.Equal(t, "keep", crd.Annotations["helm.sh/resource-policy"], "%s: crds.keep defaults to true", name)
			}

			assert.Contains(t, r.notes, "port-forward svc/egress-proxies-operator-discovery 8090:8090")
			assert.Contains(t, r.notes, "provider: "+tc.provider, "NOTES show a first Proxy for the configured provider")
		})
	}
}

// clusterScoped are the kinds the chart renders without a namespace.
var clusterScoped = map[string]bool{"CustomResourceDefinition": true, "ClusterRole": true, "ClusterRoleBinding": true}

func TestChartToggles(t *testing.T) {
	t.Run("crds.enabled=false leaves the CRD out", func(t *testing.T) {
		r := chartInstall{set: map[string]any{"crds": map[string]any{"enabled": false}}}.mustRender(t)
		assert.Empty(t, r.objects.ofKind("CustomResourceDefinition"))
	})
	t.Run("crds.keep=false lets uninstall delete the CRD", func(t *testing.T) {
		r := chartInstall{set: map[string]any{"crds": map[string]any{"keep": false}}}.mustRender(t)
		crds := crdsByName(t, r.objects)
		require.Len(t, crds, len(crdFiles))
		for name, crd := range crds {
			assert.NotContains(t, crd.Annotations, "helm.sh/resource-policy", name)
		}
	})
	t.Run("networkPolicy.enabled=false", func(t *testing.T) {
		r := chartInstall{set: map[string]any{"networkPolicy": map[string]any{"enabled": false}}}.mustRender(t)
		assert.Empty(t, r.objects.ofKind("NetworkPolicy"))
		assert.NotContains(t, r.notes, "kubectl label namespace")
	})
	t.Run("metrics.enabled=false", func(t *testing.T) {
		r := chartInstall{set: map[string]any{"metrics": map[string]any{"enabled": false}}}.mustRender(t)
		var deploy appsv1.Deployment
		require.True(t, r.objects.one(t, "Deployment", &deploy))
		assert.Equal(t, "0", managerArg(t, deploy, "--metrics-bind-address"))
		assert.NotContains(t, containerPorts(deploy), "metrics")
		var svc corev1.Service
		r.objects.named(t, "Service", "egress-proxies-operator-discovery", &svc)
		assert.Len(t, r.objects.ofKind("Service"), 1, "only the discovery Service")
		var np networkingv1.NetworkPolicy
		require.True(t, r.objects.one(t, "NetworkPolicy", &np))
		assert.NotContains(t, policyPorts(np), "metrics", "no rule for a port that does not exist")
	})
	t.Run("the ServiceMonitor needs the toggle and the API", func(t *testing.T) {
		on := map[string]any{"metrics": map[string]any{"serviceMonitor": map[string]any{"enabled": true}}}
		r := chartInstall{set: on}.mustRender(t)
		assert.Empty(t, r.objects.ofKind("ServiceMonitor"), "not served: skipped")
		assert.Contains(t, r.notes, "WARNING: metrics.serviceMonitor.enabled is true")

		r = chartInstall{apiVersions: []string{serviceMonitorAPI}}.mustRender(t)
		assert.Empty(t, r.objects.ofKind("ServiceMonitor"), "served but not enabled")

		r = chartInstall{set: on, apiVersions: []string{serviceMonitorAPI}}.mustRender(t)
		require.Len(t, r.objects.ofKind("ServiceMonitor"), 1)
		assert.NotContains(t, r.notes, "WARNING")
		var sm struct {
			Spec struct {
				Selector struct {
					MatchLabels map[string]string `json:"matchLabels"`
				} `json:"selector"`
				Endpoints []struct {
					Port   string `json:"port"`
					Scheme string `json:"scheme"`
				} `json:"endpoints"`
			} `json:"spec"`
		}
		require.True(t, r.objects.one(t, "ServiceMonitor", &sm))
		var metrics corev1.Service
		r.objects.named(t, "Service", "egress-proxies-operator-metrics", &metrics)
		for k, v := range sm.Spec.Selector.MatchLabels {
			assert.Equal(t, v, metrics.Labels[k], "the ServiceMonitor selects the metrics Service (label %s)", k)
		}
		require.Len(t, sm.Spec.Endpoints, 1)
		assert.Equal(t, metrics.Spec.Ports[0].Name, sm.Spec.Endpoints[0].Port)
		assert.Equal(t, "https", sm.Spec.Endpoints[0].Scheme)
	})
	t.Run("the PrometheusRule needs the toggle and the API, and carries the checked rules file", func(t *testing.T) {
		on := map[string]any{"metrics": map[string]any{"prometheusRule": map[string]any{"enabled": true, "labels": map[string]any{"release": "kube-prometheus"}}}}
		r := chartInstall{set: on}.mustRender(t)
		assert.Empty(t, r.objects.ofKind("PrometheusRule"), "not served: skipped")
		assert.Contains(t, r.notes, "WARNING: metrics.prometheusRule.enabled is true")
		r = chartInstall{apiVersions: []string{prometheusRuleAPI}}.mustRender(t)
		assert.Empty(t, r.objects.ofKind("PrometheusRule"), "served but not enabled")

		r = chartInstall{set: on, apiVersions: []string{prometheusRuleAPI}}.mustRender(t)
		var rule struct {
			Metadata struct {
				Labels map[string]string `json:"labels"`
			} `json:"metadata"`
			Spec map[string]any `json:"spec"`
		}
		require.True(t, r.objects.one(t, "PrometheusRule", &rule))
		assert.Equal(t, "kube-prometheus", rule.Metadata.Labels["release"], "the labels a Prometheus selects rules by")
		var file map[string]any
		require.NoError(t, yaml.Unmarshal(repoFile(t, "charts/egress-proxies-operator/monitoring/alerts.yaml"), &file))
		assert.Equal(t, file, rule.Spec, "the spec is the rules file promtool checks, unchanged")
	})
	t.Run("the Grafana dashboard is a ConfigMap for the sidecar, when asked for", func(t *testing.T) {
		plain := chartInstall{}.mustRender(t)
		for _, cm := range plain.objects.ofKind("ConfigMap") {
			assert.NotEqual(t, "egress-proxies-operator-dashboard", cm.GetName(), "off by default")
		}
		r := chartInstall{set: map[string]any{"metrics": map[string]any{"grafanaDashboard": map[string]any{"enabled": true}}}}.mustRender(t)
		var cm corev1.ConfigMap
		r.objects.named(t, "ConfigMap", "egress-proxies-operator-dashboard", &cm)
		assert.Equal(t, "1", cm.Labels["grafana_dashboard"])
		assert.JSONEq(t, string(repoFile(t, "charts/egress-proxies-operator/monitoring/dashboard.json")), cm.Data["egress-proxies-operator.json"])
	})
	t.Run("an image digest wins over the tag", func(t *testing.T) {
		digest := "sha256:" + strings.Repeat("ab", 32)
		r := chartInstall{set: map[string]any{"image": map[string]any{"digest": digest, "tag": "v9"}}}.mustRender(t)
		var deploy appsv1.Deployment
		require.True(t, r.objects.one(t, "Deployment", &deploy))
		assert.Equal(t, "ghcr.io/example/egress-proxies-operator@"+digest, deploy.Spec.Template.Spec.Containers[0].Image)

		r = chartInstall{}.mustRender(t)
		require.True(t, r.objects.one(t, "Deployment", &deploy))
		assert.Equal(t, "ghcr.io/example/egress-proxies-operator:v0.1.0", deploy.Spec.Template.Spec.Containers[0].Image, "the default tag is v<appVersion>")
	})
	t.Run("an existing ServiceAccount", func(t *testing.T) {
		r := chartInstall{set: map[string]any{"serviceAccount": map[string]any{"create": false, "name": "crawl-operator"}}}.mustRender(t)
		assert.Empty(t, r.objects.ofKind("ServiceAccount"))
		var deploy appsv1.Deployment
		require.True(t, r.objects.one(t, "Deployment", &deploy))
		assert.Equal(t, "crawl-operator", deploy.Spec.Template.Spec.ServiceAccountName)
		for _, u := range slices.Concat(r.objects.ofKind("ClusterRoleBinding"), r.objects.ofKind("RoleBinding")) {
			subjects, _, err := unstructured.NestedSlice(u.Object, "subjects")
			require.NoError(t, err)
			require.Len(t, subjects, 1)
			assert.Equal(t, "crawl-operator", subjects[0].(map[string]any)["name"], "%s %s binds the given ServiceAccount", u.GetKind(), u.GetName())
		}

		_, err := chartInstall{set: map[string]any{"serviceAccount": map[string]any{"create": false}}}.render(t)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "serviceAccount.name is required when serviceAccount.create is false")
	})
	t.Run("a given token", func(t *testing.T) {
		r := chartInstall{set: map[string]any{"discovery": map[string]any{"token": map[string]any{"create": true, "value": "s3cret", "secretName": "crawlers"}}}}.mustRender(t)
		var secret corev1.Secret
		require.True(t, r.objects.one(t, "Secret", &secret))
		assert.Equal(t, "crawlers", secret.Name)
		assert.Equal(t, "s3cret", string(secret.Data["token"]))
		var deploy appsv1.Deployment
		require.True(t, r.objects.one(t, "Deployment", &deploy))
		assert.Equal(t, releaseNamespace+"/crawlers", managerArg(t, deploy, "--discovery-token-secret"))
		assert.Contains(t, r.notes, "get secret crawlers")
	})
	t.Run("a providers change rolls the Deployment", func(t *testing.T) {
		checksum := func(r rendered) string {
			var deploy appsv1.Deployment
			require.True(t, r.objects.one(t, "Deployment", &deploy))
			return deploy.Spec.Template.Annotations["checksum/providers"]
		}
		a := checksum(chartInstall{}.mustRender(t))
		b := checksum(chartInstall{valuesFiles: []string{"values-gcp-eu.yaml"}}.mustRender(t))
		assert.Regexp(t, `^[0-9a-f]{64}$`, a)
		assert.NotEqual(t, a, b)
		assert.Equal(t, a, checksum(chartInstall{set: map[string]any{"podLabels": map[string]any{"team": "crawl"}}}.mustRender(t)), "only the providers config moves it")
	})
	t.Run("two releases do not collide on cluster-scoped names", func(t *testing.T) {
		names := func(r rendered) []string {
			var out []string
			for _, u := range r.objects {
				if clusterScoped[u.GetKind()] && u.GetKind() != "CustomResourceDefinition" {
					out = append(out, u.GetKind()+"/"+u.GetName())
				}
			}
			return out
		}
		eu := names(chartInstall{release: "eu"}.mustRender(t))
		us := names(chartInstall{release: "us"}.mustRender(t))
		require.NotEmpty(t, eu)
		for _, n := range eu {
			assert.True(t, strings.Contains(n, "/eu-egress-proxies-operator-"), n)
			assert.NotContains(t, us, n)
		}
	})
}

// TestChartDefaultsAreTheOperatorsDefaults: values.yaml spells out the
// operator's flag defaults, so they must be the operator's.
func TestChartDefaultsAreTheOperatorsDefaults(t *testing.T) {
	var values struct {
		Operator struct {
			GC struct {
				Interval, GracePeriod string
				DryRun                bool
			}
			Health struct {
				ProbeURL                                    string `json:"probeURL"`
				Interval, Timeout                           string
				FailureThreshold, SuccessThreshold, Workers int
			}
			Discovery struct {
				LeaseMaxTTL       string `json:"leaseMaxTTL"`
				RateLimitCooldown string
				AdaptivePacing    bool
			}
			Reconcile struct{ Workers int }
			KubeAPI   struct {
				QPS   float64 `json:"qps"`
				Burst int
			} `json:"kubeAPI"`
			Healing struct {
				UnhealthyReplaceAfter, StartupTimeout, InstanceResyncInterval, SyncPeriod string
				MaxUnhealthyShare                                                         float64
				MaxReplacementsInFlight                                                   int
			}
			Outcomes struct {
				CanaryInterval, CanaryHostInterval, BanCheckInterval, BurnedIPRetention string
				EgressEchoURL                                                           string `json:"egressEchoURL"`
				MaxBlockedShare                                                         float64
				MaxBurnedIPRerolls                                                      int `json:"maxBurnedIPRerolls"`
			}
		}
	}
	require.NoError(t, yaml.Unmarshal(repoFile(t, chartDir+"/values.yaml"), &values))
	var gw struct {
		Gateway struct {
			MaxTunnels, Attempts                                        int
			SessionMaxErrorScore                                        float64
			ConnectTimeout, IdleTimeout, MaxTunnelLifetime, SessionIdle string
			PaceWait, PacedTunnelLifetime                               string
		}
	}
	require.NoError(t, yaml.Unmarshal(repoFile(t, chartDir+"/values.yaml"), &gw))
	assert.Equal(t, gateway.DefaultMaxTunnels, gw.Gateway.MaxTunnels)
	assert.Equal(t, gateway.DefaultAttempts, gw.Gateway.Attempts)
	assert.InDelta(t, broker.DefaultMaxErrorScore, gw.Gateway.SessionMaxErrorScore, 0)
	op := values.Operator
	for _, d := range []struct {
		value string
		want  time.Duration
		what  string
	}{
		{op.GC.Interval, controllers.DefaultGCInterval, "gc.interval"},
		{op.GC.GracePeriod, controllers.DefaultGCGracePeriod, "gc.gracePeriod"},
		{op.Health.Interval, health.DefaultInterval, "health.interval"},
		{op.Health.Timeout, health.DefaultTimeout, "health.timeout"},
		{op.Discovery.LeaseMaxTTL, broker.DefaultMaxTTL, "discovery.leaseMaxTTL"},
		{op.Discovery.RateLimitCooldown, broker.DefaultCooldown, "discovery.rateLimitCooldown"},
		{op.Healing.UnhealthyReplaceAfter, controllers.DefaultUnhealthyReplaceAfter, "healing.unhealthyReplaceAfter"},
		{op.Healing.StartupTimeout, controllers.DefaultStartupTimeout, "healing.startupTimeout"},
		{op.Healing.InstanceResyncInterval, controllers.DefaultInstanceResyncInterval, "healing.instanceResyncInterval"},
		{op.Outcomes.CanaryInterval, health.DefaultCanaryInterval, "outcomes.canaryInterval"},
		{op.Outcomes.CanaryHostInterval, health.DefaultCanaryHostInterval, "outcomes.canaryHostInterval"},
		{op.Outcomes.BanCheckInterval, bans.DefaultInterval, "outcomes.banCheckInterval"},
		{op.Outcomes.BurnedIPRetention, bans.DefaultBurnRetention, "outcomes.burnedIPRetention"},
		{op.Healing.SyncPeriod, operator.DefaultSyncPeriod, "healing.syncPeriod"},
		{gw.Gateway.ConnectTimeout, gateway.DefaultConnectTimeout, "gateway.connectTimeout"},
		{gw.Gateway.IdleTimeout, gateway.DefaultIdleTimeout, "gateway.idleTimeout"},
		{gw.Gateway.MaxTunnelLifetime, gateway.DefaultMaxTunnelLifetime, "gateway.maxTunnelLifetime"},
		{gw.Gateway.SessionIdle, gateway.DefaultSessionIdle, "gateway.sessionIdle"},
		{gw.Gateway.PaceWait, gateway.DefaultPaceWait, "gateway.paceWait"},
		{gw.Gateway.PacedTunnelLifetime, gateway.DefaultPacedTunnelLifetime, "gateway.pacedTunnelLifetime"},
	} {
		got, err := time.ParseDuration(d.value)
		require.NoError(t, err, d.what)
		assert.Equal(t, d.want, got, "operator.%s", d.what)
	}
	assert.False(t, op.GC.DryRun)
	assert.Equal(t, bans.DefaultMaxBlockedShare, op.Outcomes.MaxBlockedShare)
	assert.Equal(t, controllers.DefaultMaxBurnedIPRerolls, op.Outcomes.MaxBurnedIPRerolls)
	assert.Empty(t, op.Outcomes.EgressEchoURL, "no echo by default: the operator asks no third party unless told")
	assert.True(t, op.Discovery.AdaptivePacing, "main's --adaptive-pacing is on by default")
	assert.Equal(t, health.DefaultURL, op.Health.ProbeURL)
	assert.Equal(t, health.DefaultFailureThreshold, op.Health.FailureThreshold)
	assert.Equal(t, health.DefaultSuccessThreshold, op.Health.SuccessThreshold)
	assert.Equal(t, health.DefaultWorkers, op.Health.Workers)
	assert.Equal(t, controllers.DefaultMaxConcurrentReconciles, op.Reconcile.Workers)
	assert.InDelta(t, operator.DefaultKubeAPIQPS, op.KubeAPI.QPS, 0)
	assert.Equal(t, operator.DefaultKubeAPIBurst, op.KubeAPI.Burst)
	assert.InDelta(t, controllers.DefaultMaxUnhealthyShare, op.Healing.MaxUnhealthyShare, 0)
	assert.Equal(t, controllers.DefaultMaxReplacementsInFlight, op.Healing.MaxReplacementsInFlight)
}

// TestChartSchemaKnowsEveryProviderSetting: the schema's per-type settings
// are the providers' Settings fields, no more and no fewer, so the schema
// never refuses what the operator accepts or the reverse.
func TestChartSchemaKnowsEveryProviderSetting(t *testing.T) {
	var schema struct {
		Definitions map[string]struct {
			Properties map[string]json.RawMessage
			Required   []string
		}
	}
	require.NoError(t, json.Unmarshal(repoFile(t, chartDir+"/values.schema.json"), &schema))
	for def, settings := range map[string]any{"kubernetesSettings": kubernetes.Settings{}, "gcpSettings": gcp.Settings{}, "awsSettings": aws.Settings{}} {
		var fields, required []string
		typ := reflect.TypeOf(settings)
		for i := range typ.NumField() {
			name, opts, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
			fields = append(fields, name)
			if !strings.Contains(opts, "omitempty") {
				required = append(required, name)
			}
		}
		got := schema.Definitions[def]
		assert.ElementsMatch(t, fields, slices.Collect(maps.Keys(got.Properties)), "%s in values.schema.json against %T", def, settings)
		assert.ElementsMatch(t, required, got.Required, "%s: required settings", def)
	}
}

func TestChartSchemaRejectsBadValues(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  map[string]any
		want string // where the schema points
	}{
		{"unknown top-level key", map[string]any{"replicas": 2}, "replicas"},
		{"two replicas on the memory store", map[string]any{"replicaCount": 2}, "/leaseStore/type"},
		{"redis without an address", map[string]any{"leaseStore": map[string]any{"type": "redis"}}, "/leaseStore/redis"},
		{"redis address without a port", map[string]any{"leaseStore": map[string]any{"type": "redis", "redis": map[string]any{"address": "redis"}}}, "/leaseStore/redis/address"},
		{"unknown lease store", map[string]any{"leaseStore": map[string]any{"type": "etcd"}}, "/leaseStore/type"},
		{"zero replicas", map[string]any{"replicaCount": 0}, "/replicaCount"},
		{"unknown nested key", map[string]any{"operator": map[string]any{"health": map[string]any{"intervall": "5s"}}}, "intervall"},
		{"wrong type", map[string]any{"image": map[string]any{"tag": 5}}, "/image/tag"},
		{"not a duration", map[string]any{"operator": map[string]any{"gc": map[string]any{"interval": "ten minutes"}}}, "/operator/gc/interval"},
		{"zero workers", map[string]any{"operator": map[string]any{"health": map[string]any{"workers": 0}}}, "/operator/health/workers"},
		{"idle interval not a duration", map[string]any{"operator": map[string]any{"health": map[string]any{"idleInterval": "when idle"}}}, "/operator/health/idleInterval"},
		{"plain-http probe URL", map[string]any{"operator": map[string]any{"health": map[string]any{"probeURL": "http://example.com"}}}, "/operator/health/probeURL"},
		{"no reconcile workers", map[string]any{"operator": map[string]any{"reconcile": map[string]any{"workers": 0}}}, "/operator/reconcile/workers"},
		{"zero API QPS", map[string]any{"operator": map[string]any{"kubeAPI": map[string]any{"qps": 0}}}, "/operator/kubeAPI/qps"},
		{"unknown kubeAPI key", map[string]any{"operator": map[string]any{"kubeAPI": map[string]any{"rate": 10}}}, "rate"},
		{"unhealthy share above one", map[string]any{"operator": map[string]any{"healing": map[string]any{"maxUnhealthyShare": 1.5}}}, "/operator/healing/maxUnhealthyShare"},
		{"no replacements in flight", map[string]any{"operator": map[string]any{"healing": map[string]any{"maxReplacementsInFlight": 0}}}, "/operator/healing/maxReplacementsInFlight"},
		{"zero resync interval", map[string]any{"operator": map[string]any{"healing": map[string]any{"instanceResyncInterval": "0s"}}}, "/operator/healing/instanceResyncInterval"},
		{"replacement period not a duration", map[string]any{"operator": map[string]any{"healing": map[string]any{"unhealthyReplaceAfter": "never"}}}, "/operator/healing/unhealthyReplaceAfter"},
		{"extra arg without dashes", map[string]any{"operator": map[string]any{"extraArgs": []any{"enable-http2"}}}, "/operator/extraArgs/0"},
		{"bad pull policy", map[string]any{"image": map[string]any{"pullPolicy": "Sometimes"}}, "/image/pullPolicy"},
		{"unknown provider type", map[string]any{"providers": []any{map[string]any{"name": "azure-eu", "type": "azure"}}}, "/providers/0/type"},
		{"aws without settings", map[string]any{"providers": []any{map[string]any{"name": "aws-eu", "type": "aws"}}}, "settings"},
		{"aws open to the world", map[string]any{"providers": []any{map[string]any{"name": "aws-eu", "type": "aws", "settings": map[string]any{
			"region": "eu-west-1", "securityGroup": map[string]any{"sourceRanges": []any{"0.0.0.0/0"}}}}}}, "/providers/0/settings/securityGroup/sourceRanges/0"},
		{"too many session addresses", map[string]any{"providers": []any{map[string]any{"name": "aws-eu", "type": "aws", "settings": map[string]any{
			"region": "eu-west-1", "securityGroup": map[string]any{"sourceRanges": []any{"198.51.100.0/24"}}, "ipv6": map[string]any{"sessionAddresses": 1000}}}}},
			"/providers/0/settings/ipv6/sessionAddresses"},
		{"provider name not a DNS label", map[string]any{"providers": []any{map[string]any{"name": "GCP_EU", "type": "gcp", "settings": map[string]any{"project": "p"}}}}, "/providers/0/name"},
		{"gcp without project", map[string]any{"providers": []any{map[string]any{"name": "gcp-eu", "type": "gcp", "settings": map[string]any{"zone": "europe-west1-b"}}}}, "project"},
		{"unknown kubernetes setting", map[string]any{"providers": []any{map[string]any{"name": "local", "type": "kubernetes", "settings": map[string]any{"imag": "squid"}}}}, "imag"},
		{"empty discoveryFrom", map[string]any{"networkPolicy": map[string]any{"discoveryFrom": []any{}}}, "/networkPolicy/discoveryFrom"},
		{"no gateway tunnels", map[string]any{"gateway": map[string]any{"enabled": true, "maxTunnels": 0}}, "/gateway/maxTunnels"},
		{"gateway idle not a duration", map[string]any{"gateway": map[string]any{"idleTimeout": "a while"}}, "/gateway/idleTimeout"},
		{"unknown gateway key", map[string]any{"gateway": map[string]any{"port": 3128}}, "port"},
		{"a bad resource quantity", map[string]any{"resources": map[string]any{"limits": map[string]any{"memory": "lots"}}}, "/resources/limits/memory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := chartInstall{set: tc.set}.render(t)
			require.Error(t, err)
			assert.Contains(t, err.Error(), "schema")
			assert.Contains(t, err.Error(), tc.want, "the error points at the bad value")
		})
	}
}

// TestChartLintStrict is `helm lint --strict`, with the defaults and with
// each region's values.
func TestChartLintStrict(t *testing.T) {
	for _, values := range []string{"", "values-gcp-eu.yaml", "values-gcp-us.yaml", "values-aws-eu.yaml"} {
		t.Run(cmpOr(values, "defaults"), func(t *testing.T) {
			vals := map[string]any{}
			if values != "" {
				v, err := common.ReadValuesFile(filepath.Join(testenv.RepoRoot(), chartDir, values))
				require.NoError(t, err)
				vals = v
			}
			lint := action.NewLint()
			lint.Strict = true
			lint.Namespace = releaseNamespace
			lint.KubeVersion = kubeVersion(t)
			res := lint.Run([]string{filepath.Join(testenv.RepoRoot(), chartDir)}, vals)
			assert.Equal(t, 1, res.TotalChartsLinted)
			assert.Empty(t, res.Errors)
			for _, m := range res.Messages {
				assert.LessOrEqual(t, m.Severity, support.InfoSev, "lint: %s", m.Error())
			}
		})
	}
}

// TestChartAndKustomizeRunTheSameOperator: helm users and kustomize users
// get the same container: ports, probes, security, mounts, resources, and
// every flag the kustomize base sets, with the same value.
func TestChartAndKustomizeRunTheSameOperator(t *testing.T) {
	var fromChart, fromKustomize appsv1.Deployment
	require.True(t, chartInstall{}.mustRender(t).objects.one(t, "Deployment", &fromChart))
	require.True(t, build(t, "config/default").one(t, "Deployment", &fromKustomize))
	c, k := fromChart.Spec.Template.Spec, fromKustomize.Spec.Template.Spec
	assert.Equal(t, k.SecurityContext, c.SecurityContext)
	assert.Equal(t, k.TerminationGracePeriodSeconds, c.TerminationGracePeriodSeconds)
	assert.Equal(t, fromKustomize.Spec.Replicas, fromChart.Spec.Replicas)
	assert.Equal(t, fromKustomize.Spec.Strategy, fromChart.Spec.Strategy)
	require.Len(t, c.Containers, 1)
	require.Len(t, k.Containers, 1)
	cc, kc := c.Containers[0], k.Containers[0]
	assert.Equal(t, kc.Name, cc.Name)
	assert.Equal(t, kc.Ports, cc.Ports)
	assert.Equal(t, kc.LivenessProbe, cc.LivenessProbe)
	assert.Equal(t, kc.ReadinessProbe, cc.ReadinessProbe)
	assert.Equal(t, kc.SecurityContext, cc.SecurityContext)
	assert.Equal(t, kc.Resources, cc.Resources)
	assert.Equal(t, kc.VolumeMounts, cc.VolumeMounts)
	assert.Equal(t, kc.Env, cc.Env)
	assert.Subset(t, cc.Args, kc.Args, "every flag of the kustomize base, with its value")

	var npChart, npKustomize networkingv1.NetworkPolicy
	require.True(t, chartInstall{}.mustRender(t).objects.one(t, "NetworkPolicy", &npChart))
	require.True(t, build(t, "config/default").one(t, "NetworkPolicy", &npKustomize))
	assert.Equal(t, npKustomize.Spec.Ingress, npChart.Spec.Ingress, "the same ingress rules")
	assert.Equal(t, npKustomize.Spec.PolicyTypes, npChart.Spec.PolicyTypes)
}

// managerArg is the value of --name=value among the manager's args.
func managerArg(t *testing.T, d appsv1.Deployment, name string) string {
	t.Helper()
	for _, a := range d.Spec.Template.Spec.Containers[0].Args {
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v
		}
	}
	require.Failf(t, "missing flag", "%s is not among %v", name, d.Spec.Template.Spec.Containers[0].Args)
	return ""
}

func containerPorts(d appsv1.Deployment) []string {
	var names []string
	for _, p := range d.Spec.Template.Spec.Containers[0].Ports {
		names = append(names, p.Name)
	}
	return names
}

func policyPorts(np networkingv1.NetworkPolicy) []string {
	var names []string
	for _, rule := range np.Spec.Ingress {
		for _, p := range rule.Ports {
			names = append(names, p.Port.String())
		}
	}
	return names
}

// TestChartHighAvailability: several replicas only on the redis lease store
// (the schema refuses otherwise), and then a PodDisruptionBudget, pods
// spread over nodes, rolling updates, and the Redis flags with the password
// mounted from its Secret; the kustomize component gives overlay users the
// same.
func TestChartHighAvailability(t *testing.T) {
	ha := map[string]any{
		"replicaCount": 3,
		"leaseStore": map[string]any{"type": "redis", "timeout": "500ms", "redis": map[string]any{
			"address": "redis-master.data.svc:6379", "passwordSecret": map[string]any{"name": "redis-auth", "key": "redis-password"},
			"tls": map[string]any{"enabled": true, "serverName": "redis.internal", "caSecret": map[string]any{"name": "redis-ca"}},
		}},
	}
	r := chartInstall{set: ha}.mustRender(t)
	var deploy appsv1.Deployment
	require.True(t, r.objects.one(t, "Deployment", &deploy))
	assert.Equal(t, int32(3), *deploy.Spec.Replicas)
	assert.Equal(t, appsv1.RollingUpdateDeploymentStrategyType, deploy.Spec.Strategy.Type)
	assert.Equal(t, "0", deploy.Spec.Strategy.RollingUpdate.MaxUnavailable.String(), "a new pod is ready before an old one goes")
	assert.Equal(t, "redis", managerArg(t, deploy, "--lease-store"))
	assert.Equal(t, "500ms", managerArg(t, deploy, "--lease-store-timeout"))
	assert.Equal(t, "redis-master.data.svc:6379", managerArg(t, deploy, "--redis-address"))
	assert.Equal(t, "redis.internal", managerArg(t, deploy, "--redis-tls-server-name"))
	assert.Contains(t, deploy.Spec.Template.Spec.Containers[0].Args, "--redis-tls")
	assertMountedSecretFile(t, deploy, managerArg(t, deploy, "--redis-password-file"), "redis-auth", "redis-password")
	assertMountedSecretFile(t, deploy, managerArg(t, deploy, "--redis-tls-ca-file"), "redis-ca", "ca.crt")
	assert.Empty(t, restrictedViolations(deploy.Spec.Template.Spec))
	aff := deploy.Spec.Template.Spec.Affinity
	require.NotNil(t, aff, "replicas spread over nodes")
	require.Len(t, aff.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution, 1)
	term := aff.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution[0].PodAffinityTerm
	assert.Equal(t, "kubernetes.io/hostname", term.TopologyKey)
	assert.Equal(t, deploy.Spec.Selector.MatchLabels, term.LabelSelector.MatchLabels, "it keeps apart the operator's own pods")
	var pdb policyv1.PodDisruptionBudget
	require.True(t, r.objects.one(t, "PodDisruptionBudget", &pdb))
	assert.Equal(t, deploy.Spec.Selector.MatchLabels, pdb.Spec.Selector.MatchLabels)
	assert.Equal(t, "1", pdb.Spec.MaxUnavailable.String())
	assert.Contains(t, r.notes, "shared by 3 replica(s)")
	assert.True(t, hasArg(deploy, "--health-shard-probes"), "several replicas divide the probing")
	assert.False(t, hasArg(deploy, "--health-max-probes-per-second"), "no bound unless asked")
	assert.False(t, hasArg(deploy, "--health-idle-interval"), "every proxy at the interval unless asked")
	ha["operator"] = map[string]any{"health": map[string]any{"shardProbes": false, "maxProbesPerSecond": 400, "idleInterval": "2m"}}
	leaderProbes := chartInstall{set: ha}.mustRender(t)
	require.True(t, leaderProbes.objects.one(t, "Deployment", &deploy))
	assert.False(t, hasArg(deploy, "--health-shard-probes"), "shardProbes: false keeps probing on the leader")
	assert.Equal(t, "400", managerArg(t, deploy, "--health-max-probes-per-second"))
	assert.Equal(t, "2m", managerArg(t, deploy, "--health-idle-interval"))

	sentinel := chartInstall{set: map[string]any{"replicaCount": 2, "leaseStore": map[string]any{"type": "redis", "redis": map[string]any{
		"sentinel": map[string]any{"addresses": []any{"redis-sentinel-0.data:26379", "redis-sentinel-1.data:26379"}, "master": "leases"}, "waitReplicas": 1,
	}}}}.mustRender(t)
	require.True(t, sentinel.objects.one(t, "Deployment", &deploy))
	assert.Equal(t, "redis-sentinel-0.data:26379,redis-sentinel-1.data:26379", managerArg(t, deploy, "--redis-sentinel-addresses"))
	assert.Equal(t, "leases", managerArg(t, deploy, "--redis-sentinel-master"))
	assert.Equal(t, "1", managerArg(t, deploy, "--redis-wait-replicas"))
	assert.False(t, hasArg(deploy, "--redis-address"), "the Sentinels say where the primary is")
	_, err := chartInstall{set: map[string]any{"leaseStore": map[string]any{"type": "redis", "redis": map[string]any{
		"sentinel": map[string]any{"addresses": []any{"s:26379"}}}}}}.render(t)
	require.Error(t, err, "Sentinels without the primary's name")

	one := chartInstall{set: map[string]any{"leaseStore": map[string]any{"type": "redis", "redis": map[string]any{"address": "redis:6379"}}}}.mustRender(t)
	assert.Empty(t, one.objects.ofKind("PodDisruptionBudget"), "one replica: nothing to budget")
	require.True(t, one.objects.one(t, "Deployment", &deploy))
	assert.Nil(t, deploy.Spec.Template.Spec.Affinity)
	assert.False(t, hasArg(deploy, "--redis-password-file"), "no password Secret named: no password")
	assert.False(t, hasArg(deploy, "--health-shard-probes"), "one replica probes every proxy")

	def := chartInstall{}.mustRender(t)
	require.True(t, def.objects.one(t, "Deployment", &deploy))
	assert.Equal(t, "memory", managerArg(t, deploy, "--lease-store"))
	assert.False(t, hasArg(deploy, "--redis-address"))
	assert.Equal(t, appsv1.RecreateDeploymentStrategyType, deploy.Spec.Strategy.Type, "memory: never two operators at once")
	assert.Contains(t, def.notes, "a restart drops them")

	t.Run("the kustomize component", func(t *testing.T) {
		objs := kindWithComponent(t, "redis-ha")
		var deploy appsv1.Deployment
		require.True(t, objs.one(t, "Deployment", &deploy))
		assert.Equal(t, int32(2), *deploy.Spec.Replicas)
		assert.Equal(t, appsv1.RollingUpdateDeploymentStrategyType, deploy.Spec.Strategy.Type)
		assert.Equal(t, "redis", managerArg(t, deploy, "--lease-store"))
		assert.Equal(t, "redis:6379", managerArg(t, deploy, "--redis-address"))
		assert.True(t, hasArg(deploy, "--health-shard-probes"))
		assertMountedSecretFile(t, deploy, managerArg(t, deploy, "--redis-password-file"), "redis-password", "password")
		require.NotNil(t, deploy.Spec.Template.Spec.Affinity)
		assert.Empty(t, restrictedViolations(deploy.Spec.Template.Spec))
		var pdb policyv1.PodDisruptionBudget
		require.True(t, objs.one(t, "PodDisruptionBudget", &pdb))
		assert.Equal(t, deploy.Namespace, pdb.Namespace)
		sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
		require.NoError(t, err)
		assert.True(t, sel.Matches(labels.Set(deploy.Spec.Template.Labels)), "the budget covers the operator's pods")
		for _, a := range []string{"--leader-elect", "--providers-config"} {
			assert.True(t, hasArg(deploy, a), "the base's %s is kept", a)
		}
	})

	t.Run("the kustomize component on Sentinel", func(t *testing.T) {
		objs := kindWithComponent(t, "redis-sentinel-ha")
		var deploy appsv1.Deployment
		require.True(t, objs.one(t, "Deployment", &deploy))
		assert.Equal(t, int32(2), *deploy.Spec.Replicas, "the same replicas as redis-ha")
		assert.Equal(t, "redis", managerArg(t, deploy, "--lease-store"))
		assert.Equal(t, "redis-sentinel:26379", managerArg(t, deploy, "--redis-sentinel-addresses"))
		assert.Equal(t, "leases", managerArg(t, deploy, "--redis-sentinel-master"))
		assert.Equal(t, "1", managerArg(t, deploy, "--redis-wait-replicas"))
		assert.False(t, hasArg(deploy, "--redis-address"), "the Sentinels say where the primary is")
		assert.True(t, hasArg(deploy, "--health-shard-probes"))
		assertMountedSecretFile(t, deploy, managerArg(t, deploy, "--redis-password-file"), "redis-password", "password")
		require.Len(t, objs.ofKind("PodDisruptionBudget"), 1)
	})
}

// kindWithComponent builds the kind overlay with one of config/components
// added, as a user's own overlay outside the repository would (kustomize
// takes relative paths only).
func kindWithComponent(t *testing.T, component string) objects {
	t.Helper()
	dir := t.TempDir()
	repo, err := filepath.Rel(dir, testenv.RepoRoot())
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- %[1]s/overlays/kind
components:
- %[1]s/config/components/%[2]s
`, repo, component)), 0o644))
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	require.NoError(t, err)
	data, err := m.AsYaml()
	require.NoError(t, err)
	return parseManifests(t, data)
}

// hasArg says whether the manager has the flag, with or without a value.
func hasArg(d appsv1.Deployment, flag string) bool {
	return slices.ContainsFunc(d.Spec.Template.Spec.Containers[0].Args, func(a string) bool { return a == flag || strings.HasPrefix(a, flag+"=") })
}

// assertMountedSecretFile: path is a file the pod mounts from key of the
// Secret secretName.
func assertMountedSecretFile(t *testing.T, d appsv1.Deployment, path, secretName, key string) {
	t.Helper()
	require.NotEmpty(t, path)
	spec := d.Spec.Template.Spec
	for _, m := range spec.Containers[0].VolumeMounts {
		if !strings.HasPrefix(path, m.MountPath+"/") {
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name == m.Name && v.Secret != nil && v.Secret.SecretName == secretName {
				for _, item := range v.Secret.Items {
					if item.Key == key && m.MountPath+"/"+item.Path == path {
						return
					}
				}
			}
		}
	}
	t.Errorf("%s is not key %q of Secret %q mounted into the pod", path, key, secretName)
}

// TestChartGateway: off by default; on, the operator listens for it, a
// Service of its own reaches it, and the NetworkPolicy admits the
// discovery API's peers (or gatewayFrom) to it, and no one else.
func TestChartGateway(t *testing.T) {
	def := chartInstall{}.mustRender(t)
	var deploy appsv1.Deployment
	require.True(t, def.objects.one(t, "Deployment", &deploy))
	assert.False(t, hasArg(deploy, "--gateway-bind-address"), "off by default")
	assert.NotContains(t, containerPorts(deploy), "gateway")
	for _, svc := range def.objects.ofKind("Service") {
		assert.NotContains(t, svc.GetName(), "gateway")
	}

	on := chartInstall{set: map[string]any{"gateway": map[string]any{"enabled": true, "maxTunnels": 2000, "idleTimeout": "45s",
		"service": map[string]any{"type": "LoadBalancer", "port": 8080}}}}.mustRender(t)
	require.True(t, on.objects.one(t, "Deployment", &deploy))
	assert.Equal(t, ":3128", managerArg(t, deploy, "--gateway-bind-address"))
	assert.Equal(t, "2000", managerArg(t, deploy, "--gateway-max-tunnels"))
	assert.Equal(t, "45s", managerArg(t, deploy, "--gateway-idle-timeout"))
	assert.Equal(t, "30m", managerArg(t, deploy, "--gateway-session-idle"))
	assert.Contains(t, containerPorts(deploy), "gateway")
	var svc corev1.Service
	on.objects.named(t, "Service", "egress-proxies-operator-gateway", &svc)
	assert.Equal(t, corev1.ServiceTypeLoadBalancer, svc.Spec.Type)
	require.Len(t, svc.Spec.Ports, 1)
	assert.Equal(t, int32(8080), svc.Spec.Ports[0].Port)
	assert.Equal(t, "gateway", svc.Spec.Ports[0].TargetPort.String())
	assert.Equal(t, deploy.Spec.Selector.MatchLabels, svc.Spec.Selector)
	assert.Contains(t, on.notes, "crawler-1:$TOKEN@egress-proxies-operator-gateway.")

	var np networkingv1.NetworkPolicy
	require.True(t, on.objects.one(t, "NetworkPolicy", &np))
	gw := ingressTo(np, "gateway")
	require.NotNil(t, gw, "a rule admits peers to the gateway")
	assert.Equal(t, ingressTo(np, "discovery").From, gw.From, "by default, discovery's peers")

	own := chartInstall{set: map[string]any{"gateway": map[string]any{"enabled": true},
		"networkPolicy": map[string]any{"gatewayFrom": []any{map[string]any{"podSelector": map[string]any{"matchLabels": map[string]any{"app": "scrapy"}}}}}}}.mustRender(t)
	require.True(t, own.objects.one(t, "NetworkPolicy", &np))
	gw = ingressTo(np, "gateway")
	require.NotNil(t, gw)
	require.Len(t, gw.From, 1)
	assert.Equal(t, map[string]string{"app": "scrapy"}, gw.From[0].PodSelector.MatchLabels)

	t.Run("the kustomize component", func(t *testing.T) {
		objs := kindWithComponent(t, "gateway")
		var deploy appsv1.Deployment
		require.True(t, objs.one(t, "Deployment", &deploy))
		assert.Equal(t, ":3128", managerArg(t, deploy, "--gateway-bind-address"))
		assert.Contains(t, containerPorts(deploy), "gateway")
		var svc corev1.Service
		objs.named(t, "Service", "egress-proxies-operator-controller-manager-gateway-service", &svc)
		assert.Equal(t, deploy.Namespace, svc.Namespace)
		sel := labels.SelectorFromSet(svc.Spec.Selector)
		assert.True(t, sel.Matches(labels.Set(deploy.Spec.Template.Labels)), "the Service reaches the operator's pods")
		var np networkingv1.NetworkPolicy
		require.True(t, objs.one(t, "NetworkPolicy", &np))
		gw := ingressTo(np, "gateway")
		require.NotNil(t, gw)
		assert.Equal(t, ingressTo(np, "discovery").From, gw.From)
	})
}

// ingressTo is the NetworkPolicy rule admitting peers to the named port.
func ingressTo(np networkingv1.NetworkPolicy, port string) *networkingv1.NetworkPolicyIngressRule {
	for i, rule := range np.Spec.Ingress {
		for _, p := range rule.Ports {
			if p.Port != nil && p.Port.String() == port && len(rule.From) > 0 {
				return &np.Spec.Ingress[i]
			}
		}
	}
	return nil
}

// TestChartSetsGOMEMLIMIT: the Go runtime's soft memory limit follows the
// container's memory limit, and is left alone without one.
func TestChartSetsGOMEMLIMIT(t *testing.T) {
	limitEnv := func(d appsv1.Deployment) *corev1.EnvVar {
		for _, e := range d.Spec.Template.Spec.Containers[0].Env {
			if e.Name == "GOMEMLIMIT" {
				return &e
			}
		}
		return nil
	}
	var deploy appsv1.Deployment
	require.True(t, chartInstall{}.mustRender(t).objects.one(t, "Deployment", &deploy))
	env := limitEnv(deploy)
	require.NotNil(t, env, "set with the default memory limit")
	require.NotNil(t, env.ValueFrom.ResourceFieldRef)
	assert.Equal(t, "limits.memory", env.ValueFrom.ResourceFieldRef.Resource)
	assert.Equal(t, deploy.Spec.Template.Spec.Containers[0].Name, env.ValueFrom.ResourceFieldRef.ContainerName)
	assert.Equal(t, "1", env.ValueFrom.ResourceFieldRef.Divisor.String(), "in bytes, which GOMEMLIMIT reads")

	none := chartInstall{set: map[string]any{"resources": map[string]any{"limits": map[string]any{"memory": nil}}}}.mustRender(t)
	require.True(t, none.objects.one(t, "Deployment", &deploy))
	assert.Nil(t, limitEnv(deploy), "no container limit: no soft limit")
}

// TestChartSetsGOGC: goGC reaches the Go runtime as GOGC; empty, the
// operator's own default (50) stands.
func TestChartSetsGOGC(t *testing.T) {
	gogc := func(values map[string]any) *corev1.EnvVar {
		t.Helper()
		var deploy appsv1.Deployment
		require.True(t, chartInstall{set: values}.mustRender(t).objects.one(t, "Deployment", &deploy))
		for _, e := range deploy.Spec.Template.Spec.Containers[0].Env {
			if e.Name == "GOGC" {
				return &e
			}
		}
		return nil
	}
	assert.Nil(t, gogc(nil), "unset by default")
	env := gogc(map[string]any{"goGC": "100"})
	require.NotNil(t, env)
	assert.Equal(t, "100", env.Value)
	env = gogc(map[string]any{"goGC": 100})
	require.NotNil(t, env, "a number as --set writes it")
	assert.Equal(t, "100", env.Value)
	_, err := chartInstall{set: map[string]any{"goGC": "fast"}}.render(t)
	assert.ErrorContains(t, err, "goGC", "not a percentage: refused by the schema, naming the value")
}

// TestChartAuth: without a token Secret from the chart the operator makes
// one (NOTES say so, and never that the API is open); discovery.auth=none
// is the only way to an unauthenticated API, and NOTES say what it costs.
func TestChartAuth(t *testing.T) {
	r := chartInstall{set: map[string]any{"discovery": map[string]any{"token": map[string]any{"create": false}}}}.mustRender(t)
	var deploy appsv1.Deployment
	require.True(t, r.objects.one(t, "Deployment", &deploy))
	var secret corev1.Secret
	assert.False(t, r.objects.one(t, "Secret", &secret), "no Secret unless asked for")
	assert.Equal(t, "required", managerArg(t, deploy, "--discovery-auth"))
	assert.Contains(t, r.notes, "The operator creates the Secret")
	assert.NotContains(t, r.notes, "UNAUTHENTICATED")

	r = chartInstall{set: map[string]any{"discovery": map[string]any{"auth": "none"}}}.mustRender(t)
	require.True(t, r.objects.one(t, "Deployment", &deploy))
	assert.Equal(t, "none", managerArg(t, deploy, "--discovery-auth"))
	assert.Contains(t, r.notes, "UNAUTHENTICATED")

	_, err := chartInstall{set: map[string]any{"discovery": map[string]any{"auth": "off"}}}.render(t)
	assert.ErrorContains(t, err, "/discovery/auth", "the schema refuses anything but required and none")
}

// TestChartGeoIP: geoip.files mounts geoip.volume and names each file to
// the operator, in order; files without a volume are refused with a
// message that says what is missing; nothing set, no geo flag at all.
func TestChartGeoIP(t *testing.T) {
	var deploy appsv1.Deployment
	require.True(t, chartInstall{}.mustRender(t).objects.one(t, "Deployment", &deploy))
	for _, a := range deploy.Spec.Template.Spec.Containers[0].Args {
		assert.NotContains(t, a, "--geoip", "no database, no geo")
	}

	on := map[string]any{"geoip": map[string]any{
		"volume": map[string]any{"persistentVolumeClaim": map[string]any{"claimName": "geoip"}},
		"files":  []any{"GeoLite2-City.mmdb", "GeoLite2-ASN.mmdb"},
	}}
	require.True(t, chartInstall{set: on}.mustRender(t).objects.one(t, "Deployment", &deploy))
	var databases []string
	for _, a := range deploy.Spec.Template.Spec.Containers[0].Args {
		if v, ok := strings.CutPrefix(a, "--geoip-database="); ok {
			databases = append(databases, v)
		}
	}
	assert.Equal(t, []string{"/var/lib/egress-proxies-operator/geoip/GeoLite2-City.mmdb", "/var/lib/egress-proxies-operator/geoip/GeoLite2-ASN.mmdb"}, databases)
	refresh, err := time.ParseDuration(managerArg(t, deploy, "--geoip-refresh-interval"))
	require.NoError(t, err)
	assert.Equal(t, geoip.DefaultRefreshInterval, refresh, "the chart's default is the operator's")
	var volume *corev1.Volume
	for i, v := range deploy.Spec.Template.Spec.Volumes {
		if v.Name == "geoip" {
			volume = &deploy.Spec.Template.Spec.Volumes[i]
		}
	}
	require.NotNil(t, volume, "the volume is mounted")
	require.NotNil(t, volume.PersistentVolumeClaim)
	assert.Equal(t, "geoip", volume.PersistentVolumeClaim.ClaimName)
	mounted := false
	for _, m := range deploy.Spec.Template.Spec.Containers[0].VolumeMounts {
		mounted = mounted || m.Name == "geoip" && m.MountPath == "/var/lib/egress-proxies-operator/geoip" && m.ReadOnly
	}
	assert.True(t, mounted)

	_, err = chartInstall{set: map[string]any{"geoip": map[string]any{"files": []any{"GeoLite2-City.mmdb"}}}}.render(t)
	require.ErrorContains(t, err, "geoip.volume must say where geoip.files are")
	_, err = chartInstall{set: map[string]any{"geoip": map[string]any{"files": []any{"/etc/passwd"}}}}.render(t)
	require.Error(t, err, "a file is a name in the volume, not a path")
}

// TestChartTracing: an OTLP endpoint turns traces on with the chart's
// sample ratio (the operator's default); none leaves the flags out; a
// ratio above one is refused.
func TestChartTracing(t *testing.T) {
	var deploy appsv1.Deployment
	require.True(t, chartInstall{}.mustRender(t).objects.one(t, "Deployment", &deploy))
	for _, a := range deploy.Spec.Template.Spec.Containers[0].Args {
		assert.NotContains(t, a, "--otlp-endpoint", "no endpoint, no traces")
	}
	on := map[string]any{"tracing": map[string]any{"otlpEndpoint": "http://otel-collector.monitoring:4318"}}
	require.True(t, chartInstall{set: on}.mustRender(t).objects.one(t, "Deployment", &deploy))
	assert.Equal(t, "http://otel-collector.monitoring:4318", managerArg(t, deploy, "--otlp-endpoint"))
	ratio, err := strconv.ParseFloat(managerArg(t, deploy, "--trace-sample-ratio"), 64)
	require.NoError(t, err)
	assert.InDelta(t, tracing.DefaultSampleRatio, ratio, 0, "the chart's default is the operator's")
	_, err = chartInstall{set: map[string]any{"tracing": map[string]any{"otlpEndpoint": "http://c:4318", "sampleRatio": 2}}}.render(t)
	require.Error(t, err)
}
