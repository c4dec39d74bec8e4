package lease_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/example/egress-proxies-operator/lease"
)

// TestHoldersAt: which leases held an IP at a moment, from their records.
func TestHoldersAt(t *testing.T) {
	at := func(m int) time.Time { return time.Date(2026, 12, 1, 14, m, 0, 0, time.UTC) }
	rec := func(id, event, tenant, ip string, start, until int) lease.LedgerEntry {
		return lease.LedgerEntry{Kind: lease.LedgerLease, Event: event, LeaseID: id, Tenant: tenant, Proxy: "ns/" + id, IP: ip, Start: at(start), Until: at(until)}
	}
	entries := []lease.LedgerEntry{
		rec("a", lease.LedgerStart, "team-a", "203.0.113.7", 0, 5),
		rec("a", lease.LedgerRenew, "team-a", "203.0.113.7", 0, 10), // renewed: held to 14:10
		rec("b", lease.LedgerStart, "team-b", "203.0.113.7", 1, 30),
		rec("b", lease.LedgerEnd, "team-b", "203.0.113.7", 1, 3), // released at 14:03
		rec("c", lease.LedgerStart, "team-c", "198.51.100.1", 0, 30),
		rec("d", lease.LedgerRenew, "team-d", "203.0.113.7", 0, 20), // its start is outside the window read
		rec("e", lease.LedgerStart, "team-e", "203.0.113.7", 6, 20), // starts after the moment asked
		func() lease.LedgerEntry { // behind a NAT: sites saw another address
			e := rec("g", lease.LedgerStart, "team-g", "198.51.100.20", 0, 30)
			e.ExitIP = "192.0.2.99"
			return e
		}(),
		func() lease.LedgerEntry { // a dual-stack proxy: sites that speak IPv6 saw an address of its range
			e := rec("f", lease.LedgerStart, "team-f", "198.51.100.9", 0, 30)
			e.IPv6 = "2001:db8:1:2:0:5::/96"
			return e
		}(),
	}
	for _, tc := range []struct {
		name string
		ip   string
		at   time.Time
		want []string // lease ids
	}{
		{"renewed and released", "203.0.113.7", at(2), []string{"a", "d", "b"}},
		{"after the release", "203.0.113.7", at(4), []string{"a", "d"}},
		{"after the first expiry, before the renewed one", "203.0.113.7", at(7), []string{"a", "d", "e"}},
		{"after every end", "203.0.113.7", at(25), nil},
		{"the end is inclusive", "203.0.113.7", at(3), []string{"a", "d", "b"}},
		{"another IP", "198.51.100.1", at(2), []string{"c"}},
		{"an IP nobody held", "192.0.2.1", at(2), nil},
		{"an address of an IPv6 range", "2001:db8:1:2:0:5:0:7", at(2), []string{"f"}},
		{"the dual-stack proxy's IPv4 address", "198.51.100.9", at(2), []string{"f"}},
		{"the same /64, another range", "2001:db8:1:2:0:6::1", at(2), nil},
		{"the exit IP sites saw", "192.0.2.99", at(2), []string{"g"}},
		{"and the proxy's own address", "198.51.100.20", at(2), []string{"g"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, h := range lease.HoldersAt(entries, tc.ip, tc.at) {
				got = append(got, h.LeaseID)
			}
			assert.Equal(t, tc.want, got)
		})
	}
	b := lease.HoldersAt(entries, "203.0.113.7", at(2))[2]
	assert.Equal(t, lease.Holding{Tenant: "team-b", Kind: lease.LedgerLease, LeaseID: "b", Proxy: "ns/b", Start: at(1), End: at(3)}, b, "a holding says when it ended")
}
