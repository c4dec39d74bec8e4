//go:build soak

package soak

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/bans"
)

// What sites make of the fleet, under the faults: ban storms (a pool
// member reported blocked by three hosts of its own at once: the judge
// bans it, its pool replaces it, its exit IP is burned) while the pod
// runner and the fake Compute API hand released addresses to new
// instances, and a one-host outage (one host blocks every member of
// outagePool at once: suspected, nobody replaced for it). Checked
// throughout: no proxy is ever Ready on an IP burned before its instance
// served.
const (
	// outagePool never takes a ban storm: any ban there is the outage's.
	outagePool = "k8s-b"
	outageHost = "outage.soak.example"
	// banStormHosts is the pool default's bound: three hosts ban.
	banStormHosts = 3
)

// banWatch follows bans and burned IPs from the Proxies' status.
type banWatch struct {
	mu sync.Mutex
	// burned: "<provider instance>|<IP>" -> when the judge burned it, and
	// the instance it was (a burned IP is burned for its provider
	// instance: another one's instance may get it).
	burned map[string]burnedIP
	served []string // a Ready proxy on an IP burned before it served
	// outageBanned: members of outagePool banned (the guard failed).
	outageBanned []string
	// storms counts the ban storms; banned the bans seen.
	storms int
	banned map[string]bool
	// outage: the phase's members, whether the pool was told the host is
	// suspect, and what went wrong setting it up.
	outageMembers []string
	outageTold    bool
	outageErrs    []string
}

type burnedIP struct {
	at       time.Time
	instance string
}

func newBanWatch() *banWatch {
	return &banWatch{burned: map[string]burnedIP{}, banned: map[string]bool{}}
}

