package aws

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/credentials"
	"github.com/example/egress-proxies-operator/netid"
	"github.com/example/egress-proxies-operator/providers"
	"github.com/example/egress-proxies-operator/providers/aws/fakeec2"
	"github.com/example/egress-proxies-operator/providers/providertest"
	"github.com/example/egress-proxies-operator/providers/squidconf"
)

var testOwner = providers.Owner{ClusterID: "cluster-1", OperatorID: "crawl-system_epo"}

var testCredentials = credentials.Credentials{Username: "crawler", Password: "correct-horse-battery-staple"}

// newFake starts a fake EC2 and a provider whose real SDK client talks to
// it, with its security group made.
func newFake(t *testing.T) (*fakeec2.Server, *Provider) {
	t.Helper()
	fake := fakeec2.New()
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	s := Settings{Region: "eu-west-1", Zone: "eu-west-1a", InstanceType: "t3.micro", ImageID: "ami-0debian12", RequestTimeout: "5s",
		Endpoint: srv.URL, SSMEndpoint: srv.URL, InstanceProfile: fakeec2.InstanceRole, WithoutAuthentication: true, Tags: map[string]string{"team": "crawl"},
		SecurityGroup: &SecurityGroupSettings{SourceRanges: []string{"198.51.100.0/24", "203.0.113.0/24"}}}
	p, err := NewFromSettings("aws-eu", s)
	require.NoError(t, err)
	require.NoError(t, p.EnsureFirewall(context.Background(), testOwner))
	return fake, p
}

func awsProxy(mutate ...func(*crawlv1alpha1.Proxy)) *crawlv1alpha1.Proxy {
	p := &crawlv1alpha1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "crawl", Name: "eu-1", UID: "0b0e8d4c-4a8e-4c4e-9d0e-6e8a6f1b2c3d"},
		Spec: crawlv1alpha1.ProxySpec{Mode: crawlv1alpha1.ModeManaged, Provider: "aws-eu", Port: 3128,
			Placement: &crawlv1alpha1.Placement{Zone: "eu-west-1b"}},
	}
	for _, m := range mutate {
		m(p)
	}
	return p
}

func createRequest(p *crawlv1alpha1.Proxy, hash string) providers.CreateRequest {
	return providers.CreateRequest{
		Proxy: p, Name: providers.InstanceName(testOwner.ClusterID, p.Namespace, p.Name), SpecHash: hash, Credentials: testCredentials,
		Labels: map[string]string{
			crawlv1alpha1.LabelClusterID: testOwner.ClusterID, crawlv1alpha1.LabelOperatorID: testOwner.OperatorID,
			crawlv1alpha1.LabelOwnerNamespace: p.Namespace, crawlv1alpha1.LabelOwnerName: p.Name,
			crawlv1alpha1.LabelOwnerUID: string(p.UID), crawlv1alpha1.LabelSpecHash: hash,
		},
	}
}

