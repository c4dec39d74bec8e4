package geoip_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/example/egress-proxies-operator/geoip"
	"github.com/example/egress-proxies-operator/geoip/geoiptest"
)

// TestLookupAcrossFiles: a City database and an ASN database together
// give one Location; an address neither knows is not found.
func TestLookupAcrossFiles(t *testing.T) {
	dir := t.TempDir()
	city, asn := filepath.Join(dir, "city.mmdb"), filepath.Join(dir, "asn.mmdb")
	require.NoError(t, geoiptest.Write(city, map[string]geoip.Location{"127.0.0.0/24": {Country: "BE", City: "Brussels"}}))
	require.NoError(t, geoiptest.Write(asn, map[string]geoip.Location{"127.0.0.0/16": {ASN: 396982, ASNOrg: "GOOGLE-CLOUD-PLATFORM"}}))
	db, err := geoip.Open([]string{city, asn})
	require.NoError(t, err)

	loc, ok := db.Lookup("127.0.0.9")
	require.True(t, ok)
	assert.Equal(t, geoip.Location{Country: "BE", City: "Brussels", ASN: 396982, ASNOrg: "GOOGLE-CLOUD-PLATFORM"}, loc)
	loc, ok = db.Lookup("127.0.1.9")
	require.True(t, ok, "the ASN database alone knows it")
	assert.Equal(t, geoip.Location{ASN: 396982, ASNOrg: "GOOGLE-CLOUD-PLATFORM"}, loc)
	_, ok = db.Lookup("10.1.2.3")
	assert.False(t, ok)
	_, ok = db.Lookup("not-an-ip")
	assert.False(t, ok)
}

// TestOpenRefusesBadFiles: a missing file or one that is no database is
// an error at start that names it.
func TestOpenRefusesBadFiles(t *testing.T) {
	dir := t.TempDir()
	_, err := geoip.Open([]string{filepath.Join(dir, "missing.mmdb")})
	require.ErrorContains(t, err, "missing.mmdb")
	junk := filepath.Join(dir, "junk.mmdb")
	require.NoError(t, os.WriteFile(junk, []byte("not a database"), 0o600))
	_, err = geoip.Open([]string{junk})
	require.ErrorContains(t, err, "not a MaxMind-format database")
}

// TestRefreshFollowsTheFile: a new version of the file is read at the
// next refresh and announced; a broken one keeps the last good version.
func TestRefreshFollowsTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "city.mmdb")
	require.NoError(t, geoiptest.Write(path, map[string]geoip.Location{"127.0.0.1": {Country: "BE"}}))
	db, err := geoip.Open([]string{path})
	require.NoError(t, err)

	changed, err := db.Refresh()
	require.NoError(t, err)
	assert.False(t, changed, "the same file is no change")

	require.NoError(t, geoiptest.Write(path, map[string]geoip.Location{"127.0.0.1": {Country: "NL"}}))
	require.NoError(t, os.Chtimes(path, time.Now(), time.Now().Add(time.Minute)))
	changed, err = db.Refresh()
	require.NoError(t, err)
	assert.True(t, changed)
	select {
	case <-db.Changes():
	default:
		t.Fatal("a changed database is announced")
	}
	loc, _ := db.Lookup("127.0.0.1")
	assert.Equal(t, "NL", loc.Country)

	require.NoError(t, os.WriteFile(path, []byte("truncated"), 0o600))
	_, err = db.Refresh()
	require.ErrorContains(t, err, "the last version that opened stays in use")
	loc, _ = db.Lookup("127.0.0.1")
	assert.Equal(t, "NL", loc.Country, "a broken file loses nothing")
}

// TestRegionCountry: regions and zones of both clouds.
func TestRegionCountry(t *testing.T) {
	for in, want := range map[string]string{"europe-west1": "BE", "europe-west1-b": "BE", "eu-west-1": "IE", "eu-west-1a": "IE", "us-central1-a": "US", "ap-southeast-2c": "AU"} {
		got, ok := geoip.RegionCountry(in)
		assert.True(t, ok, in)
		assert.Equal(t, want, got, in)
	}
	_, ok := geoip.RegionCountry("mars-north1")
	assert.False(t, ok)
}
