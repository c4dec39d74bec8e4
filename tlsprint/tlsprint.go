// Package tlsprint names a TLS client by its ClientHello: the JA4
// fingerprint (FoxIO's JA4, the TLS part of JA4+) that sites and WAFs block
// clients by. The gateway reads it from each tunnel's ClientHello, which
// travels in clear, so that a site that blocks one client everywhere is told
// apart from a site that blocks an IP; the simulated web uses it to block a
// client as such sites do.
//
// The ClientHello is parsed by crypto/tls itself (a server handshake that
// stops at its first callback), never by hand. It imports nothing of the
// operator's.
package tlsprint

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"time"
)

// JA4 is the JA4 fingerprint of the client that sent hello, e.g.
// "t13d1516h2_8daaf6152771_e5627efa2ab1": protocol, version, SNI, counts
// and ALPN, then truncated hashes of the sorted cipher suites, and of the
// sorted extensions with the signature algorithms. GREASE values are left
// out everywhere, as the specification says.
func JA4(hello *tls.ClientHelloInfo) string {
	ciphers := withoutGrease(hello.CipherSuites)
	exts := withoutGrease(hello.Extensions)
	version := hello.SupportedVersions
	top := uint16(0)
	for _, v := range withoutGrease(version) {
		top = max(top, v)
	}
	sni := "i"
	if hello.ServerName != "" {
		sni = "d"
	}
	alpn := "00"
	if len(hello.SupportedProtos) > 0 && hello.SupportedProtos[0] != "" {
		p := hello.SupportedProtos[0]
		alpn = alpnChars(p)
	}
	a := fmt.Sprintf("t%s%s%02d%02d%s", versionOf(top), sni, min(len(ciphers), 99), min(len(exts), 99), alpn)
	// The extensions' hash leaves out SNI (0x0000) and ALPN (0x0010),
	// which the first part already says.
	var hashed []uint16
	for _, e := range exts {
		if e != 0x0000 && e != 0x0010 {
			hashed = append(hashed, e)
		}
	}
	var sigs []uint16
	for _, s := range hello.SignatureSchemes {
		sigs = append(sigs, uint16(s))
	}
	extPart := hexList(sorted(hashed))
	if s := withoutGrease(sigs); len(s) > 0 {
		extPart += "_" + hexList(s)
	}
	return a + "_" + truncatedHash(hexList(sorted(ciphers))) + "_" + truncatedHash(extPart)
}

// alpnChars is the first and last character of an ALPN value; a value
// that starts or ends with a non-alphanumeric byte is written as the hex
// of its first and last bytes' first and last digits, as the
// specification says.
func alpnChars(p string) string {
	first, last := p[0], p[len(p)-1]
	if isAlnum(first) && isAlnum(last) {
		return string([]byte{first, last})
	}
	h := hex.EncodeToString([]byte{first, last})
	return string([]byte{h[0], h[3]})
}

func isAlnum(b byte) bool {
	return (b >= '0' && b <= '9') || (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z')
}

// versionOf is JA4's two characters for a TLS version.
func versionOf(v uint16) string {
	switch v {
	case tls.VersionTLS13:
		return "13"
	case tls.VersionTLS12:
		return "12"
	case tls.VersionTLS11:
		return "11"
	case tls.VersionTLS10:
		return "10"
	case 0x0300:
		return "s3"
	}
	return "00"
}

// isGrease: RFC 8701's reserved values (0x0a0a, 0x1a1a, ... 0xfafa), which
// clients scatter at random so servers tolerate the unknown.
func isGrease(v uint16) bool { return v&0x0f0f == 0x0a0a && v>>8 == v&0xff }

func withoutGrease(vs []uint16) []uint16 {
	out := make([]uint16, 0, len(vs))
	for _, v := range vs {
		if !isGrease(v) {
			out = append(out, v)
		}
	}
	return out
}

func sorted(vs []uint16) []uint16 {
	out := slices.Clone(vs)
	slices.Sort(out)
	return out
}

func hexList(vs []uint16) string {
	parts := make([]string, len(vs))
	for i, v := range vs {
		parts[i] = fmt.Sprintf("%04x", v)
	}
	return strings.Join(parts, ",")
}

// truncatedHash is the first 12 hex digits of s's SHA-256; an empty list
// is twelve zeros.
func truncatedHash(s string) string {
	if s == "" {
		return "000000000000"
	}
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])[:12]
}

