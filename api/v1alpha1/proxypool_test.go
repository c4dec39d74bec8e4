package v1alpha1_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/example/egress-proxies-operator/test/testenv"
)

// TestPoolStrategyValidation: a pool that could never replace a member
// (no surge and no member allowed down, written out or by default) is
// refused with a message saying why; any way to replace one is accepted.
func TestPoolStrategyValidation(t *testing.T) {
	env := testenv.Start(t)
	ctx := context.Background()
	pool := func(strategy string) string {
		return "replicas: 2\ntemplate:\n  spec: {mode: Managed, provider: kind-local}\nstrategy: " + strategy
	}
	const never = "spec.strategy.maxSurge is 0, so spec.strategy.maxUnavailable must be above 0 (its default is 0)"
	for _, tc := range []struct{ name, strategy, want string }{
		{"no surge, the default maxUnavailable", "{maxSurge: 0}", never},
		{"no surge, none unavailable", "{maxSurge: 0, maxUnavailable: 0}", never},
		{"no surge as a percentage", "{maxSurge: '0%'}", never},
		{"no surge, 0% unavailable", "{maxSurge: 0, maxUnavailable: '0%'}", never},
		{"surge and unavailable both 0%", "{maxSurge: '0%', maxUnavailable: '0%'}", never},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := env.Client.Create(ctx, objectFromSpec(t, "ProxyPool", "pool", pool(tc.strategy)))
			require.Error(t, err, "the API server accepted a pool that could never replace a member")
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	for _, strategy := range []string{"{}", "{maxSurge: 0, maxUnavailable: 1}", "{maxSurge: 0, maxUnavailable: '50%'}", "{maxUnavailable: 0}", "{maxSurge: '25%'}"} {
		t.Run("accepted: "+strategy, func(t *testing.T) {
			require.NoError(t, env.Client.Create(ctx, objectFromSpec(t, "ProxyPool", "pool", pool(strategy))))
		})
	}
}

// TestPoolProvidersValidation: a pool across providers gives each member
// its provider and zone, so what would contradict that is refused.
func TestPoolProvidersValidation(t *testing.T) {
	env := testenv.Start(t)
	ctx := context.Background()
	pool := func(rest string) string {
		return "replicas: 6\ntemplate:\n  spec: {mode: Managed, provider: gcp-eu}\n" + rest
	}
	for _, tc := range []struct{ name, spec, want string }{
		{"zones beside providers", pool("zones: [a]\nproviders: [{name: gcp-eu}]"), "spec.zones is forbidden when spec.providers is set"},
		{"a template provider not listed", pool("providers: [{name: aws-eu}]"), "spec.template.spec.provider must be one of spec.providers"},
		{"every weight 0", pool("providers: [{name: gcp-eu, weight: 0}, {name: aws-eu, weight: 0}]"), "spec.providers needs a provider of weight above 0"},
		{"a template zone", "replicas: 2\ntemplate:\n  spec: {mode: Managed, provider: gcp-eu, placement: {zone: b}}\nproviders: [{name: gcp-eu}]",
			"spec.template.spec.placement.zone is forbidden when spec.zones or spec.providers is set"},
		{"a provider twice", pool("providers: [{name: gcp-eu}, {name: gcp-eu}]"), "Duplicate value"},
		{"a weight above 100", pool("providers: [{name: gcp-eu, weight: 101}]"), "spec.providers[0].weight"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := env.Client.Create(ctx, objectFromSpec(t, "ProxyPool", "pool", tc.spec))
			require.Error(t, err, "the API server accepted it")
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	t.Run("a template without a provider is told what to name", func(t *testing.T) {
		err := env.Client.Create(ctx, objectFromSpec(t, "ProxyPool", "pool", "replicas: 6\ntemplate:\n  spec: {mode: Managed}\nproviders: [{name: gcp-eu}]"))
		require.Error(t, err, "the API server accepted it")
		assert.Contains(t, err.Error(), "spec.template.spec.provider must be one of spec.providers")
		assert.NotContains(t, err.Error(), "no such key", "every rule evaluates; none fails on the missing field")
	})
	t.Run("accepted: two providers with weights and zones", func(t *testing.T) {
		require.NoError(t, env.Client.Create(ctx, objectFromSpec(t, "ProxyPool", "pool",
			pool("providers: [{name: gcp-eu, weight: 2, zones: [europe-west1-b, europe-west1-c]}, {name: aws-eu, zones: [eu-west-1a]}]"))))
	})
}
