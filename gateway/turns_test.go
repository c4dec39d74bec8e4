package gateway

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// record is a TLS record of typ with n bytes of body.
func record(typ byte, n int) []byte {
	return append([]byte{typ, 3, 3, byte(n >> 8), byte(n)}, make([]byte, n)...)
}

func concat(parts ...[]byte) []byte {
	var out []byte
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// TestTurns: the first request is never paced and every later one is,
// over plain HTTP, TLS 1.3 with the request riding along the Finished or
// after a session ticket, and TLS 1.2 without False Start.
func TestTurns(t *testing.T) {
	type write struct {
		bytes    []byte
		answered bool // the upstream wrote before it
	}
	hello := record(recordHandshake, 200)
	ccs := record(recordChangeCipherSpec, 1)
	finished13 := record(recordApplicationData, 53)
	request := record(recordApplicationData, 300)
	for _, tc := range []struct {
		name   string
		writes []write
		paced  []bool
	}{
		{"plain HTTP, kept alive", []write{{[]byte("GET / HTTP/1.1\r\n\r\n"), false}, {[]byte("GET /2 HTTP/1.1\r\n\r\n"), true}, {[]byte("GET /3"), true}, {[]byte(" HTTP/1.1\r\n\r\n"), false}},
			[]bool{false, true, true, false}},
		{"TLS 1.3, the request with the Finished", []write{{hello, false}, {concat(ccs, finished13, request), true}, {request, true}, {request, true}},
			[]bool{false, false, true, true}},
		{"TLS 1.3, the request after a session ticket", []write{{hello, false}, {concat(ccs, finished13), true}, {request, true}, {request, true}},
			[]bool{false, false, false, true}},
		{"TLS 1.3, Finished and request written apart in one turn", []write{{hello, false}, {ccs, true}, {finished13, false}, {request, false}, {request, true}},
			[]bool{false, false, false, false, true}},
		{"TLS 1.2 without False Start", []write{{hello, false}, {concat(record(recordHandshake, 70), ccs, record(recordHandshake, 40)), true}, {request, true}, {request, true}},
			[]bool{false, false, false, true}},
		{"a record split across writes", []write{{hello, false}, {concat(ccs, finished13, request[:3]), true}, {request[3:], false}, {request, true}},
			[]bool{false, false, false, true}},
		{"TLS 1.2, close_notify after the last answer", []write{{hello, false}, {concat(ccs, finished13, request), true}, {record(recordAlert, 26), true}},
			[]bool{false, false, false}},
		{"TLS 1.3, close_notify (encrypted) after the last answer", []write{{hello, false}, {concat(ccs, finished13, request), true}, {record(recordApplicationData, 19), true}},
			[]bool{false, false, false}},
		{"TLS, close_notify after a ticket and the answer", []write{{hello, false}, {concat(ccs, finished13), true}, {request, true}, {record(recordAlert, 19), true}},
			[]bool{false, false, false, false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c turnCounter
			var got []bool
			for _, w := range tc.writes {
				got = append(got, c.turn(w.bytes, w.answered))
				c.observe(w.bytes)
			}
			assert.Equal(t, tc.paced, got)
		})
	}
}
