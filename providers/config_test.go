package providers

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseConfig(t *testing.T) {
	t.Run("valid", func(t *testing.T) {
		cfg, err := ParseConfig([]byte(`
providers:
- name: kind-local
  type: kubernetes
- name: gcp-eu
  type: gcp
  settings:
    project: crawl-prod
    zone: europe-west1-b
  pricing:
    proxyHour: 0.0126
    gib: 0.085
`))
		require.NoError(t, err)
		assert.Equal(t, &Pricing{ProxyHour: 0.0126, GiB: 0.085}, cfg.Providers[1].Pricing)
		assert.Nil(t, cfg.Providers[0].Pricing)
		assert.Equal(t, []string{"kind-local", "gcp-eu"}, cfg.Names())
		assert.Equal(t, "gcp", cfg.Providers[1].Type)
		assert.Equal(t, "crawl-prod", cfg.Providers[1].Settings["project"])
	})

	t.Run("empty file means no providers", func(t *testing.T) {
		cfg, err := ParseConfig(nil)
		require.NoError(t, err)
		assert.Empty(t, cfg.Providers)
	})

	bad := []struct {
		name, doc string
		want      []string
	}{
		{"not YAML", "providers: [", []string{"parsing"}},
		{"unknown top-level field", "provider: []", []string{`unknown field "provider"`}},
		{"unknown instance field", "providers:\n- name: gcp-eu\n  type: gcp\n  project: x", []string{`providers[0] "gcp-eu"`, `unknown field "project"`}},
		{"missing name", "providers:\n- type: gcp", []string{"providers[0]: name is required"}},
		{"bad name", "providers:\n- name: GCP_EU\n  type: gcp", []string{`providers[0] "GCP_EU": name must be a DNS label`}},
		{"missing type", "providers:\n- name: gcp-eu", []string{`providers[0] "gcp-eu": type is required`}},
		{"negative price", "providers:\n- name: a\n  type: gcp\n  pricing: {proxyHour: -1}", []string{`providers[0] "a": pricing.proxyHour and pricing.gib must not be negative`}},
		{"unknown price", "providers:\n- name: a\n  type: gcp\n  pricing: {perHour: 1}", []string{`unknown field "perHour"`}},
		{"duplicate", "providers:\n- name: a\n  type: gcp\n- name: a\n  type: kubernetes", []string{`providers[1] "a": duplicate name`}},
		{"every problem is reported", "providers:\n- name: a\n- type: gcp", []string{`providers[0] "a": type is required`, "providers[1]: name is required"}},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tc.doc))
			require.Error(t, err)
			for _, want := range tc.want {
				assert.Contains(t, err.Error(), want)
			}
		})
	}
}

func TestLoadConfigNamesTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "providers.yaml")
	_, err := LoadConfig(path)
	require.Error(t, err)
	assert.Contains(t, err.Error(), path)

	require.NoError(t, os.WriteFile(path, []byte("providers:\n- name: x\n"), 0o600))
	_, err = LoadConfig(path)
	require.Error(t, err)
	assert.Contains(t, err.Error(), path)
	assert.Contains(t, err.Error(), "type is required")
}
