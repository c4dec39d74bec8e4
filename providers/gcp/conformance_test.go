package gcp

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/api/option"
	clocktesting "k8s.io/utils/clock/testing"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/providers"
	"github.com/example/egress-proxies-operator/providers/gcp/fakecompute"
	"github.com/example/egress-proxies-operator/providers/providertest"
)

// TestConformance runs the cloud providers' suite against the fake Compute
// API.
func TestConformance(t *testing.T) {
	providertest.Run(t, func(t *testing.T) providertest.Harness {
		clk := clocktesting.NewFakeClock(time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC))
		fake := fakecompute.New(clk, timings)
		t.Cleanup(fake.Close)
		const zone = "europe-west1-b"
		build := func() providers.Provider {
			p, err := NewWithClientOptions("gcp-eu", Settings{Project: "crawl-prod", Zone: zone, RequestTimeout: "5s",
				ServiceAccount: testServiceAccount, SecretManagerEndpoint: fake.URL,
				Firewall: &FirewallSettings{SourceRanges: []string{"198.51.100.0/24"}}},
				option.WithEndpoint(fake.URL), option.WithoutAuthentication())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = p.Close() })
			return p
		}
		return providertest.Harness{
			Name: "gcp-eu", Provider: build(), Restarted: build,
			Placement: crawlv1alpha1.Placement{Zone: zone, MachineType: "e2-small", Image: "projects/debian-cloud/global/images/family/debian-12"},
			Settle:    func() { clk.Step(15 * time.Second) },
			Lose:      func(name string) { fake.Remove(zone, name) },
			Live:      func() int { return len(fake.Instances()) },
			Rules:     func() int { return len(fake.Firewalls("crawl-prod")) },
			LeaseKey: func(name string) (string, bool) {
				return fake.Secret("projects/crawl-prod/secrets/" + SecretPrefix + name)
			},
			UserData: func(name string) string {
				var all strings.Builder
				for _, vm := range fake.Instances() {
					if vm.GetName() == name {
						for _, item := range vm.GetMetadata().GetItems() {
							all.WriteString(item.GetValue())
						}
					}
				}
				return all.String()
			},
		}
	})
}