// api calls discovery as a crawler would, on either replica.
func (w *world) api(method, path, body string) (int, []byte, error) {
	base, _ := w.pickDiscovery()
	req, err := http.NewRequest(method, base+path, strings.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := httpClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	return res.StatusCode, raw, err
}

// blockMember leases a member of pool (the least-loaded, but none of
// avoid) and reports it blocked by hosts, then releases it; it returns the
// member's id.
func (w *world) blockMember(pool string, avoid []string, hosts ...string) (string, error) {
	var lease leaseAnswer
	for try := 0; ; try++ {
		status, raw, err := w.api(http.MethodPost, "/v1/leases", fmt.Sprintf(`{"selector":{"pool":%q},"ttlSeconds":30}`, pool))
		if err != nil {
			return "", fmt.Errorf("leasing a member of %s: %w", pool, err)
		}
		if status != http.StatusCreated {
			return "", fmt.Errorf("leasing a member of %s: %d %s", pool, status, raw)
		}
		if err := json.Unmarshal(raw, &lease); err != nil {
			return "", err
		}
		if !slices.Contains(avoid, lease.Proxy.ID) || try >= 20 {
			break
		}
		// Another lease goes to another member: hold this one until then.
		defer func(id string) { _, _, _ = w.api(http.MethodDelete, "/v1/leases/"+id, "") }(lease.LeaseID)
	}
	defer func() { _, _, _ = w.api(http.MethodDelete, "/v1/leases/"+lease.LeaseID, "") }()
	for _, h := range hosts {
		status, raw, err := w.api(http.MethodPost, "/v1/leases/"+lease.LeaseID+"/report", fmt.Sprintf(`{"result":"blocked","target":%q}`, h))
		if err != nil {
			return "", fmt.Errorf("reporting %s blocked by %s: %w", lease.Proxy.ID, h, err)
		}
		if status != http.StatusNoContent {
			return "", fmt.Errorf("reporting %s blocked by %s: %d %s", lease.Proxy.ID, h, status, raw)
		}
	}
	return lease.Proxy.ID, nil
}

// banStorm has one member of a random pool but outagePool blocked by
// three hosts of its own.
func (c *chaos) banStorm() {
	pools := slices.DeleteFunc(slices.Clone(soakPools), func(p soakPool) bool { return p.name == outagePool })
	pool := pools[c.rng.IntN(len(pools))].name
	c.bans.mu.Lock()
	c.bans.storms++
	n := c.bans.storms
	c.bans.mu.Unlock()
	var hosts []string
	for i := range banStormHosts {
		hosts = append(hosts, fmt.Sprintf("storm%d-%d.soak.example", n, i))
	}
	if _, err := c.w.blockMember(pool, nil, hosts...); err != nil {
		c.count("ban storm skipped (no member leased)")
		return
	}
	c.count("ban storm (a member blocked by 3 hosts)")
}

// hostOutage has every member of outagePool blocked by outageHost, two of
// them by two hosts more (banned, but for the guard).
func (c *chaos) hostOutage(ctx context.Context) {
	var members crawlv1alpha1.ProxyList
	if err := c.w.cluster.Env.Client.List(ctx, &members, client.InNamespace(namespace), client.MatchingLabels{crawlv1alpha1.LabelPool: outagePool}); err != nil {
		c.bans.fail("listing the outage pool: " + err.Error())
		return
	}
	var done []string
	for i := range members.Items {
		hosts := []string{outageHost}
		if i < 2 {
			hosts = append(hosts, fmt.Sprintf("x%d.soak.example", i), fmt.Sprintf("y%d.soak.example", i))
		}
		id, err := c.w.blockMember(outagePool, done, hosts...)
		if err != nil {
			c.bans.fail(err.Error())
			return
		}
		done = append(done, id)
	}
	c.bans.mu.Lock()
	c.bans.outageMembers = done
	c.bans.mu.Unlock()
	c.count("one host blocks every member of " + outagePool)
}

func (b *banWatch) fail(msg string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.outageErrs = append(b.outageErrs, msg)
}

// watch samples the Proxies every second until ctx ends: bans burn IPs,
// and no proxy may be Ready on an IP burned before its instance served.
// burnedSince says from when a burn is remembered (the memory store
// forgets on a restart).
func (b *banWatch) watch(ctx context.Context, w *world, burnedSince func() time.Time) {
	for ctx.Err() == nil {
		b.sample(ctx, w, burnedSince())
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
	b.sample(context.Background(), w, burnedSince())
}

func (b *banWatch) sample(ctx context.Context, w *world, burnedSince time.Time) {
	var list crawlv1alpha1.ProxyList
	if err := w.cluster.Env.Client.List(ctx, &list, client.InNamespace(namespace)); err != nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := range list.Items {
		p := &list.Items[i]
		if ban := p.CurrentBan(); ban != nil {
			b.banned[p.Name+"@"+p.Status.IP] = true
			if _, known := b.burned[p.Status.Provider+"|"+p.Status.IP]; !known {
				b.burned[p.Status.Provider+"|"+p.Status.IP] = burnedIP{at: ban.LastTransitionTime.Time, instance: p.Status.Instance()}
			}
			if p.PoolName() == outagePool {
				b.outageBanned = append(b.outageBanned, fmt.Sprintf("%s banned: %s", p.Name, ban.Message))
			}
		}
	}
	for i := range list.Items {
		p := &list.Items[i]
		burn, ok := b.burned[p.Status.Provider+"|"+p.Status.IP]
		ready := meta.FindStatusCondition(p.Status.Conditions, crawlv1alpha1.ConditionReady)
		if !ok || ready == nil || ready.Status != "True" || p.Status.Instance() == burn.instance || burn.at.Before(burnedSince) {
			continue
		}
		// Ready since after the burn (a second of the clocks' slack):
		// an instance that came up on a burned IP and was served.
		if ready.LastTransitionTime.After(burn.at.Add(time.Second)) {
			msg := fmt.Sprintf("%s Ready on %s since %s, burned at %s", p.Name, p.Status.IP, ready.LastTransitionTime.Format(time.RFC3339), burn.at.Format(time.RFC3339))
			if !slices.Contains(b.served, msg) {
				b.served = append(b.served, msg)
			}
		}
	}
}

// outageTold says whether outagePool got the judge's BlockingHostSuspect
// Event: proof the guard ran.
func (w *world) outageTold(ctx context.Context) bool {
	var events eventsv1.EventList
	if err := w.cluster.Env.Client.List(ctx, &events, client.InNamespace(namespace)); err != nil {
		return false
	}
	return slices.ContainsFunc(events.Items, func(e eventsv1.Event) bool {
		return e.Regarding.Name == outagePool && e.Reason == bans.EventHostSuspect
	})
}

// summary is the figures line.
func (b *banWatch) summary() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return fmt.Sprintf("%d ban storms, %d bans seen, %d IPs burned; Ready on a burned IP: %d; one-host outage over %d members of %s, told: %t, banned for it: %d",
		b.storms, len(b.banned), len(b.burned), len(b.served), len(b.outageMembers), outagePool, b.outageTold, len(b.outageBanned))
}
