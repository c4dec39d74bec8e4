package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/providers/aws/fakeec2"
	"github.com/example/egress-proxies-operator/providers/gcp/fakecompute"
	"github.com/example/egress-proxies-operator/test/cluster"
)

const (
	// apiOutage is how long the EC2 API answers nothing but 503s while
	// the pool must keep serving.
	apiOutage = 2 * time.Minute
	// Where the two clouds' members live: one gcp zone, two aws zones of
	// which the first has no capacity.
	cloudsGCPZone   = "europe-west1-b"
	cloudsFullZone  = "eu-west-1a"
	cloudsRoomyZone = "eu-west-1b"
)

// TestPoolAcrossClouds runs the operator with a gcp provider instance on
// the fake Compute API and an aws one on the fake EC2 API, each cloud's
// VMs played by in-process proxies on their public addresses. A pool of 6
// over both comes up 3 and 3 (the gcp VMs dual-stack, each with its IPv6
// range and session addresses in status); the aws zone out of capacity sends its
// members to the other aws zone (condition, Event, metric); then the EC2
// API answers 503 for minutes, and the pool keeps serving: every member
// stays Ready, aws leases tunnel through their instances all along, a lost
// gcp VM is replaced meanwhile, and no aws instance is made or lost for it.
func TestPoolAcrossClouds(t *testing.T) {
	dir := t.TempDir()
	compute := fakecompute.New(clock.RealClock{}, fakecompute.Timings{Provisioning: 500 * time.Millisecond, Staging: 500 * time.Millisecond, Stopping: time.Second})
	t.Cleanup(compute.Close)
	ec2 := fakeec2.New()
	ec2.SetZoneFull(cloudsFullZone, true)
	ec2API := httptest.NewServer(ec2)
	t.Cleanup(ec2API.Close)
	// The gcp VMs are dual-stack: each comes up with an IPv6 range.
	c, err := cluster.Start(dir, cluster.Options{ExtraProviders: cluster.GCPProvider("gcp-eu", "crawl-clouds", cloudsGCPZone, compute.URL) +
		"    ipv6: {sessionAddresses: 4}\n" + cluster.AWSProvider("aws-eu", "eu-west-1", cloudsRoomyZone, ec2API.URL)})
	require.NoError(t, err)
	t.Cleanup(c.Stop)
	for _, vms := range []*cluster.VMRunner{cluster.NewVMRunner(compute), cluster.NewEC2Runner(ec2)} {
		go vms.Run(t.Context())
		t.Cleanup(vms.CloseAll)
	}
	ctx := context.Background()
	cl := c.Env.Client
	const token = "clouds-token"
	require.NoError(t, cl.Create(ctx, tokenSecret(token)))
	metrics := cluster.FreeAddr()
	opts := cluster.OperatorOptions{DiscoveryAddr: cluster.FreeAddr(), ProbeAddr: cluster.FreeAddr(),
		// The instance watcher lists every 10s: a VM lost during the
		// outage is found well within it.
		ExtraArgs: []string{"--metrics-bind-address=" + metrics, "--metrics-secure=false", "--instance-resync-interval=10s"}}
	op, err := c.StartOperator(world.bin, opts)
	require.NoError(t, err)
	t.Cleanup(func() {
		op.Stop()
		if t.Failed() {
			out, _ := readTail(op.Log, 8000)
			t.Logf("--- the operator's log (tail) ---\n%s", out)
		}
	})
	discovery := discoveryClient{base: "http://" + opts.DiscoveryAddr, token: token}

	ns := c.Env.Namespace(t)
	pool := &crawlv1alpha1.ProxyPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "mixed"},
		Spec: crawlv1alpha1.ProxyPoolSpec{
			Replicas: ptr(int32(6)),
			Providers: []crawlv1alpha1.PoolProvider{
				{Name: "gcp-eu", Zones: []string{cloudsGCPZone}},
				{Name: "aws-eu", Zones: []string{cloudsFullZone, cloudsRoomyZone}},
			},
			Template: crawlv1alpha1.ProxyTemplate{Spec: crawlv1alpha1.ProxySpec{
				Mode: crawlv1alpha1.ModeManaged, Provider: "gcp-eu", Port: crawlv1alpha1.DefaultPort, Attributes: map[string]string{"suite": ns},
			}},
		},
	}
	require.NoError(t, cl.Create(ctx, pool))
	membersOf := func() []crawlv1alpha1.Proxy {
		var list crawlv1alpha1.ProxyList
		require.NoError(t, cl.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{crawlv1alpha1.LabelPool: pool.Name}))
		return list.Items
	}
	var last crawlv1alpha1.ProxyPool
	waitSettled := func(what string) {
		t.Helper()
		require.Eventually(t, func() bool {
			if cl.Get(ctx, client.ObjectKeyFromObject(pool), &last) != nil {
				return false
			}
			ms, err := listMembers(cl, pool)()
			return err == nil && settledAt(6)(&last, ms) && allHealthy(ms)
		}, 2*waitFor, poll, "%s: the pool never settled at 6 Ready and Healthy; last status %+v", what, &last.Status)
	}
	waitSettled("bring-up")

	// 3 and 3, the aws ones in the zone with room, each on its cloud's
	// address range.
	slots := map[string]int{}
	for _, m := range membersOf() {
		slots[m.Spec.Provider+"/"+m.Spec.Placement.Zone]++
		switch m.Spec.Provider {
		case "gcp-eu":
			assert.True(t, strings.HasPrefix(m.Status.IP, "127.2."), "%s: a gcp VM's address, got %s", m.Name, m.Status.IP)
			assert.True(t, strings.HasPrefix(m.Status.IPv6Prefix, "2001:db8:6:") && strings.HasSuffix(m.Status.IPv6Prefix, "/96"),
				"%s: a dual-stack VM's IPv6 range, got %q", m.Name, m.Status.IPv6Prefix)
			assert.Equal(t, int32(4), m.Status.SessionAddresses, "%s: its Squid leaves from 4 addresses of it", m.Name)
		case "aws-eu":
			assert.True(t, strings.HasPrefix(m.Status.IP, "127.90."), "%s: an EC2 instance's public IP, got %s", m.Name, m.Status.IP)
		}
	}
	assert.Equal(t, map[string]int{"gcp-eu/" + cloudsGCPZone: 3, "aws-eu/" + cloudsRoomyZone: 3}, slots,
		"3 members per cloud; none left in the aws zone without capacity")
	limited := meta.FindStatusCondition(last.Status.Conditions, crawlv1alpha1.ConditionPlacementLimited)
	require.NotNil(t, limited, "the pool says where it has no room")
	assert.Equal(t, metav1.ConditionTrue, limited.Status)
	assert.Equal(t, "NoRoom", limited.Reason)
	assert.Contains(t, limited.Message, cloudsFullZone)
	assert.True(t, poolEvent(t, cl, ns, "PlacementFull", cloudsFullZone), "a PlacementFull Event names the zone")
	assert.Equal(t, 1.0, metricValue(t, "http://"+metrics+"/metrics", "proxy_operator_pool_full_slots", "pool", pool.Name),
		"the full slot is counted")
	assert.Less(t, ec2.Calls("RunInstances"), 10, "3 instances run, and the full zone is not retried in a loop")
	for cloud, want := range map[string]int{"gcp": 3, "aws": 3} {
		assert.Len(t, discovery.list(t, "cloud="+cloud+"&suite="+ns), want, "discovery derives cloud=%s", cloud)
	}
	awsBefore := liveEC2(ec2)
	require.Len(t, awsBefore, 3)

	// The EC2 API fails for minutes. Meanwhile a gcp VM is lost and made
	// again; the pool never has fewer than 5 serving (the lost one aside),
	// and aws leases tunnel through their instances every few seconds.
	floor := sampleMembersFloor(listMembers(cl, pool))
	ec2.SetDown(true)
	outageEnds := time.Now().Add(apiOutage)
	lostGCP := map[string]uint64{} // the lost VM's id by its name
	for _, m := range membersOf() {
		if m.Spec.Provider == "gcp-eu" {
			for _, vm := range compute.Instances() {
				if vm.GetName() == m.Status.InstanceName {
					lostGCP[vm.GetName()] = vm.GetId()
				}
			}
			require.Len(t, lostGCP, 1)
			require.True(t, compute.Remove(cloudsGCPZone, m.Status.InstanceName), "the gcp VM is lost")
			break
		}
	}
	tunnels, failures := 0, []string{}
	for time.Now().Before(outageEnds) {
		exit, err := discovery.fetchThroughLease(t, c.Target, "cloud=aws&suite="+ns)
		tunnels++
		if err != nil {
			failures = append(failures, fmt.Sprintf("%s: %v", time.Now().Format(time.TimeOnly), err))
		} else {
			assert.True(t, strings.HasPrefix(exit, "127.90."), "the site sees an EC2 instance's IP, got %s", exit)
		}
		time.Sleep(2 * time.Second)
	}
	// The gcp side healed while the EC2 API was still down.
	assert.Equal(t, 6, serving(membersOf()), "6 serving at the outage's end")
	for _, vm := range compute.Instances() {
		if id, lost := lostGCP[vm.GetName()]; lost {
			assert.NotEqual(t, id, vm.GetId(), "the lost VM %s was made again", vm.GetName())
		}
	}
	assert.Len(t, compute.Instances(), 3, "3 gcp VMs at the outage's end, the lost one made again")
	ec2.SetDown(false)
	fewest, samples := floor.finish()
	assert.Empty(t, failures, "every aws lease tunnelled during the outage (%d tried)", tunnels)
	assert.GreaterOrEqual(t, samples, int(apiOutage/time.Second), "the sampler kept sampling")
	assert.GreaterOrEqual(t, fewest, 5, "at most the lost gcp member was missing while the EC2 API was down")
	assert.Equal(t, awsBefore, liveEC2(ec2), "no aws instance was made or terminated for the outage")

	// After it: 6 Ready again, the lost gcp member replaced, the aws ones
	// the same instances as before.
	waitSettled("after the outage")
	for _, m := range membersOf() {
		assert.Equal(t, metav1.ConditionTrue, healthyStatus(&m), "%s healthy", m.Name)
		if m.Spec.Provider == "aws-eu" {
			assert.Contains(t, awsBefore, m.Status.InstanceName, "%s kept its instance through the outage", m.Name)
		}
	}
	assert.Len(t, liveEC2(ec2), 3, "no stray aws instance")
}

