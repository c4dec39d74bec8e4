package discovery

import (
	"context"
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/broker"
	"github.com/example/egress-proxies-operator/test/testenv"
)

// lockableToken is a TokenSource that can be locked, as SecretToken is once
// its Secret goes away.
type lockableToken struct {
	value    string
	required bool
}

func (l *lockableToken) Token() (string, bool) { return l.value, l.required }

// TestRenewFollowsHealth: a lease whose proxy went Unhealthy or was deleted
// is not renewed (409 proxy_unavailable), getting it says why, and a report
// on it is still accepted: its cooldown is worth keeping.
func TestRenewFollowsHealth(t *testing.T) {
	for _, tc := range []struct {
		name    string
		breakIt func(f *fixture, p *crawlv1alpha1.Proxy)
		why     string
	}{
		{"proxy went Unhealthy", func(f *fixture, p *crawlv1alpha1.Proxy) {
			testenv.SetHealth(p, metav1.ConditionFalse, "Timeout")
			f.view.Upsert(p)
		}, "is not healthy"},
		{"proxy is being replaced", func(f *fixture, p *crawlv1alpha1.Proxy) {
			p.Status.Phase, p.Status.IP = crawlv1alpha1.PhaseReplacing, ""
			f.view.Upsert(p)
		}, "not serving"},
		{"proxy deleted", func(f *fixture, _ *crawlv1alpha1.Proxy) { f.view.Remove("crawl/eu-1") }, "no longer exists"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			p := f.proxy("eu-1", "127.0.0.11", true, nil)
			r := f.do("POST", "/v1/leases", `{"ttlSeconds": 60}`)
			require.Equal(t, http.StatusCreated, r.status)
			id := r.body["leaseID"].(string)
			assert.Equal(t, LeaseActive, r.body["state"])
			assert.Equal(t, http.StatusOK, f.do("POST", "/v1/leases/"+id+"/renew", "").status, "renewable while healthy")

			tc.breakIt(f, p)
			r = f.do("POST", "/v1/leases/"+id+"/renew", `{"ttlSeconds": 60}`)
			assert.Equal(t, http.StatusConflict, r.status)
			assert.Equal(t, CodeProxyUnavailable, errorCode(r))
			assert.Contains(t, errorMessage(r), tc.why)
			assert.Contains(t, errorMessage(r), "lease another")

			r = f.do("GET", "/v1/leases/"+id, "")
			require.Equal(t, http.StatusOK, r.status)
			assert.Equal(t, LeaseProxyUnavailable, r.body["state"])
			assert.Contains(t, r.body["reason"], tc.why)

			assert.Equal(t, http.StatusNoContent, f.do("POST", "/v1/leases/"+id+"/report", `{"result":"rate_limited","target":"example.com"}`).status,
				"a report on such a lease is still accepted")
			_, cooldowns := f.store.Counts()
			assert.Equal(t, 1, cooldowns)
			assert.Equal(t, http.StatusNotFound, f.do("POST", "/v1/leases/unknown/renew", "").status, "an unknown lease is still 404")
		})
	}
}

// TestTargetsAreHosts: case, a trailing dot and a port do not make another
// target: a cooldown reported for one form holds for every form.
func TestTargetsAreHosts(t *testing.T) {
	f := newFixture(t)
	f.proxy("eu-1", "127.0.0.11", true, nil)
	r := f.do("POST", "/v1/leases", `{"target":"Example.COM.:443"}`)
	require.Equal(t, http.StatusCreated, r.status)
	assert.Equal(t, "example.com", r.body["target"])
	id := r.body["leaseID"].(string)
	require.Equal(t, http.StatusNoContent, f.do("POST", "/v1/leases/"+id+"/report", `{"result":"rate_limited","target":"EXAMPLE.com:8443"}`).status)
	for _, form := range []string{"example.com", "Example.Com", "example.com.", "example.com:443", "[example.com]:80"} {
		r := f.do("POST", "/v1/leases", `{"target":"`+form+`"}`)
		assert.Equal(t, http.StatusServiceUnavailable, r.status, "%s is example.com, which is cooling down", form)
	}
	assert.Equal(t, http.StatusCreated, f.do("POST", "/v1/leases", `{"target":"other.example.com"}`).status)

	for in, want := range map[string]string{
		"Example.COM.:443": "example.com", "example.com": "example.com", "[2001:DB8::1]:443": "2001:db8::1",
		"2001:db8::1": "2001:db8::1", "127.0.0.1:8080": "127.0.0.1", "": "",
	} {
		assert.Equal(t, want, broker.NormalizeTarget(in), in)
	}
}

