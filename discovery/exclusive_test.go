package discovery

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/broker"
)

// An exclusive lease gets a proxy nobody holds, keeps every other lease
// off it, is refused with 503 and Retry-After when none is free, and
// counts its member whole in the pool's demand.
func TestExclusiveLeases(t *testing.T) {
	f := newFixture(t)
	for _, name := range []string{"eu-0", "eu-1"} {
		p := f.proxy(name, "127.0.0.1"+name[3:], true, nil)
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: crawlv1alpha1.GroupVersion.String(), Kind: "ProxyPool", Name: "eu", UID: "u", Controller: ptrTo(true)}}
		f.view.Upsert(p)
	}
	shared := f.do("POST", "/v1/leases", `{"selector":{"pool":"eu"}}`)
	require.Equal(t, http.StatusCreated, shared.status, shared.raw)
	assert.Nil(t, shared.body["exclusive"], "a shared lease does not say exclusive")

	held := f.do("POST", "/v1/leases", `{"selector":{"pool":"eu"},"exclusive":true}`)
	require.Equal(t, http.StatusCreated, held.status, held.raw)
	assert.Equal(t, true, held.body["exclusive"])
	assert.NotEqual(t, proxyID(shared), proxyID(held), "the proxy nobody holds")

	second := f.do("POST", "/v1/leases", `{"selector":{"pool":"eu"},"exclusive":true}`)
	require.Equal(t, http.StatusServiceUnavailable, second.status, second.raw)
	assert.Equal(t, CodeNoProxyAvailable, errorCode(second))
	assert.Contains(t, errorMessage(second), "exclusive lease needs one nobody holds")
	assert.NotEmpty(t, second.header.Get("Retry-After"))

	for range 3 {
		r := f.do("POST", "/v1/leases", `{"selector":{"pool":"eu"}}`)
		require.Equal(t, http.StatusCreated, r.status, r.raw)
		assert.Equal(t, proxyID(shared), proxyID(r), "shared leases stay off the held proxy")
	}
	demand, err := f.srv.Broker().PoolDemand(context.Background(), "crawl", "eu")
	require.NoError(t, err)
	assert.Equal(t, broker.PoolDemand{ActiveLeases: 5, Held: 1, HeldLeases: 1, LastRefused: f.clock.Now()}, demand,
		"the refused exclusive lease and the held member reach the autoscaler")

	release := f.do("DELETE", "/v1/leases/"+held.body["leaseID"].(string), "")
	require.Equal(t, http.StatusNoContent, release.status)
	again := f.do("POST", "/v1/leases", `{"selector":{"pool":"eu"},"exclusive":true}`)
	require.Equal(t, http.StatusCreated, again.status, "released, the proxy is free again: %s", again.raw)
	assert.Equal(t, proxyID(held), proxyID(again))
}

// An exclusive session holds a proxy its host may take: one cooling down
// for the host is let go, and the session holds the next; the hold keeps
// the others off it, and the host's cooldown is not the hold's.
func TestAnExclusiveSessionHoldsAProxyItsHostMayTake(t *testing.T) {
	f := newFixture(t)
	f.proxy("a", "127.0.0.21", true, nil)
	f.proxy("b", "127.0.0.22", true, nil)
	// a is the one the least-loaded pick would take first: it cools for
	// shop.example.
	cool := f.do("POST", "/v1/leases", `{"selector":{},"target":"shop.example"}`)
	require.Equal(t, http.StatusCreated, cool.status, cool.raw)
	require.Equal(t, "crawl/a", proxyID(cool))
	report := f.do("POST", "/v1/leases/"+cool.body["leaseID"].(string)+"/report", `{"result":"rate_limited","target":"shop.example"}`)
	require.Equal(t, http.StatusNoContent, report.status, report.raw)
	require.Equal(t, http.StatusNoContent, f.do("DELETE", "/v1/leases/"+cool.body["leaseID"].(string), "").status)
	// b was leased last: a comes first again for a hold.
	f.clock.Step(time.Second)
	last := f.do("POST", "/v1/leases", `{"selector":{}}`)
	require.Equal(t, "crawl/b", proxyID(last))
	require.Equal(t, http.StatusNoContent, f.do("DELETE", "/v1/leases/"+last.body["leaseID"].(string), "").status)

	tunnels := f.srv.Tunnels()
	req := broker.TunnelRequest{Session: "x1", Exclusive: true, Host: "shop.example", TTL: time.Minute, SessionIdle: time.Hour}
	up, err := tunnels.Tunnel(context.Background(), req)
	require.NoError(t, err)
	assert.Equal(t, "crawl/b", up.ProxyID, "the proxy cooling for the host is let go")
	assert.NotEmpty(t, up.Hold)
	tunnels.ReleaseTunnel(context.Background(), up.LeaseID, "x1", broker.Carried{})

	held, err := f.store.Held(context.Background(), []string{"crawl/a", "crawl/b"})
	require.NoError(t, err)
	assert.Equal(t, []bool{false, true}, held, "only b is held, with no tunnel open")
	other := f.do("POST", "/v1/leases", `{"selector":{},"target":"news.example"}`)
	require.Equal(t, http.StatusCreated, other.status, other.raw)
	assert.Equal(t, "crawl/a", proxyID(other), "a lease for another host stays off the held proxy")

	again, err := tunnels.Tunnel(context.Background(), broker.TunnelRequest{Session: "x1", Exclusive: true, Host: "news.example", TTL: time.Minute, SessionIdle: time.Hour})
	require.NoError(t, err)
	assert.Equal(t, "crawl/b", again.ProxyID, "the session keeps its hold for its other hosts")
	assert.Equal(t, up.Hold, again.Hold)
}

// A strict session's first tunnel that fails may start the session on
// another proxy (it never left from the first); once a tunnel went
// through its proxy, a failure loses the session.
func TestAStrictSessionStartsOverOnlyBeforeItsFirstTunnel(t *testing.T) {
	f := newFixture(t)
	f.proxy("a", "127.0.0.21", true, nil)
	f.proxy("b", "127.0.0.22", true, nil)
	tunnels := f.srv.Tunnels()
	req := broker.TunnelRequest{Session: "s1", Strict: true, Host: "shop.example", TTL: time.Minute, SessionIdle: time.Hour}
	first, err := tunnels.Tunnel(context.Background(), req)
	require.NoError(t, err)
	assert.True(t, first.Fresh, "the session's first tunnel starts its stint")
	tunnels.ReleaseTunnel(context.Background(), first.LeaseID, "s1", broker.Carried{})

	retry := req
	retry.Avoid, retry.Restart = []string{first.ProxyID}, true
	moved, err := tunnels.Tunnel(context.Background(), retry)
	require.NoError(t, err, "the first tunnel failed: the session starts elsewhere")
	assert.NotEqual(t, first.ProxyID, moved.ProxyID)
	assert.True(t, moved.Fresh)
	tunnels.ReleaseTunnel(context.Background(), moved.LeaseID, "s1", broker.Carried{})

	again, err := tunnels.Tunnel(context.Background(), req)
	require.NoError(t, err)
	assert.Equal(t, moved.ProxyID, again.ProxyID, "and sticks there")
	assert.False(t, again.Fresh)
	tunnels.ReleaseTunnel(context.Background(), again.LeaseID, "s1", broker.Carried{})
	failed := req
	failed.Avoid = []string{again.ProxyID}
	_, err = tunnels.Tunnel(context.Background(), failed)
	var lost *broker.SessionLostError
	require.ErrorAs(t, err, &lost, "a used proxy failing loses the strict session")
	assert.Equal(t, broker.SessionProxyFailed, lost.Cause)
}
