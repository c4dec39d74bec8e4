package lease

import (
	"context"
	"sync"
	"time"
)

// UsageKey is one row of the usage the store keeps: what one tenant did
// at one host through one provider instance's proxies on one UTC day.
type UsageKey struct {
	// Day is the UTC day, as 2006-01-02.
	Day    string `json:"day,omitempty"`
	Tenant string `json:"tenant,omitempty"`
	// Host is the site (a lease's target, a tunnel's host; "" none).
	Host string `json:"host,omitempty"`
	// Provider is the provider instance of the proxies (ProviderExternal
	// for External proxies).
	Provider string `json:"provider,omitempty"`
}

// UsageCounts are the counters of one row.
type UsageCounts struct {
	// Leases are the API's leases; Tunnels the gateway's connections
	// (CONNECT tunnels and plain requests, each on a lease of its own);
	// Requests the requests the gateway saw inside them (plain HTTP and
	// inspected tunnels).
	Leases   int64 `json:"leases"`
	Tunnels  int64 `json:"tunnels"`
	Requests int64 `json:"requests"`
	// BytesUp and BytesDown are what the gateway carried each way.
	BytesUp   int64 `json:"bytesUp"`
	BytesDown int64 `json:"bytesDown"`
	// Blocks and PushBacks are the sites' refusals of the IP (a 403, a
	// block page) and their push-backs (a 429), as reported or seen.
	Blocks    int64 `json:"blocks"`
	PushBacks int64 `json:"pushBacks"`
	// ProxyMillis is proxy time held: a lease's from its grant to its
	// release or expiry, a tunnel's while it was open.
	ProxyMillis int64 `json:"proxyMillis"`
}

// Add adds o to c.
func (c *UsageCounts) Add(o UsageCounts) {
	c.Leases += o.Leases
	c.Tunnels += o.Tunnels
	c.Requests += o.Requests
	c.BytesUp += o.BytesUp
	c.BytesDown += o.BytesDown
	c.Blocks += o.Blocks
	c.PushBacks += o.PushBacks
	c.ProxyMillis += o.ProxyMillis
}

// ProxyHours is c's proxy time in hours (none below 0: a day's rows can
// hold a release's give-back of a lease granted the day before).
func (c UsageCounts) ProxyHours() float64 {
	return float64(max(c.ProxyMillis, 0)) / float64(time.Hour/time.Millisecond)
}

// UsageFields are c's counters by the name the stores keep them under.
func UsageFields(c *UsageCounts) map[string]*int64 {
	return map[string]*int64{"leases": &c.Leases, "tunnels": &c.Tunnels, "requests": &c.Requests, "bytesUp": &c.BytesUp,
		"bytesDown": &c.BytesDown, "blocks": &c.Blocks, "pushBacks": &c.PushBacks, "proxyMillis": &c.ProxyMillis}
}

// ProviderExternal is the provider of External proxies in usage rows.
const ProviderExternal = "external"

// MaxUsageHosts bounds the hosts one tenant's day keeps apart: a tenant
// that visits more (or makes up hosts to grow the store) has the rest
// counted under UsageOtherHost.
const MaxUsageHosts = 1000

// UsageOtherHost is where a tenant's day counts the hosts beyond
// MaxUsageHosts.
const UsageOtherHost = "(other)"

// DefaultUsageRetention is how long a day's usage is kept after it ends.
const DefaultUsageRetention = 400 * 24 * time.Hour

// Day is t's UTC day as usage keys name it.
func Day(t time.Time) string { return t.UTC().Format(time.DateOnly) }

// memUsage is the memory store's usage: rows by day.
type memUsage struct {
	mu   sync.Mutex
	days map[string]*memUsageDay
}

type memUsageDay struct {
	rows  map[UsageKey]*UsageCounts
	hosts map[string]map[string]bool // tenant -> hosts kept apart
	ends  time.Time
}

// CountUsage implements Store.
func (m *MemoryStore) CountUsage(_ context.Context, k UsageKey, c UsageCounts, retention time.Duration) error {
	now := m.clock.Now()
	u := &m.usageRows
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.days == nil {
		u.days = map[string]*memUsageDay{}
	}
	d := u.days[k.Day]
	if d == nil {
		// A new day: the days past their retention go (reads skip them
		// meanwhile), once a day rather than on every count.
		for day, old := range u.days {
			if !now.Before(old.ends) {
				delete(u.days, day)
			}
		}
		start, err := time.Parse(time.DateOnly, k.Day)
		if err != nil {
			return err
		}
		d = &memUsageDay{rows: map[UsageKey]*UsageCounts{}, hosts: map[string]map[string]bool{}, ends: start.Add(24*time.Hour + retention)}
		u.days[k.Day] = d
	}
	hosts := d.hosts[k.Tenant]
	if hosts == nil {
		hosts = map[string]bool{}
		d.hosts[k.Tenant] = hosts
	}
	if !hosts[k.Host] {
		if len(hosts) >= MaxUsageHosts {
			k.Host = UsageOtherHost
		} else {
			hosts[k.Host] = true
		}
	}
	row := d.rows[k]
	if row == nil {
		row = &UsageCounts{}
		d.rows[k] = row
	}
	row.Add(c)
	return nil
}

// ReadUsage implements Store.
func (m *MemoryStore) ReadUsage(_ context.Context, fromDay, toDay string) (map[UsageKey]UsageCounts, error) {
	now := m.clock.Now()
	u := &m.usageRows
	u.mu.Lock()
	defer u.mu.Unlock()
	out := map[UsageKey]UsageCounts{}
	for day, d := range u.days {
		if day < fromDay || day > toDay || !now.Before(d.ends) {
			continue
		}
		for k, c := range d.rows {
			out[k] = *c
		}
	}
	return out, nil
}
