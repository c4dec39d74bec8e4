package discovery

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/example/egress-proxies-operator/broker"
	"github.com/example/egress-proxies-operator/lease"
	"github.com/example/egress-proxies-operator/tenant"
)

// TestAttribution: leases and gateway tunnels are recorded in the JSON-lines
// log and the store; GET /v1/attribution names the tenants that held an IP
// at a moment, and only to those allowed to ask; bad input is refused.
func TestAttribution(t *testing.T) {
	f := newFixture(t)
	f.token.value = "platform-token"
	teams := twoTeams()
	teams.readers = map[string]bool{"system:serviceaccount:team-b:crawler": true}
	f.configure(func(o *Options) { o.Tenants = teams })
	var log bytes.Buffer
	f.configure(func(o *Options) { o.Ledger = lease.NewJSONLines(&log, logr.Discard()) })
	f.member("eu", "eu-0", "127.0.0.11")
	f.member("us", "us-0", "127.0.0.12")
	as := func(token string) []string { return []string{"Authorization", "Bearer " + token} }

	start := f.clock.Now()
	granted := f.do("POST", "/v1/leases", `{"ttlSeconds":60,"target":"shop.example"}`, as("token-a")...)
	require.Equal(t, http.StatusCreated, granted.status)
	f.clock.Step(30 * time.Second)
	require.Equal(t, http.StatusOK, f.do("POST", "/v1/leases/"+granted.body["leaseID"].(string)+"/renew", `{"ttlSeconds":60}`, as("token-a")...).status)
	f.clock.Step(30 * time.Second)
	require.Equal(t, http.StatusNoContent, f.do("DELETE", "/v1/leases/"+granted.body["leaseID"].(string), "", as("token-a")...).status)
	b, err := f.srv.Tunnels().Authorize(context.Background(), "token-b")
	require.NoError(t, err)
	up, err := f.srv.Tunnels().Tunnel(context.Background(), broker.TunnelRequest{Tenant: b, Session: "s1", Host: "shop.example", TTL: time.Minute, SessionIdle: time.Minute})
	require.NoError(t, err)
	f.clock.Step(10 * time.Second)
	f.srv.Tunnels().ReleaseTunnel(context.Background(), up.LeaseID, "s1", broker.Carried{Up: 96, Down: 4000})

	lines := strings.Split(strings.TrimSpace(log.String()), "\n")
	require.Len(t, lines, 5, "start, renew and end of the lease; start and end of the tunnel")
	var last lease.LedgerEntry
	require.NoError(t, json.Unmarshal([]byte(lines[4]), &last), "each line is one JSON record")
	assert.Equal(t, lease.LedgerEntry{At: f.clock.Now().UTC(), Kind: lease.LedgerTunnel, Event: lease.LedgerEnd, LeaseID: up.LeaseID, Tenant: b.Name, Session: "s1",
		Proxy: "crawl/us-0", IP: "127.0.0.12", Target: "shop.example", Start: start.Add(time.Minute).UTC(), Until: f.clock.Now().UTC(), Bytes: 4096}, last)

	ask := func(token, ip string, at time.Time) response {
		return f.do("GET", "/v1/attribution?ip="+ip+"&at="+at.UTC().Format(time.RFC3339), "", as(token)...)
	}
	r := ask("platform-token", "127.0.0.11", start.Add(45*time.Second))
	require.Equal(t, http.StatusOK, r.status, r.raw)
	assert.Equal(t, []any{"system:serviceaccount:team-a:crawler"}, r.body["tenants"], "team A held eu-0's IP then")
	assert.Equal(t, "shop.example", r.body["holdings"].([]any)[0].(map[string]any)["target"])
	r = ask("token-b", "127.0.0.11", start.Add(90*time.Second))
	require.Equal(t, http.StatusOK, r.status, "a tenant granted get on proxies/attribution may ask")
	assert.Empty(t, r.body["tenants"], "after its release, nobody")
	r = ask("platform-token", "127.0.0.12", start.Add(65*time.Second))
	assert.Equal(t, []any{b.Name}, r.body["tenants"], "team B's tunnel held us-0's IP")

	assert.Equal(t, http.StatusForbidden, ask("token-a", "127.0.0.11", start).status, "a tenant without the permission may not")
	for _, q := range []string{"?ip=nope&at=2026-12-01T14:02:00Z", "?ip=127.0.0.11&at=yesterday", "?ip=127.0.0.11"} {
		bad := f.do("GET", "/v1/attribution"+q, "", as("platform-token")...)
		assert.Equal(t, http.StatusBadRequest, bad.status, q)
		assert.Equal(t, CodeInvalidRequest, errorCode(bad), q)
	}
}

// TestTheLedgerGrowsWithTunnelsNotRenewals: a tunnel renewed as the
// gateway renews it (every 40s) for two hours leaves a start, a checkpoint
// every TunnelLedgerHorizon or so, and an end, not a record per renewal;
// and the ledger still names its holder at every moment it held the IP,
// and nobody after it ended.
func TestTheLedgerGrowsWithTunnelsNotRenewals(t *testing.T) {
	f := newFixture(t)
	f.token.value = "platform-token"
	var log bytes.Buffer
	f.configure(func(o *Options) { o.Ledger = lease.NewJSONLines(&log, logr.Discard()) })
	f.proxy("eu-1", "127.0.0.11", true, nil)
	tunnels := f.srv.Tunnels()
	ctx := context.Background()
	start := f.clock.Now()
	up, err := tunnels.Tunnel(ctx, broker.TunnelRequest{Tenant: tenant.Platform, Session: "long", Host: "shop.example", TTL: 2 * time.Minute, SessionIdle: time.Minute})
	require.NoError(t, err)
	recorded, renewals := up.LedgerUntil, 0
	for f.clock.Since(start) < 2*time.Hour {
		f.clock.Step(40 * time.Second)
		recorded, err = tunnels.RenewTunnel(ctx, up.LeaseID, "long", 2*time.Minute, recorded)
		require.NoError(t, err)
		renewals++
	}
	end := f.clock.Now()
	tunnels.ReleaseTunnel(ctx, up.LeaseID, "long", broker.Carried{Down: 1})

	records := strings.Count(log.String(), "\n")
	want := 2 + int((2*time.Hour)/(broker.TunnelLedgerHorizon-2*time.Minute)) + 1
	assert.LessOrEqual(t, records, want, "a start, a checkpoint about every %s, an end", broker.TunnelLedgerHorizon-2*time.Minute)
	t.Logf("%d renewals over two hours, %d ledger records", renewals, records)

	ask := func(at time.Time) []any {
		r := f.do("GET", "/v1/attribution?ip=127.0.0.11&at="+at.UTC().Format(time.RFC3339), "", "Authorization", "Bearer platform-token")
		require.Equal(t, http.StatusOK, r.status, r.raw)
		return r.body["tenants"].([]any)
	}
	for at := start.Add(time.Second); at.Before(end); at = at.Add(7 * time.Minute) {
		assert.Equal(t, []any{tenant.PlatformName}, ask(at), "held at %s", at.Sub(start))
	}
	assert.Empty(t, ask(end.Add(2*time.Second)), "and nobody once it ended")
}