// ErrIncomplete says the bytes hold the start of a ClientHello but not all
// of it yet: read more, then try again.
var ErrIncomplete = errors.New("the ClientHello is incomplete")

// ErrNotTLS says the bytes are no TLS handshake.
var ErrNotTLS = errors.New("not a TLS ClientHello")

// MaxHello is the most bytes of a ClientHello read (with its record
// headers): a larger one is no client's.
const MaxHello = 16 << 10

// errStop ends the parsing handshake once the ClientHello is read.
var errStop = errors.New("tlsprint: ClientHello read")

// FromBytes is the JA4 of the ClientHello at the start of b, the first
// bytes a client wrote into a tunnel (its TLS records, as they came).
// ErrIncomplete: b holds only part of it; ErrNotTLS: b is no ClientHello.
func FromBytes(b []byte) (string, error) {
	if len(b) == 0 {
		return "", ErrIncomplete
	}
	if b[0] != 0x16 {
		return "", ErrNotTLS
	}
	need, err := helloLength(b)
	if err != nil {
		return "", err
	}
	if len(b) < need {
		if need > MaxHello {
			return "", fmt.Errorf("%w: a ClientHello of %d bytes", ErrNotTLS, need)
		}
		return "", ErrIncomplete
	}
	var got *tls.ClientHelloInfo
	conn := &replay{r: bytes.NewReader(b[:need])}
	err = tls.Server(conn, &tls.Config{MinVersion: tls.VersionTLS10, GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		got = h
		return nil, errStop
	}}).HandshakeContext(context.Background())
	if got == nil {
		return "", fmt.Errorf("%w: %w", ErrNotTLS, err)
	}
	return JA4(got), nil
}

// helloLength is how many bytes of b's records the ClientHello takes: its
// handshake message's length, across as many records as it spans.
func helloLength(b []byte) (int, error) {
	const header = 5
	// The handshake header (type, 3-byte length) is in the first record.
	if len(b) < header+4 {
		return header + 4, nil
	}
	if b[header] != 0x01 {
		return 0, fmt.Errorf("%w: handshake type %d", ErrNotTLS, b[header])
	}
	msg := 4 + (int(b[header+1])<<16 | int(b[header+2])<<8 | int(b[header+3]))
	if msg > MaxHello {
		return 0, fmt.Errorf("%w: a ClientHello of %d bytes", ErrNotTLS, msg)
	}
	// Walk the records until they hold the whole message.
	total, off := 0, 0
	for total < msg {
		if len(b) < off+header {
			return off + header + (msg - total), nil
		}
		if b[off] != 0x16 {
			return 0, fmt.Errorf("%w: record type %d inside a ClientHello", ErrNotTLS, b[off])
		}
		n := int(b[off+3])<<8 | int(b[off+4])
		total += n
		off += header + n
	}
	return off, nil
}

// replay is a net.Conn that reads a recorded ClientHello and writes
// nowhere: enough for crypto/tls to parse it.
type replay struct{ r io.Reader }

func (c *replay) Read(p []byte) (int, error)       { return c.r.Read(p) }
func (c *replay) Write(p []byte) (int, error)      { return len(p), nil }
func (c *replay) Close() error                     { return nil }
func (c *replay) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *replay) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *replay) SetDeadline(time.Time) error      { return nil }
func (c *replay) SetReadDeadline(time.Time) error  { return nil }
func (c *replay) SetWriteDeadline(time.Time) error { return nil }
