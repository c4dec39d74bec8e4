package netid

import (
	"flag"
	"fmt"
	"net/netip"
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

func TestSessionAddressesOfARange(t *testing.T) {
	gcp := netip.MustParsePrefix("2001:db8:1:2:0:5::/96")
	a, err := SessionAddress(gcp, 0)
	require.NoError(t, err)
	assert.Equal(t, "2001:db8:1:2:0:5:0:1", a.String(), "the first after the VM's own")
	a, err = SessionAddress(gcp, 255)
	require.NoError(t, err)
	assert.Equal(t, "2001:db8:1:2:0:5:0:100", a.String(), "a carry into the next byte")
	_, err = SessionAddress(gcp, MaxSessionAddresses)
	assert.Error(t, err)
	_, err = SessionAddress(netip.MustParsePrefix("2001:db8::/127"), 1)
	assert.Error(t, err, "a range too small for the address")
	_, err = SessionAddress(netip.MustParsePrefix("203.0.113.0/24"), 0)
	assert.Error(t, err, "session addresses are IPv6")

	assert.Equal(t, SessionIndex("team-a/s1", 16), SessionIndex("team-a/s1", 16), "stable")
	seen := map[int]bool{}
	for i := range 64 {
		seen[SessionIndex(fmt.Sprintf("team-a/s%d", i), 16)] = true
	}
	assert.Greater(t, len(seen), 8, "sessions spread over the addresses")
	assert.Zero(t, SessionIndex("x", 0))

	assert.Equal(t, "2001:db8:1:2:0:5::", RangeAddr("2001:db8:1:2:0:5::/96"))
	assert.Equal(t, "2001:db8:7:8:9::", RangeAddr("2001:db8:7:8:9:0:0:3/80"), "the range's own, whatever address names it")
	assert.Empty(t, RangeAddr(""))
}