// TestAuthFailsClosed: with a token required, losing it refuses every
// request, ServiceAccount tokens included (503 locked with Retry-After, a
// message saying why and a metric), in the API and the gateway alike,
// until it is back.
// Bearer is matched case-insensitively and the token trimmed.
func TestAuthFailsClosed(t *testing.T) {
	f := newFixture(t)
	tok := &lockableToken{value: "s3cret", required: true}
	f.configure(func(o *Options) { o.Tokens = tok })
	f.proxy("eu-1", "127.0.0.11", true, nil)

	for _, header := range []string{"Bearer s3cret", "bearer s3cret", "BEARER   s3cret  ", "  Bearer s3cret"} {
		assert.Equal(t, http.StatusOK, f.do("GET", "/v1/proxies", "", "Authorization", header).status, "%q", header)
	}
	for _, header := range []string{"Bearer", "Bearer ", "Basic s3cret", "s3cret", "Bearers3cret", "Bearer s3cret x"} {
		assert.Equal(t, http.StatusUnauthorized, f.do("GET", "/v1/proxies", "", "Authorization", header).status, "%q", header)
	}

	tok.value = "" // the Secret is gone, or its key emptied: locked
	f.configure(func(o *Options) { o.Tenants = twoTeams() })
	r := f.do("GET", "/v1/proxies", "")
	assert.Equal(t, http.StatusServiceUnavailable, r.status, "no token at all: refused, never open")
	assert.Equal(t, CodeLocked, errorCode(r))
	assert.Equal(t, "60", r.header.Get("Retry-After"))
	assert.Contains(t, errorMessage(r), "missing or its key is empty")
	r = f.do("GET", "/v1/proxies", "", "Authorization", "Bearer ")
	assert.Equal(t, http.StatusServiceUnavailable, r.status, "an empty bearer token never matches the missing one")
	assert.Equal(t, http.StatusServiceUnavailable, f.do("POST", "/v1/leases", `{}`, "Authorization", "Bearer s3cret").status, "the old token no longer works")
	r = f.do("POST", "/v1/leases", `{}`, "Authorization", "Bearer token-a")
	assert.Equal(t, http.StatusServiceUnavailable, r.status, "nor does a ServiceAccount's: locked is locked for everyone")
	assert.Equal(t, CodeLocked, errorCode(r))
	_, err := f.srv.Tunnels().Authorize(context.Background(), "token-a")
	assert.ErrorIs(t, err, broker.ErrGatewayLocked, "the gateway agrees")
	assert.Equal(t, 1.0, testutil.ToFloat64(authLockedGauge))
	assert.Equal(t, 1.0, testutil.ToFloat64(authEnabled))
	assert.Equal(t, http.StatusOK, f.do("GET", "/healthz", "").status, "probes still answer")

	tok.value = "back"
	assert.Equal(t, http.StatusOK, f.do("GET", "/v1/proxies", "", "Authorization", "Bearer back").status)
	assert.Equal(t, http.StatusOK, f.do("GET", "/v1/proxies", "", "Authorization", "Bearer token-a").status, "unlocked, tenants too")
	assert.Equal(t, 0.0, testutil.ToFloat64(authLockedGauge))
}
