package providers

import (
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// gceName is GCE's rule for instance names; Pod names accept a superset.
var gceName = regexp.MustCompile(`^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$`)

func TestInstanceName(t *testing.T) {
	long := strings.Repeat("very-long-proxy-name.", 12)[:240]
	cases := []struct{ cluster, ns, name string }{
		{"c1", "default", "eu-1"},
		{"c1", "a-b", "c"},
		{"c1", "a", "b-c"},
		{"c1", "crawl", "a.b"},
		{"c1", "crawl", "a-b"},
		{"c1", "crawl", long},
		{"c1", "crawl", long + "x"},
		{"c1", strings.Repeat("n", 63), strings.Repeat("m", 63)},
		{"c2", "default", "eu-1"},
		{"c1", "default", "9lives"},
	}
	seen := map[string]string{}
	for _, c := range cases {
		got := InstanceName(c.cluster, c.ns, c.name)
		key := c.cluster + "/" + c.ns + "/" + c.name
		assert.Regexp(t, gceName, got, key)
		assert.LessOrEqual(t, len(got), 63, key)
		assert.Equal(t, got, InstanceName(c.cluster, c.ns, c.name), "deterministic: %s", key)
		if other, dup := seen[got]; dup {
			t.Errorf("%s and %s share instance name %s", key, other, got)
		}
		seen[got] = key
	}
	assert.True(t, strings.HasPrefix(InstanceName("c1", "default", "eu-1"), "px-default-eu-1-"), "short names stay readable")
}

func TestErrorKinds(t *testing.T) {
	err := Terminal("placement.zone is required for gcp provider %s", "gcp-eu")
	assert.ErrorIs(t, err, ErrTerminal)
	assert.Equal(t, "placement.zone is required for gcp provider gcp-eu", TerminalMessage(err))
	assert.ErrorIs(t, Transient(assert.AnError), ErrTransient)
	assert.ErrorIs(t, Transient(assert.AnError), assert.AnError, "the cause stays reachable")
}
