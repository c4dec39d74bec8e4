package controllers

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/example/egress-proxies-operator/providers"
)

// firewalledProvider is a provider with firewall rules in one project.
type firewalledProvider struct {
	providers.Provider
	project string
	rules   map[string]string // rule name -> provider instance it was made for
}

func (f *firewalledProvider) EnsureFirewall(context.Context, providers.Owner) error { return nil }

func (f *firewalledProvider) StrayFirewalls(_ context.Context, _ providers.Owner, keep func(string) bool) ([]providers.FirewallRule, error) {
	var out []providers.FirewallRule
	for name, prov := range f.rules {
		if !keep(prov) {
			out = append(out, providers.FirewallRule{Name: name, Provider: prov, Location: f.project})
		}
	}
	return out, nil
}

func (f *firewalledProvider) DeleteFirewall(_ context.Context, rule providers.FirewallRule) error {
	delete(f.rules, rule.Name)
	return nil
}

func TestSweepRemovesTheFirewallOfAProviderInstanceThatLeft(t *testing.T) {
	for _, dryRun := range []bool{true, false} {
		eu := &firewalledProvider{project: "crawl-prod", rules: map[string]string{"fw-gcp-eu": "gcp-eu", "fw-gcp-old": "gcp-old"}}
		c := &OrphanCollector{Providers: providers.Set{"gcp-eu": eu}, Owner: testOwner, DryRun: dryRun}
		require.NoError(t, c.sweepFirewalls(context.Background()))
		if dryRun {
			assert.Len(t, eu.rules, 2, "dry-run deletes nothing")
			continue
		}
		assert.Equal(t, map[string]string{"fw-gcp-eu": "gcp-eu"}, eu.rules, "only the rule of the provider instance no longer configured goes")
	}
}