// allHealthy says every member is Ready and its probes pass.
func allHealthy(ms []crawlv1alpha1.Proxy) bool {
	for i := range ms {
		if !readyAndHealthy(&ms[i]) {
			return false
		}
	}
	return true
}

// liveEC2 names the fake EC2's instances not terminated (their Name tag,
// a member's status.instanceName).
func liveEC2(fake *fakeec2.Server) []string {
	var names []string
	for _, in := range fake.Instances() {
		if in.State != fakeec2.StateTerminated && in.State != fakeec2.StateShuttingDown {
			names = append(names, in.Tags["Name"])
		}
	}
	return names
}

// poolEvent says whether an Event of reason about the pool mentions what.
func poolEvent(t *testing.T, cl client.Client, ns, reason, what string) bool {
	t.Helper()
	var events eventsv1.EventList
	require.NoError(t, cl.List(context.Background(), &events, client.InNamespace(ns)))
	for _, e := range events.Items {
		if e.Reason == reason && strings.Contains(e.Note, what) {
			return true
		}
	}
	return false
}

// metricValue is the value of the series of family whose label has value.
func metricValue(t *testing.T, metricsURL, family, label, value string) float64 {
	t.Helper()
	v, ok := seriesValue(t, metricsURL, family, label, value)
	if !ok {
		t.Fatalf("%s has no series with %s=%q", family, label, value)
	}
	return v
}

