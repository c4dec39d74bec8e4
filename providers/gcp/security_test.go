package gcp

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/api/option"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"

	"github.com/example/egress-proxies-operator/providers"
	"github.com/example/egress-proxies-operator/providers/gcp/fakecompute"
	"github.com/example/egress-proxies-operator/providers/providertest"
	"github.com/example/egress-proxies-operator/providers/squidconf"
)

// metadataOf returns a VM's metadata items by key.
func metadataOf(vm *computepb.Instance) map[string]string {
	out := map[string]string{}
	for _, item := range vm.GetMetadata().GetItems() {
		out[item.GetKey()] = item.GetValue()
	}
	return out
}

func TestDefaultCloudInitIsHardened(t *testing.T) {
	fake, _, p := newFake(t)
	req := createRequest(gcpProxy(), "hash-1")
	req.CloudInit = "" // the Proxy brings none
	require.NoError(t, p.Create(context.Background(), req))
	vms := fake.Instances()
	require.Len(t, vms, 1)
	vm := vms[0]
	meta := metadataOf(vm)
	userData := meta["user-data"]
	require.True(t, strings.HasPrefix(userData, "#cloud-config\n"), "user-data must be a cloud-config document")

	var doc cloudConfig
	require.NoError(t, yaml.Unmarshal([]byte(userData), &doc))
	files := map[string]string{}
	for _, f := range doc.WriteFiles {
		files[f.Path] = f.Content
		assert.Equal(t, "0600", f.Permissions, "%s is staged readable by root only", f.Path)
	}
	conf := files[vmStagingDir+"/squid.conf"]
	for _, line := range []string{
		"http_port 3128",
		"auth_param basic program /usr/bin/perl /usr/local/lib/egress-proxy/lease-auth.pl /etc/squid/lease.key /var/spool/squid/revoked-leases 21900",
		"auth_param basic credentialsttl 5 seconds",
		"acl authenticated proxy_auth REQUIRED",
		"acl clients src 198.51.100.0/24 203.0.113.0/24", // the firewall's ranges
		"acl denied_destinations dst 0.0.0.0/8 127.0.0.0/8 169.254.0.0/16 10.0.0.0/8 172.16.0.0/12 192.168.0.0/16 100.64.0.0/10 ::1/128 fe80::/10 fc00::/7",
		"http_access deny !clients",
		"http_access deny !authenticated",
		"http_access deny denied_destinations",
		"http_access deny CONNECT !SSL_ports",
		"acl SSL_ports port 443",
		"http_access allow clients authenticated",
		"http_access deny all",
	} {
		assert.Contains(t, strings.Split(conf, "\n"), line, "squid.conf lacks %q", line)
	}
	// The VM checks per-lease credentials with its own key, derived from
	// the password and never the password itself, which it fetches from
	// Secret Manager at boot as its service account: neither the key nor
	// the password is in anything a project viewer reads. A custom
	// cloud-init finds the secret, the fetcher and the helper in the
	// metadata.
	key := testCredentials.LeaseKeyFile(req.Proxy.Namespace + "/" + req.Proxy.Name)
	assert.NotEqual(t, testCredentials.LeaseKeyFile("other/proxy"), key, "each proxy has its own key")
	for k, v := range meta {
		assert.NotContains(t, v, strings.TrimSpace(key), "metadata %s holds no key", k)
		assert.NotContains(t, v, testCredentials.Password, "metadata %s holds no password", k)
	}
	assert.NotContains(t, files, vmStagingDir+"/lease.key", "the key is fetched, not written")
	assert.Equal(t, squidconf.LeaseAuthHelper, files[vmStagingDir+"/lease-auth.pl"])
	assert.Equal(t, squidconf.LeaseAuthHelper, meta[leaseAuthMetadataKey])
	assert.Equal(t, squidconf.LeaseKeyFetcher, meta[leaseKeyFetchMetadataKey])
	secret := "projects/crawl-prod/secrets/" + SecretPrefix + req.Name
	assert.Equal(t, secret+"/versions/latest", meta[leaseKeySecretMetadataKey])
	require.Len(t, vm.GetServiceAccounts(), 1)
	assert.Equal(t, testServiceAccount, vm.GetServiceAccounts()[0].GetEmail(), "the VM reads its key as this account")
	assert.Equal(t, []string{cloudPlatformScope}, vm.GetServiceAccounts()[0].GetScopes())

	fetched, err := providertest.FetchLeaseKey(t, userData, fake.URL)
	require.NoError(t, err, "the VM's boot fetches its key with its own token")
	assert.Equal(t, key, string(fetched))
	require.NoError(t, p.Create(context.Background(), req), "a retried create")
	assert.Equal(t, 1, fake.SecretVersions(secret), "a retried create adds no version")

	// Without the secret (deleted with its VM), the fetch fails and writes
	// nothing: Squid then stays down.
	require.NoError(t, p.deleteLeaseKey(context.Background(), req.Name))
	_, err = providertest.FetchLeaseKey(t, userData, fake.URL)
	assert.ErrorContains(t, err, "fetching the lease key failed")
	assert.Contains(t, userData, "systemctl disable --now squid", "no key, no Squid")
	assert.Contains(t, vm.GetTags().GetItems(), TargetTag("gcp-eu"), "the VM carries the tag its firewall rule targets")

	// The rendered config is one real Squid accepts.
	if squid, err := exec.LookPath("squid"); err == nil || fileExists("/usr/sbin/squid") {
		if squid == "" {
			squid = "/usr/sbin/squid"
		}
		path := filepath.Join(t.TempDir(), "squid.conf")
		require.NoError(t, os.WriteFile(path, []byte(conf), 0o600))
		out, err := exec.Command(squid, "-k", "parse", "-f", path).CombinedOutput()
		assert.NoError(t, err, "squid -k parse: %s", out)
	} else {
		t.Fatalf("squid not found: install Debian's squid package (sudo apt-get install -y squid; .ci/run does this)")
	}
}