func TestSettingsAreChecked(t *testing.T) {
	for _, tc := range []struct {
		name string
		s    Settings
		want string
	}{
		{"no region", Settings{SecurityGroup: &SecurityGroupSettings{SourceRanges: []string{"198.51.100.0/24"}}}, "settings.region is required"},
		{"no security group", Settings{Region: "eu-west-1"}, "settings.securityGroup.sourceRanges is required"},
		{"the whole internet", Settings{Region: "eu-west-1", SecurityGroup: &SecurityGroupSettings{SourceRanges: []string{"0.0.0.0/0"}}}, "is the whole internet"},
		{"not a CIDR", Settings{Region: "eu-west-1", SecurityGroup: &SecurityGroupSettings{SourceRanges: []string{"office"}}}, "is not a CIDR"},
		{"the operator's tags", Settings{Region: "eu-west-1", SecurityGroup: &SecurityGroupSettings{SourceRanges: []string{"198.51.100.0/24"}},
			Tags: map[string]string{"crawl.example.com/owner-uid": "x"}}, "are the operator's"},
		{"no authentication without an endpoint", Settings{Region: "eu-west-1", SecurityGroup: &SecurityGroupSettings{SourceRanges: []string{"198.51.100.0/24"}},
			WithoutAuthentication: true}, "for emulators only"},
		{"no instance profile", Settings{Region: "eu-west-1", SecurityGroup: &SecurityGroupSettings{SourceRanges: []string{"198.51.100.0/24"}}},
			"settings.instanceProfile is required: each instance fetches its lease key from SSM Parameter Store"},
		{"IPv6 without a subnet", Settings{Region: "eu-west-1", SecurityGroup: &SecurityGroupSettings{SourceRanges: []string{"198.51.100.0/24"}},
			IPv6: &squidconf.IPv6Egress{}}, "settings.ipv6 needs settings.subnetId: a subnet with an IPv6 CIDR"},
		{"too many session addresses", Settings{Region: "eu-west-1", SecurityGroup: &SecurityGroupSettings{SourceRanges: []string{"198.51.100.0/24"}},
			SubnetID: "subnet-1", IPv6: &squidconf.IPv6Egress{SessionAddresses: -1}}, "settings.ipv6.sessionAddresses must be between 1 and 256, got -1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewFromSettings("aws-eu", tc.s)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestTheSecurityGroupOpensThePortToTheSourceRangesAlone(t *testing.T) {
	fake, p := newFake(t)
	groups := fake.SecurityGroups()
	require.Len(t, groups, 1)
	g := groups[0]
	assert.Equal(t, SecurityGroupName(testOwner, "aws-eu"), g.Name)
	assert.ElementsMatch(t, []fakeec2.Permission{
		{Protocol: "tcp", FromPort: 3128, ToPort: 3128, CIDR: "198.51.100.0/24"},
		{Protocol: "tcp", FromPort: 3128, ToPort: 3128, CIDR: "203.0.113.0/24"},
	}, g.Ingress)
	assert.Equal(t, map[string]string{crawlv1alpha1.LabelClusterID: "cluster-1", crawlv1alpha1.LabelOperatorID: "crawl-system_epo",
		crawlv1alpha1.LabelProvider: "aws-eu"}, g.Tags)

	// Someone opens it to the world: the next pass closes it again, and
	// makes no second group.
	req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader("Action=AuthorizeSecurityGroupIngress&GroupId="+g.ID+
		"&IpPermissions.1.IpProtocol=tcp&IpPermissions.1.FromPort=3128&IpPermissions.1.ToPort=3128&IpPermissions.1.IpRanges.1.CidrIp=0.0.0.0/0"))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	rec := httptest.NewRecorder()
	fake.ServeHTTP(rec, req)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	require.NoError(t, p.EnsureFirewall(context.Background(), testOwner))
	groups = fake.SecurityGroups()
	require.Len(t, groups, 1)
	assert.Len(t, groups[0].Ingress, 2)
	assert.NotContains(t, groups[0].Ingress, fakeec2.Permission{Protocol: "tcp", FromPort: 3128, ToPort: 3128, CIDR: "0.0.0.0/0"})
	assert.Equal(t, 1, fake.Calls("CreateSecurityGroup"))

	// The provider instance leaves the config: its group is stray, and goes
	// once no instance is in it.
	stray, err := p.StrayFirewalls(context.Background(), testOwner, func(string) bool { return false })
	require.NoError(t, err)
	require.Len(t, stray, 1)
	assert.Equal(t, "aws-eu", stray[0].Provider)
	none, err := p.StrayFirewalls(context.Background(), testOwner, func(name string) bool { return name == "aws-eu" })
	require.NoError(t, err)
	assert.Empty(t, none)
	other, err := p.StrayFirewalls(context.Background(), providers.Owner{ClusterID: "cluster-2", OperatorID: "x"}, func(string) bool { return false })
	require.NoError(t, err)
	assert.Empty(t, other, "another operator's groups are never this one's")

	require.NoError(t, p.Create(context.Background(), createRequest(awsProxy(), "hash-1")))
	err = p.DeleteFirewall(context.Background(), stray[0])
	require.ErrorIs(t, err, providers.ErrTransient, "still attached to an instance")
	inst, err := p.Get(context.Background(), createRequest(awsProxy(), "hash-1").Name, awsProxy())
	require.NoError(t, err)
	require.NoError(t, p.Delete(context.Background(), inst))
	fake.Terminate(instanceID(inst))
	require.NoError(t, p.DeleteFirewall(context.Background(), stray[0]))
	assert.Empty(t, fake.SecurityGroups())
	require.NoError(t, p.DeleteFirewall(context.Background(), stray[0]), "gone already")
}

func TestCreateRunsOneHardenedInstanceAndARetryIsANoOp(t *testing.T) {
	fake, p := newFake(t)
	req := createRequest(awsProxy(), "hash-1")
	require.NoError(t, p.Create(context.Background(), req))
	require.NoError(t, p.Create(context.Background(), req), "a retry after a lost reply")
	all := fake.Instances()
	require.Len(t, all, 1, "one instance for two RunInstances under one ClientToken")
	assert.Equal(t, 2, fake.Calls("RunInstances"))
	in := all[0]
	assert.Equal(t, ClientToken(string(req.Proxy.UID), "hash-1", "", 0), in.ClientToken)
	assert.Equal(t, "eu-west-1b", in.Zone, "the Proxy's zone over the default")
	assert.Equal(t, "t3.micro", in.Type)
	assert.Equal(t, "required", in.HTTPTokens, "IMDSv2 only")
	assert.True(t, in.PublicIPAsked, "a public IPv4")
	assert.Equal(t, []string{fake.SecurityGroups()[0].ID}, in.SecurityGroups, "in the operator's group alone")
	assert.Empty(t, in.Lifecycle, "on demand")
	for k, v := range req.Labels {
		assert.Equal(t, v, in.Tags[k], "tag %s", k)
	}
	assert.Equal(t, "aws-eu", in.Tags[crawlv1alpha1.LabelProvider])
	assert.Equal(t, req.Name, in.Tags["Name"])
	assert.Equal(t, "crawl", in.Tags["team"])

	// The default user-data: the hardened Squid, and where the instance
	// fetches its own lease key with its role: never the key, never the
	// password.
	require.True(t, strings.HasPrefix(in.UserData, "#cloud-config\n"))
	var doc squidconf.CloudConfig
	require.NoError(t, yaml.Unmarshal([]byte(in.UserData), &doc))
	files := map[string]string{}
	for _, f := range doc.WriteFiles {
		files[f.Path] = f.Content
	}
	conf := strings.Split(files[squidconf.VMStagingDir+"/squid.conf"], "\n")
	assert.Contains(t, conf, "acl clients src 198.51.100.0/24 203.0.113.0/24")
	assert.Contains(t, conf, "http_access deny !authenticated")
	assert.Contains(t, conf, "acl denied_destinations dst "+strings.Join(squidconf.VMDeniedDestinations, " "), "the metadata server among them")
	key := testCredentials.LeaseKeyFile("crawl/eu-1")
	assert.NotContains(t, in.UserData, strings.TrimSpace(key))
	assert.NotContains(t, in.UserData, testCredentials.Password)
	assert.Equal(t, ParameterName(req.Name), in.Tags["crawl.example.com/lease-key-parameter"], "a custom cloud-init finds its parameter")
	stored, ok := fake.Parameter(ParameterName(req.Name))
	require.True(t, ok, "the key is in Parameter Store before the instance runs")
	assert.Equal(t, key, stored)
	fetched, err := providertest.FetchLeaseKey(t, in.UserData, p.settings.Endpoint)
	require.NoError(t, err, "the instance's boot fetches its key with its role's credentials, signed")
	assert.Equal(t, key, string(fetched))

	// A new spec (an immutable replacement) is a new token: a second
	// instance beside the first, which the reconciler then deletes.
	require.NoError(t, p.Create(context.Background(), createRequest(awsProxy(), "hash-2")))
	require.Len(t, fake.Instances(), 2)
	assert.Equal(t, ClientToken(string(req.Proxy.UID), "hash-2", "", 0), fake.Instances()[1].ClientToken)
	assert.Equal(t, "hash-2", fake.Instances()[1].Tags[crawlv1alpha1.LabelSpecHash])

	// A create without credentials is refused: never an open proxy.
	bare := createRequest(awsProxy(func(p *crawlv1alpha1.Proxy) { p.UID = "other" }), "hash-1")
	bare.Credentials = credentials.Credentials{}
	require.ErrorIs(t, p.Create(context.Background(), bare), providers.ErrTerminal)
	assert.Len(t, fake.Instances(), 2)
}

// TestALostReplyRetriedByTheSDKRunsOneInstance: RunInstances acts and its
// reply is lost (a 500); the SDK's own retry carries the same ClientToken,
// so the create succeeds with the one instance.
func TestALostReplyRetriedByTheSDKRunsOneInstance(t *testing.T) {
	fake, p := newFake(t)
	fake.LoseNextReply("RunInstances")
	require.NoError(t, p.Create(context.Background(), createRequest(awsProxy(), "hash-1")))
	assert.Equal(t, 2, fake.Calls("RunInstances"), "the SDK retried the call whose reply was lost")
	assert.Len(t, fake.Instances(), 1, "one instance for both calls")
}

func TestGetListAndDelete(t *testing.T) {
	fake, p := newFake(t)
	fake.BootPolls = 2
	ctx := context.Background()
	proxy := awsProxy()
	req := createRequest(proxy, "hash-1")
	require.NoError(t, p.Create(ctx, req))

	inst, err := p.Get(ctx, req.Name, proxy)
	require.NoError(t, err)
	assert.Equal(t, providers.StatePending, inst.State)
	inst, err = p.Get(ctx, req.Name, proxy)
	require.NoError(t, err)
	assert.Equal(t, providers.StateRunning, inst.State)
	assert.NotEmpty(t, inst.IP)
	assert.Equal(t, int32(3128), inst.Port)
	assert.Equal(t, "hash-1", inst.SpecHash())
	assert.Equal(t, string(proxy.UID), inst.OwnerUID())
	assert.Equal(t, "aws-eu", inst.ProviderName())
	assert.Equal(t, req.Name, inst.Name)
	assert.False(t, inst.CreatedAt.IsZero())

	listed, err := p.List(ctx, testOwner)
	require.NoError(t, err)
	require.Len(t, listed, 1)
	assert.Equal(t, inst.Location, listed[0].Location)
	other, err := p.List(ctx, providers.Owner{ClusterID: "cluster-2", OperatorID: "x"})
	require.NoError(t, err)
	assert.Empty(t, other, "another operator's instances are never this one's")
	_, sibling := newFakeOn(t, fake, "aws-us")
	mine, err := sibling.List(ctx, testOwner)
	require.NoError(t, err)
	assert.Empty(t, mine, "another provider instance in the same account lists its own only")
	_, err = sibling.Get(ctx, req.Name, proxy)
	require.ErrorIs(t, err, providers.ErrNotFound)
	require.NoError(t, sibling.Delete(ctx, inst), "nor terminates them")
	assert.Equal(t, 0, fake.Calls("TerminateInstances"))

	require.NoError(t, p.Delete(ctx, inst))
	require.NoError(t, p.Delete(ctx, inst), "deleting twice is fine")
	_, err = p.Get(ctx, req.Name, proxy)
	require.ErrorIs(t, err, providers.ErrNotFound, "terminated is gone")
	require.NoError(t, p.Delete(ctx, inst), "and so is deleting what is gone")

	// The same spec again: EC2 still answers its first token with the
	// terminated instance, so Create runs under the next.
	require.NoError(t, p.Create(ctx, req))
	all := fake.Instances()
	require.Len(t, all, 2)
	assert.Equal(t, ClientToken(string(proxy.UID), "hash-1", "", 1), all[1].ClientToken)
}

// newFakeOn is a second provider instance on the same fake EC2.
func newFakeOn(t *testing.T, fake *fakeec2.Server, name string) (*fakeec2.Server, *Provider) {
	t.Helper()
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	p, err := NewFromSettings(name, Settings{Region: "eu-west-1", Zone: "eu-west-1a", InstanceType: "t3.micro", ImageID: "ami-0debian12",
		Endpoint: srv.URL, SSMEndpoint: srv.URL, InstanceProfile: fakeec2.InstanceRole, WithoutAuthentication: true, SecurityGroup: &SecurityGroupSettings{SourceRanges: []string{"198.51.100.0/24"}}})
	require.NoError(t, err)
	require.NoError(t, p.EnsureFirewall(context.Background(), testOwner))
	return fake, p
}

// TestAnInstanceWithAnIPv6Prefix: with settings.ipv6 an instance gets a
// delegated /80 of its subnet (EC2 refuses one without a subnet), its own
// cloud-init finds the prefix at boot, and the instance reports the prefix
// and its session addresses once it runs; instances of one subnet share
// its /64, as on EC2. The security group lets IPv6 traffic out, which a
// new group's default outbound rule does not.
func TestAnInstanceWithAnIPv6Prefix(t *testing.T) {
	fake := fakeec2.New()
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	p, err := NewFromSettings("aws-eu", Settings{Region: "eu-west-1", Zone: "eu-west-1a", InstanceType: "t3.micro", ImageID: "ami-0debian12",
		Endpoint: srv.URL, SSMEndpoint: srv.URL, InstanceProfile: fakeec2.InstanceRole, WithoutAuthentication: true, SubnetID: "subnet-0dual",
		SecurityGroup: &SecurityGroupSettings{SourceRanges: []string{"198.51.100.0/24"}}, IPv6: &squidconf.IPv6Egress{SessionAddresses: 4}})
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, p.EnsureFirewall(ctx, testOwner))
	var prefixes []netip.Prefix
	for _, name := range []string{"eu-1", "eu-2"} {
		proxy := awsProxy(func(x *crawlv1alpha1.Proxy) { x.Name, x.UID = name, types.UID("uid-"+name) })
		req := createRequest(proxy, "hash-1")
		require.NoError(t, p.Create(ctx, req))
		inst, err := p.Get(ctx, req.Name, proxy)
		require.NoError(t, err)
		require.Equal(t, providers.StateRunning, inst.State)
		assert.Equal(t, int32(4), inst.SessionAddresses)
		prefix, err := netip.ParsePrefix(inst.IPv6Prefix)
		require.NoError(t, err, "a prefix: %q", inst.IPv6Prefix)
		assert.Equal(t, 80, prefix.Bits())
		prefixes = append(prefixes, prefix)
	}
	require.NoError(t, p.EnsureFirewall(ctx, testOwner), "a second pass adds no rule twice")
	assert.Contains(t, fake.SecurityGroups()[0].Egress, fakeec2.Permission{Protocol: "-1", CIDR: "::/0"}, "IPv6 traffic may leave")
	in := fake.Instances()[0]
	assert.Equal(t, 1, in.IPv6PrefixesAsked)
	assert.Contains(t, in.UserData, "session-addresses.py", "the instance's cloud-init finds its prefix at boot")
	assert.NotEqual(t, prefixes[0], prefixes[1])
	var rule netid.Rule
	assert.Equal(t, rule.Of(prefixes[0].Addr().String()), rule.Of(prefixes[1].Addr().String()), "one subnet's instances share its /64: one sender")
}

