package discovery

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestUsageOfLeases: a lease's proxy time is what it held (its TTL, what
// a renewal added, less what its release gave back), its refusals count
// as blocks, and a team reads only its own; without prices there is no
// cost.
func TestUsageOfLeases(t *testing.T) {
	f := newFixture(t)
	f.token.value = "platform-token"
	f.configure(func(o *Options) { o.Tenants = twoTeams() })
	f.member("eu", "eu-0", "127.0.0.11")
	as := func(token string) []string { return []string{"Authorization", "Bearer " + token} }

	held := f.do("POST", "/v1/leases", `{"ttlSeconds":60,"target":"shop.example"}`, as("token-a")...)
	require.Equal(t, http.StatusCreated, held.status)
	id := held.body["leaseID"].(string)
	f.clock.Step(30 * time.Second)
	require.Equal(t, http.StatusOK, f.do("POST", "/v1/leases/"+id+"/renew", `{"ttlSeconds":60}`, as("token-a")...).status)
	f.clock.Step(30 * time.Second)
	require.Equal(t, http.StatusNoContent, f.do("DELETE", "/v1/leases/"+id, "", as("token-a")...).status)
	second := f.do("POST", "/v1/leases", `{"ttlSeconds":120,"target":"shop.example"}`, as("token-a")...)
	require.Equal(t, http.StatusCreated, second.status)
	require.Equal(t, http.StatusNoContent, f.do("POST", "/v1/leases/"+second.body["leaseID"].(string)+"/report", `{"result":"blocked","target":"shop.example"}`, as("token-a")...).status)

	r := f.do("GET", "/v1/usage?groupBy=tenant,host", "", as("token-a")...)
	require.Equal(t, http.StatusOK, r.status)
	rows := r.body["rows"].([]any)
	require.Len(t, rows, 1)
	row := rows[0].(map[string]any)
	assert.Equal(t, "system:serviceaccount:team-a:crawler", row["tenant"])
	assert.Equal(t, "shop.example", row["host"])
	assert.InDelta(t, 2, row["leases"], 0)
	assert.InDelta(t, 1, row["blocks"], 0)
	assert.InDelta(t, (time.Minute + 2*time.Minute).Milliseconds(), row["proxyMillis"], 0, "held 60 s, then 120 s granted")
	assert.InDelta(t, 0.05, row["proxyHours"], 1e-9)
	assert.NotContains(t, row, "cost", "no prices configured")

	r = f.do("GET", "/v1/usage", "", as("token-b")...)
	require.Equal(t, http.StatusOK, r.status)
	assert.Empty(t, r.body["rows"], "team b reads only its own, and has none")
	r = f.do("GET", "/v1/usage?groupBy=tenant", "", as("platform-token")...)
	require.Equal(t, http.StatusOK, r.status)
	assert.Len(t, r.body["rows"], 1)
	assert.InDelta(t, 2, r.body["total"].(map[string]any)["leases"], 0)
}
