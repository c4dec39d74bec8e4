package netid

import (
	"flag"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestOneSenderPerIPv4AddressAndIPv6Network(t *testing.T) {
	var r Rule
	assert.Equal(t, "203.0.113.5", r.Of("203.0.113.5"))
	assert.Equal(t, "203.0.113.5", r.Of("::ffff:203.0.113.5"), "an IPv4-mapped address is its IPv4 sender")
	assert.Equal(t, "2001:db8:1:2::/64", r.Of("2001:db8:1:2:aaaa::9"))
	assert.Equal(t, r.Of("2001:db8:1:2::1"), r.Of("2001:db8:1:2:ffff:ffff:ffff:ffff"), "one /64, one sender")
	assert.NotEqual(t, r.Of("2001:db8:1:2::1"), r.Of("2001:db8:1:3::1"), "another /64, another sender")
	assert.Empty(t, r.Of(""))
	assert.Empty(t, r.Of("proxy.example"))
	assert.True(t, r.Contains("2001:db8:1:2::/64", "2001:db8:1:2::77"))
	assert.False(t, r.Contains("", ""))

	assert.Equal(t, "203.0.113.0/24", r.Network("203.0.113.5"))
	assert.Equal(t, "2001:db8:1:2::/64", r.Network("2001:db8:1:2::5"))

	wide := Rule{IPv6Prefix: 48}
	assert.Equal(t, "2001:db8:1::/48", wide.Of("2001:db8:1:2::1"))
	each := Rule{IPv6Prefix: 128}
	assert.Equal(t, "2001:db8:1:2::1", each.Of("2001:db8:1:2::1"))
}

func TestTheFlag(t *testing.T) {
	var r Rule
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	r.AddFlags(fs)
	require.NoError(t, fs.Parse(nil))
	assert.Equal(t, DefaultIPv6Prefix, r.IPv6Prefix)
	require.NoError(t, r.Validate())
	require.NoError(t, fs.Parse([]string{"--ipv6-identity-prefix=16"}))
	assert.ErrorContains(t, r.Validate(), "between 32 and 128, got 16")
}