func TestInstancesLostBehindTheOperatorsBack(t *testing.T) {
	fake, p := newFake(t)
	ctx := context.Background()
	spot := awsProxy(func(p *crawlv1alpha1.Proxy) {
		p.Name, p.UID = "spot-1", "uid-spot"
		p.Spec.Placement.Parameters = map[string]string{"marketType": "spot"}
	})
	stopped := awsProxy(func(p *crawlv1alpha1.Proxy) { p.Name, p.UID = "stopped-1", "uid-stopped" })
	for _, proxy := range []*crawlv1alpha1.Proxy{spot, stopped} {
		require.NoError(t, p.Create(ctx, createRequest(proxy, "hash-1")))
	}
	all := fake.Instances()
	assert.Equal(t, "spot", all[0].Lifecycle, "Spot through InstanceMarketOptions")
	for _, proxy := range []*crawlv1alpha1.Proxy{spot, stopped} {
		inst, err := p.Get(ctx, createRequest(proxy, "hash-1").Name, proxy)
		require.NoError(t, err)
		require.Equal(t, providers.StateRunning, inst.State)
	}
	fake.Interrupt(all[0].ID)
	fake.Stop(all[1].ID)
	_, err := p.Get(ctx, createRequest(spot, "hash-1").Name, spot)
	require.ErrorIs(t, err, providers.ErrNotFound, "an interrupted Spot instance is gone, as a preempted GCE VM is: the reconciler replaces it")
	inst, err := p.Get(ctx, createRequest(stopped, "hash-1").Name, stopped)
	require.NoError(t, err)
	assert.Equal(t, providers.StateFailed, inst.State, "stopped: replaced")
	assert.Contains(t, inst.Message, "stopped")
}

