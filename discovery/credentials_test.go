package discovery

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/credentials"
)

// recordStore answers lookups of instance records by Secret name.
type recordStore map[string]credentials.Credentials

func (s recordStore) Lookup(_ context.Context, ref credentials.Ref) (credentials.Credentials, error) {
	c, ok := s[ref.Namespace+"/"+ref.Name]
	if !ok {
		return credentials.Credentials{}, credentials.ErrNotFound
	}
	return c, nil
}

func credentialedFixture(t *testing.T) *fixture {
	f := newFixture(t)
	f.srv.opts.Credentials = recordStore{"operator-ns/" + credentials.RecordName("crawl", "h1"): {Username: "crawler", Password: "s3cret-password-0123"}}
	p := &crawlv1alpha1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "crawl", Name: "eu-1"},
		Spec:       crawlv1alpha1.ProxySpec{Mode: crawlv1alpha1.ModeManaged, Provider: "kind-local", Port: 3128},
		Status: crawlv1alpha1.ProxyStatus{Phase: crawlv1alpha1.PhaseReady, IP: "127.0.0.9", Port: 3128,
			InstanceName: "px-crawl-eu-1", SpecHash: "h1",
			Conditions: []metav1.Condition{{Type: crawlv1alpha1.ConditionHealthy, Status: metav1.ConditionTrue, Reason: "x"}}},
	}
	f.view.upsert(p)
	return f
}

func TestCredentialsOnlyToAuthenticatedClients(t *testing.T) {
	t.Run("authenticated: URL, username and password", func(t *testing.T) {
		f := credentialedFixture(t)
		f.token.value = "tok"
		res := f.do("POST", "/v1/leases", `{}`, "Authorization", "Bearer tok")
		require.Equal(t, http.StatusCreated, res.status, res.raw)
		p := res.body["proxy"].(map[string]any)
		assert.Equal(t, "http://crawler:s3cret-password-0123@127.0.0.9:3128", p["url"])
		assert.Equal(t, "crawler", p["username"])
		assert.Equal(t, "s3cret-password-0123", p["password"])
		assert.NotContains(t, p, "credentialsWithheld")

		list := f.do("GET", "/v1/proxies", "", "Authorization", "Bearer tok")
		require.Equal(t, http.StatusOK, list.status)
		assert.Equal(t, "s3cret-password-0123", list.body["proxies"].([]any)[0].(map[string]any)["password"])
	})
	t.Run("unauthenticated: no credentials, and why", func(t *testing.T) {
		f := credentialedFixture(t)
		for _, res := range []response{f.do("POST", "/v1/leases", `{}`), f.do("GET", "/v1/proxies", "")} {
			require.Less(t, res.status, 300, res.raw)
			assert.NotContains(t, res.raw, "s3cret-password-0123")
			assert.Contains(t, res.raw, "the discovery API runs unauthenticated (--discovery-auth=none), so it never hands out proxy credentials")
			assert.Contains(t, res.raw, `"url":"http://127.0.0.9:3128"`)
		}
	})
	t.Run("a record that cannot be read is withheld, not guessed", func(t *testing.T) {
		f := credentialedFixture(t)
		f.token.value = "tok"
		f.srv.opts.Credentials = recordStore{}
		res := f.do("GET", "/v1/proxies", "", "Authorization", "Bearer tok")
		assert.Contains(t, res.raw, withheldUnavailable)
		assert.NotContains(t, res.raw, `"password"`)
	})
}
