package aws

import (
	"net/http/httptest"
	"strings"
	"testing"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/providers"
	"github.com/example/egress-proxies-operator/providers/aws/fakeec2"
	"github.com/example/egress-proxies-operator/providers/providertest"
)

// TestConformance runs the cloud providers' suite against the fake EC2.
func TestConformance(t *testing.T) {
	providertest.Run(t, func(t *testing.T) providertest.Harness {
		fake := fakeec2.New()
		srv := httptest.NewServer(fake)
		t.Cleanup(srv.Close)
		build := func() providers.Provider {
			p, err := NewFromSettings("aws-eu", Settings{Region: "eu-west-1", Zone: "eu-west-1a", InstanceType: "t3.micro", ImageID: "ami-0debian12",
				Endpoint: srv.URL, SSMEndpoint: srv.URL, InstanceProfile: fakeec2.InstanceRole, WithoutAuthentication: true, RequestTimeout: "5s",
				SecurityGroup: &SecurityGroupSettings{SourceRanges: []string{"198.51.100.0/24"}}})
			if err != nil {
				t.Fatal(err)
			}
			return p
		}
		return providertest.Harness{
			Name: "aws-eu", Provider: build(), Restarted: build,
			Placement: crawlv1alpha1.Placement{Zone: "eu-west-1b"},
			Settle:    func() {},
			Lose: func(name string) {
				for _, in := range fake.Instances() {
					if in.Tags["Name"] == name && in.State != fakeec2.StateTerminated {
						fake.Terminate(in.ID)
					}
				}
			},
			Live: func() int {
				n := 0
				for _, in := range fake.Instances() {
					if in.State != fakeec2.StateTerminated && in.State != fakeec2.StateShuttingDown {
						n++
					}
				}
				return n
			},
			Rules:    func() int { return len(fake.SecurityGroups()) },
			LeaseKey: func(name string) (string, bool) { return fake.Parameter(ParameterName(name)) },
			UserData: func(name string) string {
				var all strings.Builder
				for _, in := range fake.Instances() {
					if in.Tags["Name"] == name {
						all.WriteString(in.UserData)
					}
				}
				return all.String()
			},
		}
	})
}
