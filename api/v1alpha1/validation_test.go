package v1alpha1_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/test/testenv"
)

var nameSeq atomic.Int64

// proxyFromSpec builds a Proxy as a user's manifest would send it: raw YAML,
// so zero values (port: 0) reach the API server instead of being dropped by
// Go's omitempty.
func proxyFromSpec(t *testing.T, spec string) *unstructured.Unstructured {
	t.Helper()
	return objectFromSpec(t, "Proxy", "px", spec)
}

// objectFromSpec is an object of kind, named prefix-<n> in default, with
// spec as raw YAML.
func objectFromSpec(t *testing.T, kind, prefix, spec string) *unstructured.Unstructured {
	t.Helper()
	doc := fmt.Sprintf("apiVersion: crawl.example.com/v1alpha1\nkind: %s\nmetadata:\n  name: %s-%d\n  namespace: default\nspec:\n%s",
		kind, prefix, nameSeq.Add(1), indent(spec))
	u := &unstructured.Unstructured{}
	require.NoError(t, yaml.Unmarshal([]byte(doc), &u.Object), doc)
	return u
}

func indent(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	for i := range lines {
		lines[i] = "  " + lines[i]
	}
	return strings.Join(lines, "\n") + "\n"
}

// TestProxyValidation applies Proxies to a real API server: the CRD's OpenAPI
// schema and CEL rules are the only validation there is, so only a real
// server proves them.
func TestProxyValidation(t *testing.T) {
	env := testenv.Start(t)
	ctx := context.Background()

	t.Run("invalid proxies are rejected with a message naming the field", func(t *testing.T) {
		cases := []struct {
			name, spec, wantMessage string
		}{
			{"Managed without provider", `mode: Managed`,
				"spec.provider is required when spec.mode is Managed"},
			{"Managed with empty provider", "mode: Managed\nprovider: \"\"",
				"spec.provider: Invalid value: \"\": spec.provider in body should be at least 1 chars long"},
			{"External with provider", "mode: External\nprovider: gcp-eu\nexternal: {address: 127.0.0.1}",
				"spec.provider is forbidden when spec.mode is External"},
			{"External with placement", "mode: External\nexternal: {address: 127.0.0.1}\nplacement: {zone: europe-west1-b}",
				"spec.placement is forbidden when spec.mode is External"},
			{"External with cloudInit", "mode: External\nexternal: {address: 127.0.0.1}\ncloudInit: {inline: '#cloud-config'}",
				"spec.cloudInit is forbidden when spec.mode is External"},
			{"External without external", `mode: External`,
				"spec.external is required when spec.mode is External"},
			{"External without external address", "mode: External\nexternal: {port: 3128}",
				"spec.external.address: Required value"},
			{"External with a bad address", "mode: External\nexternal: {address: 'not a host!'}",
				"spec.external.address must be a lowercase DNS hostname or an IP address"},
			{"Managed with external", "mode: Managed\nprovider: kind-local\nexternal: {address: 127.0.0.1}",
				"spec.external is forbidden when spec.mode is Managed"},
			{"unknown mode", "mode: Hybrid\nprovider: kind-local",
				`spec.mode: Unsupported value: "Hybrid": supported values: "Managed", "External"`},
			{"port 0", "mode: Managed\nprovider: kind-local\nport: 0",
				"spec.port: Invalid value: 0: spec.port in body should be greater than or equal to 1"},
			{"port 70000", "mode: Managed\nprovider: kind-local\nport: 70000",
				"spec.port: Invalid value: 70000: spec.port in body should be less than or equal to 65535"},
			{"external port 0", "mode: External\nexternal: {address: 127.0.0.1, port: 0}",
				"spec.external.port in body should be greater than or equal to 1"},
			{"both inline and Secret cloud-init", "mode: Managed\nprovider: kind-local\ncloudInit:\n  inline: '#cloud-config'\n  secretRef: {name: ci}",
				"spec.cloudInit must set exactly one of inline or secretRef"},
			{"neither inline nor Secret cloud-init", "mode: Managed\nprovider: kind-local\ncloudInit: {}",
				"spec.cloudInit must set exactly one of inline or secretRef"},
			{"Secret cloud-init without a name", "mode: Managed\nprovider: kind-local\ncloudInit: {secretRef: {key: user-data}}",
				"spec.cloudInit.secretRef.name: Required value"},
			{"reserved attribute", "mode: External\nexternal: {address: 127.0.0.1}\nattributes: {pool: eu}",
				"spec.attributes must not set the reserved keys healthy, provider, mode or pool"},
			{"a Managed proxy's zone attribute", "mode: Managed\nprovider: kind-local\nattributes: {zone: eu}",
				"spec.attributes must not set zone, region or cloud on a Managed proxy"},
			{"a Managed proxy's cloud attribute", "mode: Managed\nprovider: kind-local\nattributes: {cloud: aws}",
				"spec.attributes must not set zone, region or cloud on a Managed proxy"},
			{"bad attribute key", "mode: Managed\nprovider: kind-local\nattributes: {'-geo': eu}",
				"spec.attributes keys must be 1-63 characters"},
			{"plain-http probe URL", "mode: Managed\nprovider: kind-local\nhealthCheck: {url: 'http://example.com/'}",
				"spec.healthCheck.url must be an absolute https URL"},
			{"probe interval too short", "mode: Managed\nprovider: kind-local\nhealthCheck: {interval: 100ms}",
				"spec.healthCheck.interval must be a duration between 1s and 1h"},
			{"probe timeout above interval", "mode: Managed\nprovider: kind-local\nhealthCheck: {interval: 5s, timeout: 10s}",
				"spec.healthCheck.timeout must not exceed spec.healthCheck.interval"},
			{"failure threshold 0", "mode: Managed\nprovider: kind-local\nhealthCheck: {failureThreshold: 0}",
				"spec.healthCheck.failureThreshold in body should be greater than or equal to 1"},
			{"replaceAfter negative", "mode: Managed\nprovider: kind-local\nhealthCheck: {replaceAfter: -1m}",
				"spec.healthCheck.replaceAfter must be a duration between 0s and 24h"},
			{"replaceAfter above a day", "mode: Managed\nprovider: kind-local\nhealthCheck: {replaceAfter: 25h}",
				"spec.healthCheck.replaceAfter must be a duration between 0s and 24h"},
			{"placement parameter value too long", "mode: Managed\nprovider: gcp-eu\nplacement: {parameters: {diskSizeGb: '" + strings.Repeat("9", 257) + "'}}",
				"spec.placement.parameters values must be at most 256 characters"},
			{"placement parameter key too long", "mode: Managed\nprovider: gcp-eu\nplacement: {parameters: {" + strings.Repeat("k", 64) + ": x}}",
				"spec.placement.parameters keys must be at most 63 characters"},
			{"placement zone too long", "mode: Managed\nprovider: gcp-eu\nplacement: {zone: " + strings.Repeat("z", 64) + "}",
				"spec.placement.zone: Too long"},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				err := env.Client.Create(ctx, proxyFromSpec(t, tc.spec))
				require.Error(t, err, "the API server accepted an invalid Proxy")
				assert.Contains(t, err.Error(), tc.wantMessage)
			})
		}
	})

	t.Run("valid proxies are accepted and defaulted", func(t *testing.T) {
		cases := []struct {
			name, spec string
			check      func(t *testing.T, p *crawlv1alpha1.Proxy)
		}{
			{"minimal Managed", "mode: Managed\nprovider: kind-local", func(t *testing.T, p *crawlv1alpha1.Proxy) {
				assert.Equal(t, crawlv1alpha1.DefaultPort, p.Spec.Port, "port defaults to 3128")
			}},
			{"minimal External", "mode: External\nexternal: {address: proxy-1.example.com}", func(t *testing.T, p *crawlv1alpha1.Proxy) {
				assert.Equal(t, int32(3128), p.Spec.Port)
				assert.Equal(t, int32(0), p.Spec.External.Port, "external.port stays unset: spec.port applies")
			}},
			{"External declaring its zone, region and cloud", "mode: External\nexternal: {address: proxy-2.example.com}\nattributes: {zone: eu-west-1a, region: eu-west-1, cloud: aws}",
				func(t *testing.T, p *crawlv1alpha1.Proxy) {
					assert.Equal(t, "eu-west-1", p.Spec.Attributes["region"], "an External proxy declares where it is")
				}},
			{"External by IPv6 address", "mode: External\nexternal: {address: '::1', port: 8080}", func(t *testing.T, p *crawlv1alpha1.Proxy) {
				assert.Equal(t, int32(8080), p.Spec.External.Port)
			}},
			{"full Managed", `
mode: Managed
provider: gcp-eu
port: 8080
attributes: {geo: eu, tier: datacenter}
placement: {zone: europe-west1-b, region: europe-west1, machineType: e2-small, image: projects/debian-cloud/global/images/family/debian-12, parameters: {preemptible: "true"}}
cloudInit: {secretRef: {name: squid-cloud-init}}
healthCheck: {url: 'https://www.example.com/', interval: 30s, timeout: 10s, failureThreshold: 3, successThreshold: 1, replaceAfter: 0s}
`, func(t *testing.T, p *crawlv1alpha1.Proxy) {
				require.NotNil(t, p.Spec.HealthCheck.ReplaceAfter, "0s turns replacement off and is kept")
				assert.Zero(t, p.Spec.HealthCheck.ReplaceAfter.Duration)
				assert.Equal(t, int32(8080), p.Spec.Port)
				require.NotNil(t, p.Spec.CloudInit.SecretRef)
				assert.Equal(t, "user-data", p.Spec.CloudInit.SecretRef.Key, "secretRef.key defaults to user-data")
				assert.Equal(t, "eu", p.Spec.Attributes["geo"])
			}},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				u := proxyFromSpec(t, tc.spec)
				require.NoError(t, env.Client.Create(ctx, u))
				var got crawlv1alpha1.Proxy
				require.NoError(t, env.Client.Get(ctx, types.NamespacedName{Namespace: u.GetNamespace(), Name: u.GetName()}, &got))
				tc.check(t, &got)
			})
		}
	})

	t.Run("names longer than a label value are rejected", func(t *testing.T) {
		u := proxyFromSpec(t, "mode: Managed\nprovider: kind-local")
		u.SetName(strings.Repeat("a", 64))
		err := env.Client.Create(ctx, u)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "metadata.name must be at most 63 characters")
	})

	t.Run("mode is immutable after creation", func(t *testing.T) {
		u := proxyFromSpec(t, "mode: Managed\nprovider: kind-local")
		require.NoError(t, env.Client.Create(ctx, u))
		spec := map[string]any{"mode": "External", "external": map[string]any{"address": "127.0.0.1"}}
		require.NoError(t, unstructured.SetNestedField(u.Object, spec, "spec"))
		err := env.Client.Update(ctx, u)
		require.Error(t, err, "the API server allowed changing spec.mode")
		assert.Contains(t, err.Error(), "spec.mode is immutable")
	})

	t.Run("the shipped samples are accepted", func(t *testing.T) {
		paths, err := filepath.Glob(filepath.Join(testenv.RepoRoot(), "config", "samples", "proxy_*.yaml"))
		require.NoError(t, err)
		require.Len(t, paths, 3)
		for _, path := range paths {
			data, err := os.ReadFile(path)
			require.NoError(t, err)
			for _, doc := range strings.Split(string(data), "\n---\n") {
				u := &unstructured.Unstructured{}
				require.NoError(t, yaml.Unmarshal([]byte(doc), &u.Object), path)
				u.SetNamespace("default")
				assert.NoError(t, env.Client.Create(ctx, u, client.DryRunAll), "%s: %s %s", path, u.GetKind(), u.GetName())
			}
		}
	})

	t.Run("the CRD carries short name, category and printer columns", func(t *testing.T) {
		var crd apiextensionsv1.CustomResourceDefinition
		require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Name: "proxies.crawl.example.com"}, &crd))
		assert.Equal(t, []string{"px"}, crd.Spec.Names.ShortNames)
		assert.Equal(t, []string{"crawl"}, crd.Spec.Names.Categories)
		assert.Equal(t, apiextensionsv1.NamespaceScoped, crd.Spec.Scope)
		require.Len(t, crd.Spec.Versions, 1)
		var columns []string
		for _, c := range crd.Spec.Versions[0].AdditionalPrinterColumns {
			columns = append(columns, strings.ToUpper(c.Name))
		}
		// NAME is implicit: kubectl always prints it first.
		assert.Equal(t, []string{"MODE", "PROVIDER", "PHASE", "IP", "HEALTHY", "READY", "COUNTRY", "ASN", "AGE"}, columns)
		assert.NotNil(t, crd.Spec.Versions[0].Subresources.Status, "status is a subresource")
	})
}
