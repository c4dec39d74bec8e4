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

// TestTurns: the turn that may carry the first request waits for the
// lease's slot and takes no other, and every later request takes one of
// its own, over plain HTTP, TLS 1.3 with the request riding along the
// Finished or after a session ticket, and TLS 1.2 without False Start.
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
		// turns: what each write begins: '-' nothing, 'F' the turn that
		// may carry the first request (held until the lease's slot), 'P'
		// a later request's turn (a slot of its own).
		turns string
	}{
		{"plain HTTP, kept alive", []write{{[]byte("GET / HTTP/1.1\r\n\r\n"), false}, {[]byte("GET /2 HTTP/1.1\r\n\r\n"), true}, {[]byte("GET /3"), true}, {[]byte(" HTTP/1.1\r\n\r\n"), false}},
			"FPP-"},
		{"TLS 1.3, the request with the Finished", []write{{hello, false}, {concat(ccs, finished13, request), true}, {request, true}, {request, true}},
			"-FPP"},
		{"TLS 1.3, the request after a session ticket", []write{{hello, false}, {concat(ccs, finished13), true}, {request, true}, {request, true}},
			"-F-P"},
		{"TLS 1.3, Finished and request written apart in one turn", []write{{hello, false}, {ccs, true}, {finished13, false}, {request, false}, {request, true}},
			"-F--P"},
		{"TLS 1.2 without False Start", []write{{hello, false}, {concat(record(recordHandshake, 70), ccs, record(recordHandshake, 40)), true}, {request, true}, {request, true}},
			"-F-P"},
		{"a record split across writes", []write{{hello, false}, {concat(ccs, finished13, request[:3]), true}, {request[3:], false}, {request, true}},
			"-F-P"},
		{"TLS 1.2, close_notify after the last answer", []write{{hello, false}, {concat(ccs, finished13, request), true}, {record(recordAlert, 26), true}},
			"-F-"},
		{"TLS 1.3, close_notify (encrypted) after the last answer", []write{{hello, false}, {concat(ccs, finished13, request), true}, {record(recordApplicationData, 19), true}},
			"-F-"},
		{"HTTP/2: a window update after an answer is no turn, and leaves the answer to the next request", []write{{hello, false},
			{concat(ccs, finished13, request), true}, {record(recordApplicationData, 30), true}, {record(recordApplicationData, 40), false}},
			"-F-P"},
		{"HTTP/2: a window update and the next request in one write", []write{{hello, false},
			{concat(ccs, finished13, request), true}, {concat(record(recordApplicationData, 30), record(recordApplicationData, 40)), true}},
			"-FP"},
		{"TLS, close_notify after a ticket and the answer", []write{{hello, false}, {concat(ccs, finished13), true}, {request, true}, {record(recordAlert, 19), true}},
			"-F--"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c turnCounter
			got, pending := "", false
			for _, w := range tc.writes {
				pending = pending || w.answered
				kind, consumed := c.turn(w.bytes, pending)
				if consumed {
					pending = false
				}
				got += string("-FP"[kind])
				c.observe(w.bytes)
			}
			assert.Equal(t, tc.turns, got)
		})
	}
}
