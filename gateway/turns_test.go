package gateway

import (
	"fmt"
	"strings"
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

// TestCuts: the turn that may carry the first request waits for the
// lease's slot, the first request takes no other, and every later request
// record (every later turn, over plain HTTP) waits for a slot of its own,
// at the offset where it begins, whatever shares its write: over plain
// HTTP, TLS 1.3 with the request riding along the Finished or after a
// session ticket, TLS 1.2 without False Start, and HTTP/2 with its control
// frames and multiplexed requests.
func TestCuts(t *testing.T) {
	type write struct {
		bytes    []byte
		answered bool // the upstream wrote before it
	}
	hello := record(recordHandshake, 200)
	ccs := record(recordChangeCipherSpec, 1)
	finished13 := record(recordApplicationData, 53)
	request := record(recordApplicationData, 300)
	windowUpdate := record(recordApplicationData, 30)
	smallRequest := record(recordApplicationData, 40)
	for _, tc := range []struct {
		name   string
		writes []write
		// cuts: each write's, space-separated within it, '|' between
		// writes: F<at> waits for the lease's slot, P<at> for one of its
		// own.
		cuts string
	}{
		{"plain HTTP, kept alive", []write{{[]byte("GET / HTTP/1.1\r\n\r\n"), false}, {[]byte("GET /2 HTTP/1.1\r\n\r\n"), true}, {[]byte("GET /3"), true}, {[]byte(" HTTP/1.1\r\n\r\n"), false}},
			"F0|P0|P0|"},
		{"TLS 1.3, the request with the Finished", []write{{hello, false}, {concat(ccs, finished13, request), true}, {request, true}, {request, true}},
			"|F0|P0|P0"},
		{"TLS 1.3, the request after a session ticket", []write{{hello, false}, {concat(ccs, finished13), true}, {request, true}, {request, true}},
			"|F0||P0"},
		{"TLS 1.3, Finished and request written apart in one turn", []write{{hello, false}, {ccs, true}, {finished13, false}, {request, false}, {request, true}},
			"|F0|||P0"},
		{"TLS 1.2 without False Start", []write{{hello, false}, {concat(record(recordHandshake, 70), ccs, record(recordHandshake, 40)), true}, {request, true}, {request, true}},
			"|F0||P0"},
		{"a record split across writes", []write{{hello, false}, {concat(ccs, finished13, request[:3]), true}, {request[3:], false}, {request[:2], true}, {request[2:], false}},
			"|F0|||P0"},
		{"TLS 1.2, close_notify after the last answer", []write{{hello, false}, {concat(ccs, finished13, request), true}, {record(recordAlert, 26), true}},
			"|F0|"},
		{"TLS 1.3, close_notify (encrypted) after the last answer", []write{{hello, false}, {concat(ccs, finished13, request), true}, {record(recordApplicationData, 19), true}},
			"|F0|"},
		{"HTTP/2: a window update is no request, the next one is", []write{{hello, false}, {concat(ccs, finished13, request), true}, {windowUpdate, true}, {smallRequest, false}},
			"|F0||P0"},
		{"HTTP/2: a window update and a request in one write", []write{{hello, false}, {concat(ccs, finished13, request), true}, {concat(windowUpdate, smallRequest), true}},
			"|F0|P35"},
		{"HTTP/2: requests multiplexed in one write, each on its own slot", []write{{hello, false}, {concat(ccs, finished13, request), true}, {concat(request, windowUpdate, request, request), false}},
			"|F0|P0 P340 P645"},
		{"HTTP/2: the preface and settings first, a request behind them", []write{{hello, false}, {concat(ccs, finished13, record(recordApplicationData, 60), record(recordApplicationData, 80)), true}},
			"|F0 P129"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c turnCounter
			var got []string
			pending := false
			for _, w := range tc.writes {
				pending = pending || w.answered
				cuts, consumed := c.cuts(w.bytes, pending)
				if consumed {
					pending = false
				}
				var these []string
				for _, cut := range cuts {
					kind := "P"
					if cut.first {
						kind = "F"
					}
					these = append(these, fmt.Sprintf("%s%d", kind, cut.at))
				}
				got = append(got, strings.Join(these, " "))
			}
			assert.Equal(t, tc.cuts, strings.Join(got, "|"))
		})
	}
}