func TestCapacityQuotaAndOutagesAreToldApart(t *testing.T) {
	fake, p := newFake(t)
	ctx := context.Background()
	fake.SetZoneFull("eu-west-1b", true)
	err := p.Create(ctx, createRequest(awsProxy(), "hash-1"))
	require.ErrorIs(t, err, providers.ErrCapacity)
	require.ErrorIs(t, err, providers.ErrTerminal, "the zone is full: not this call's to retry")
	assert.Contains(t, err.Error(), "InsufficientInstanceCapacity")
	fake.SetZoneFull("eu-west-1b", false)

	fake.SetInstanceLimit(1)
	require.NoError(t, p.Create(ctx, createRequest(awsProxy(), "hash-1")))
	err = p.Create(ctx, createRequest(awsProxy(func(p *crawlv1alpha1.Proxy) { p.Name, p.UID = "eu-2", "uid-2" }), "hash-1"))
	require.ErrorIs(t, err, providers.ErrQuota)
	assert.Contains(t, err.Error(), "quota exceeded: InstanceLimitExceeded")

	fake.SetDown(true)
	_, err = p.List(ctx, testOwner)
	require.ErrorIs(t, err, providers.ErrTransient, "an API that does not answer: retry")
	fake.SetDown(false)

	fake.FailNext("DescribeInstances", fakeec2.APIError{Status: http.StatusBadRequest, Code: "UnauthorizedOperation", Message: "You are not authorized to perform this operation."})
	_, err = p.List(ctx, testOwner)
	require.ErrorIs(t, err, providers.ErrTerminal)
	assert.Contains(t, providers.TerminalMessage(err), "UnauthorizedOperation")
}

func TestValidate(t *testing.T) {
	_, p := newFake(t)
	require.NoError(t, p.Validate(awsProxy()))
	err := p.Validate(awsProxy(func(p *crawlv1alpha1.Proxy) { p.Spec.Port = 8080 }))
	require.ErrorIs(t, err, providers.ErrTerminal)
	assert.Contains(t, err.Error(), "not opened by aws provider aws-eu's security group")
	err = p.Validate(awsProxy(func(p *crawlv1alpha1.Proxy) { p.Spec.Placement.Parameters = map[string]string{"marketType": "cheap"} }))
	assert.Contains(t, err.Error(), "must be on-demand or spot")
	err = p.Validate(awsProxy(func(p *crawlv1alpha1.Proxy) {
		p.Spec.Placement.Parameters = map[string]string{"provisioningModel": "SPOT"}
	}))
	assert.Contains(t, err.Error(), "not known to aws provider aws-eu")
}
