package discovery

import (
	"encoding/json"
	"net/url"
	"testing"

	"github.com/example/egress-proxies-operator/broker"
	"github.com/example/egress-proxies-operator/lease"
)

// FuzzDecodeLeaseRequest: any body either decodes into a request that
// validates or not, never panics, and a decoded request survives a round
// trip. The seeds run as a normal test.
func FuzzDecodeLeaseRequest(f *testing.F) {
	for _, seed := range []string{
		`{}`, `{"selector":{"geo":"eu"},"ttlSeconds":300,"target":"example.com"}`,
		`{"selector":`, `{"ttl":1}`, `{"ttlSeconds":"x"}`, `[]`, `null`, `{} {}`,
		`{"selector":{"a b":"c"}}`, `{"ttlSeconds":-1}`, `{"ttlSeconds":1e300}`, "\x00",
	} {
		f.Add([]byte(seed))
	}
	srv := NewServer(Options{Store: lease.NewMemoryStore(nil), View: broker.NewView(nil, "operator-ns"), Tokens: StaticToken(""),
		DefaultTTL: broker.DefaultTTL, MaxTTL: broker.DefaultMaxTTL, DefaultCooldown: broker.DefaultCooldown})
	f.Fuzz(func(t *testing.T, body []byte) {
		var req leaseRequest
		status, code, err := decodeJSON(body, &req)
		if err != nil {
			if status != 400 || (code != CodeInvalidJSON && code != CodeInvalidRequest) {
				t.Fatalf("decode error must be a 400 invalid_json/invalid_request, got %d %s: %v", status, code, err)
			}
			return
		}
		_, _ = srv.ttl(req.TTLSeconds)
		_ = broker.ValidateSelector("selector", req.Selector)
		_ = broker.ValidateTarget(req.Target, false)
		again, err := json.Marshal(req)
		if err != nil {
			t.Fatalf("re-encoding a decoded request: %v", err)
		}
		var back leaseRequest
		if _, _, err := decodeJSON(again, &back); err != nil {
			t.Fatalf("a re-encoded request does not decode: %v (%s)", err, again)
		}
	})
}

// FuzzParseListQuery: any query string is accepted with valid keys only, or
// refused; never a panic.
func FuzzParseListQuery(f *testing.F) {
	for _, seed := range []string{"", "healthy=true", "geo=eu&tier=a", "geo=eu&geo=us", "%zz", "healthy=maybe", "a+b=c", "=x", "x="} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, query string) {
		sel, _, err := parseListQuery(query)
		if err != nil {
			return
		}
		if verr := broker.ValidateSelector("query parameter", sel); verr != nil {
			t.Fatalf("accepted a selector that does not validate: %v", verr)
		}
		if _, err := url.ParseQuery(query); err != nil {
			t.Fatalf("accepted a query url.ParseQuery refuses: %v", err)
		}
	})
}