// seriesValue is the value of the gauge or counter of family whose label
// has value, and whether there is one.
func seriesValue(t *testing.T, metricsURL, family, label, value string) (float64, bool) {
	t.Helper()
	families, err := cluster.ScrapeMetrics(metricsURL)
	require.NoError(t, err)
	for _, m := range families[family].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == label && l.GetValue() == value {
				if c := m.GetCounter(); c != nil {
					return c.GetValue(), true
				}
				return m.GetGauge().GetValue(), true
			}
		}
	}
	return 0, false
}

// discoveryClient is a crawler of the discovery API of an operator other
// than the shared one.
type discoveryClient struct{ base, token string }

// list is the healthy proxies whose attributes match query.
func (d discoveryClient) list(t *testing.T, query string) []any {
	t.Helper()
	r := callAt(t, d.base, http.MethodGet, "/v1/proxies?healthy=true&"+query, "", d.token)
	require.Equal(t, http.StatusOK, r.status, "%v", r.body)
	items, _ := r.body["proxies"].([]any)
	return items
}

// fetchThroughLease leases a proxy matching selector (key=value&...),
// fetches the target's echo page through it with the lease's credentials,
// releases the lease, and returns the address the site saw.
func (d discoveryClient) fetchThroughLease(t *testing.T, target *cluster.Target, selector string) (string, error) {
	t.Helper()
	sel := map[string]string{}
	for _, kv := range strings.Split(selector, "&") {
		k, v, _ := strings.Cut(kv, "=")
		sel[k] = v
	}
	body, _ := json.Marshal(map[string]any{"selector": sel, "ttlSeconds": 60})
	lease := callAt(t, d.base, http.MethodPost, "/v1/leases", string(body), d.token)
	if lease.status != http.StatusCreated {
		return "", fmt.Errorf("lease: %d %v", lease.status, lease.body)
	}
	defer callAt(t, d.base, http.MethodDelete, "/v1/leases/"+lease.body["leaseID"].(string), "", d.token)
	proxy, _ := lease.body["proxy"].(map[string]any)
	proxyURL, err := url.Parse(fmt.Sprint(proxy["url"]))
	if err != nil {
		return "", err
	}
	ca, err := os.ReadFile(target.CAFile)
	require.NoError(t, err)
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(ca))
	httpClient := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		Proxy: http.ProxyURL(proxyURL), TLSClientConfig: &tls.Config{RootCAs: roots},
	}}
	res, err := httpClient.Get(target.EchoURL)
	if err != nil {
		return "", fmt.Errorf("through %v: %w", proxy["id"], err)
	}
	defer res.Body.Close()
	seen, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK {
		return "", fmt.Errorf("through %v: %s", proxy["id"], res.Status)
	}
	return strings.TrimSpace(string(seen)), nil
}
