package tlsprint

import (
	"bytes"
	"crypto/tls"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// hello is the ClientHello a Go client with cfg writes, as its records.
func hello(t *testing.T, cfg *tls.Config) []byte {
	t.Helper()
	c := &capture{}
	_ = tls.Client(c, cfg).Handshake() // it fails reading the answer: the hello is written by then
	require.NotEmpty(t, c.buf.Bytes())
	return c.buf.Bytes()
}

type capture struct{ buf bytes.Buffer }

func (c *capture) Read([]byte) (int, error)         { return 0, io.EOF }
func (c *capture) Write(p []byte) (int, error)      { return c.buf.Write(p) }
func (c *capture) Close() error                     { return nil }
func (c *capture) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *capture) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *capture) SetDeadline(time.Time) error      { return nil }
func (c *capture) SetReadDeadline(time.Time) error  { return nil }
func (c *capture) SetWriteDeadline(time.Time) error { return nil }

// The hashes of the specification's own example (FoxIO's JA4 technical
// details: Chrome's 15 ciphers and 16 extensions).
func TestHashesAsTheSpecificationSays(t *testing.T) {
	assert.Equal(t, "8daaf6152771", truncatedHash("002f,0035,009c,009d,1301,1302,1303,c013,c014,c02b,c02c,c02f,c030,cca8,cca9"))
	assert.Equal(t, "e5627efa2ab1", truncatedHash("0005,000a,000b,000d,0012,0015,0017,001b,0023,002b,002d,0033,4469,ff01_0403,0804,0401,0503,0805,0501,0806,0601"))
	assert.Equal(t, "000000000000", truncatedHash(""))
}

func TestJA4(t *testing.T) {
	h := &tls.ClientHelloInfo{
		// GREASE values anywhere are left out.
		CipherSuites:      []uint16{0x1a1a, 0x1301, 0x1302, 0x1303, 0xc02b, 0xc02f, 0xc02c, 0xc030, 0xcca9, 0xcca8, 0xc013, 0xc014, 0x009c, 0x009d, 0x002f, 0x0035},
		Extensions:        []uint16{0x2a2a, 0x0000, 0x0017, 0xff01, 0x000a, 0x000b, 0x0023, 0x0010, 0x0005, 0x000d, 0x0012, 0x0033, 0x002d, 0x002b, 0x001b, 0x4469, 0x0015, 0x3a3a},
		SupportedVersions: []uint16{0x4a4a, tls.VersionTLS13, tls.VersionTLS12},
		ServerName:        "www.example.com",
		SupportedProtos:   []string{"h2", "http/1.1"},
		SignatureSchemes:  []tls.SignatureScheme{0x0403, 0x0804, 0x0401, 0x0503, 0x0805, 0x0501, 0x0806, 0x0601},
	}
	assert.Equal(t, "t13d1516h2_8daaf6152771_e5627efa2ab1", JA4(h), "the specification's Chrome example")

	h.ServerName, h.SupportedProtos, h.SupportedVersions = "", nil, nil
	assert.True(t, strings.HasPrefix(JA4(h), "t00i151600_"), "no SNI, no ALPN, no supported_versions: %s", JA4(h))
	h.SupportedProtos = []string{"\x01x\xff"}
	assert.Equal(t, "0f", JA4(h)[8:10], "a non-alphanumeric ALPN is written in hex")
}

func TestFromBytesReadsWhatAClientSends(t *testing.T) {
	modern := hello(t, &tls.Config{ServerName: "site.example", NextProtos: []string{"h2", "http/1.1"}, MinVersion: tls.VersionTLS12})
	fp, err := FromBytes(modern)
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(fp, "t13d"), "Go's client offers TLS 1.3 with SNI: %s", fp)
	assert.Equal(t, "h2", fp[8:10])

	again, err := FromBytes(hello(t, &tls.Config{ServerName: "other.example", NextProtos: []string{"h2", "http/1.1"}, MinVersion: tls.VersionTLS12}))
	require.NoError(t, err)
	assert.Equal(t, fp, again, "one client, one fingerprint, whatever the site")

	old, err := FromBytes(hello(t, &tls.Config{ServerName: "site.example", MinVersion: tls.VersionTLS12, MaxVersion: tls.VersionTLS12,
		CipherSuites: []uint16{tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256}}))
	require.NoError(t, err)
	assert.NotEqual(t, fp, old, "another client configuration is another fingerprint")
	assert.True(t, strings.HasPrefix(old, "t12d01"), old)

	// Bytes as they come: a part is incomplete, the whole parses, and
	// what follows the hello (an early request) does not matter.
	for _, n := range []int{1, 4, 7, len(modern) - 1} {
		_, err := FromBytes(modern[:n])
		require.ErrorIs(t, err, ErrIncomplete, "%d bytes", n)
	}
	withMore, err := FromBytes(append(append([]byte{}, modern...), 0x17, 3, 3, 0, 1, 0))
	require.NoError(t, err)
	assert.Equal(t, fp, withMore)
}

func TestFromBytesRefusesWhatIsNoClientHello(t *testing.T) {
	for name, b := range map[string][]byte{
		"plain HTTP":      []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
		"a ServerHello":   {0x16, 3, 3, 0, 8, 0x02, 0, 0, 4, 1, 2, 3, 4},
		"huge":            {0x16, 3, 1, 0xff, 0xff, 0x01, 0xff, 0xff, 0xff},
		"garbage payload": {0x16, 3, 1, 0, 8, 0x01, 0, 0, 4, 0xde, 0xad, 0xbe, 0xef},
	} {
		_, err := FromBytes(b)
		require.ErrorIs(t, err, ErrNotTLS, name)
	}
}