func fileExists(path string) bool { _, err := os.Stat(path); return err == nil }

func TestCreateRefusesWithoutCredentials(t *testing.T) {
	fake, _, p := newFake(t)
	req := createRequest(gcpProxy(), "hash-1")
	req.Credentials = testCredentials
	req.Credentials.Username, req.Credentials.Password = "", ""
	assert.ErrorIs(t, p.Create(context.Background(), req), providers.ErrTerminal)
	assert.Empty(t, fake.Instances(), "no VM without credentials")
}

func TestValidateRefusesAPortTheFirewallDoesNotOpen(t *testing.T) {
	_, _, p := newFake(t)
	proxy := gcpProxy()
	proxy.Spec.Port = 8080
	assert.ErrorContains(t, p.Validate(proxy), "spec.port 8080 is not opened by gcp provider gcp-eu's firewall")
}

func TestFirewallLifecycle(t *testing.T) {
	ctx := context.Background()
	fake, _, p := newFake(t)
	cluster := testOwner
	otherOperator := providers.Owner{ClusterID: testOwner.ClusterID, OperatorID: "tenant-b_epo"}
	require.NoError(t, p.EnsureFirewall(ctx, cluster))
	rules := fake.Firewalls("crawl-prod")
	require.Len(t, rules, 1)
	rule := rules[0]
	assert.Equal(t, FirewallName(cluster, "gcp-eu"), rule.GetName())
	assert.Equal(t, []string{"198.51.100.0/24", "203.0.113.0/24"}, rule.GetSourceRanges(), "exactly the configured ranges")
	assert.Equal(t, []string{TargetTag("gcp-eu")}, rule.GetTargetTags())
	require.Len(t, rule.GetAllowed(), 1)
	assert.Equal(t, "tcp", rule.GetAllowed()[0].GetIPProtocol())
	assert.Equal(t, []string{"3128"}, rule.GetAllowed()[0].GetPorts())
	assert.Contains(t, rule.GetDescription(), "Managed by egress-proxies-operator (cluster-id=cluster-1, operator-id=crawl-system_epo, provider=gcp-eu)")
	assert.NotEqual(t, FirewallName(otherOperator, "gcp-eu"), rule.GetName(), "another operator's gcp-eu has a rule of its own")

	// In line: no write.
	patches := fake.Requests("firewalls.patch")
	require.NoError(t, p.EnsureFirewall(ctx, cluster))
	assert.Equal(t, patches, fake.Requests("firewalls.patch"))

	// Opened by hand to the internet: closed again.
	opened := proto.CloneOf(rule)
	opened.SourceRanges = []string{"0.0.0.0/0"}
	fake.PutFirewall("crawl-prod", opened)
	require.NoError(t, p.EnsureFirewall(ctx, cluster))
	assert.Equal(t, []string{"198.51.100.0/24", "203.0.113.0/24"}, fake.Firewalls("crawl-prod")[0].GetSourceRanges())

	// The config changes: the rule follows.
	changed := newFakeOn(t, fake, func(s *Settings) {
		s.Firewall = &FirewallSettings{SourceRanges: []string{"192.0.2.0/24"}, Ports: []int32{3128, 8080}}
	})
	require.NoError(t, changed.EnsureFirewall(ctx, cluster))
	rule = fake.Firewalls("crawl-prod")[0]
	assert.Equal(t, []string{"192.0.2.0/24"}, rule.GetSourceRanges())
	assert.Equal(t, []string{"3128", "8080"}, rule.GetAllowed()[0].GetPorts())

	// Another cluster's, another operator's and a user's rules are never
	// strays, nor is a rule made before operator ids.
	otherCluster := providers.Owner{ClusterID: "cluster-2", OperatorID: testOwner.OperatorID}
	fake.PutFirewall("crawl-prod", &computepb.Firewall{Name: proto.String(FirewallName(otherCluster, "gcp-old")),
		Description: proto.String(firewallDescription(otherCluster, "gcp-old")), SourceRanges: []string{"10.0.0.0/8"}})
	fake.PutFirewall("crawl-prod", &computepb.Firewall{Name: proto.String(FirewallName(otherOperator, "gcp-old")),
		Description: proto.String(firewallDescription(otherOperator, "gcp-old")), SourceRanges: []string{"10.0.0.0/8"}})
	fake.PutFirewall("crawl-prod", &computepb.Firewall{Name: proto.String("egress-proxy-0123abcd-gcp-old"),
		Description: proto.String("Managed by egress-proxies-operator (cluster-id=cluster-1, provider=gcp-old): opens"), SourceRanges: []string{"10.0.0.0/8"}})
	fake.PutFirewall("crawl-prod", &computepb.Firewall{Name: proto.String("allow-ssh"), SourceRanges: []string{"10.0.0.0/8"}})
	keepAll := func(string) bool { return true }
	stray, err := p.StrayFirewalls(ctx, cluster, keepAll)
	require.NoError(t, err)
	assert.Empty(t, stray)

	// The provider instance leaves the config: its rule is a stray, and goes.
	stray, err = p.StrayFirewalls(ctx, cluster, func(name string) bool { return name != "gcp-eu" })
	require.NoError(t, err)
	require.Len(t, stray, 1)
	assert.Equal(t, FirewallName(cluster, "gcp-eu"), stray[0].Name)
	require.NoError(t, p.DeleteFirewall(ctx, stray[0]))
	var names []string
	for _, fw := range fake.Firewalls("crawl-prod") {
		names = append(names, fw.GetName())
	}
	assert.ElementsMatch(t, []string{FirewallName(otherCluster, "gcp-old"), FirewallName(otherOperator, "gcp-old"), "egress-proxy-0123abcd-gcp-old", "allow-ssh"}, names)
	require.NoError(t, p.DeleteFirewall(ctx, stray[0]), "a rule already gone is fine")
}

func TestFakeDefaultsAnEmptyRuleToTheInternet(t *testing.T) {
	// Why the operator never sends a rule without source ranges: GCE reads
	// none as all. The fake does too, so a regression would show.
	fake, _, _ := newFake(t)
	fake.PutFirewall("p", &computepb.Firewall{Name: proto.String("empty")})
	assert.Equal(t, []string{"0.0.0.0/0"}, fake.Firewalls("p")[0].GetSourceRanges())
}

// newFakeOn is newFake's provider against an existing fake.
func newFakeOn(t *testing.T, fake *fakecompute.Server, mutate ...func(*Settings)) *Provider {
	t.Helper()
	s := Settings{Project: "crawl-prod", Zone: "europe-west1-b", RequestTimeout: "2s",
		ServiceAccount: testServiceAccount, SecretManagerEndpoint: fake.URL,
		Firewall: &FirewallSettings{SourceRanges: []string{"198.51.100.0/24", "203.0.113.0/24"}}}
	for _, m := range mutate {
		m(&s)
	}
	p, err := NewWithClientOptions("gcp-eu", s, option.WithEndpoint(fake.URL), option.WithoutAuthentication())
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	return p
}
