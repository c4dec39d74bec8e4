package gateway

import (
	"errors"

	"github.com/example/egress-proxies-operator/tlsprint"
)

// Turns of a tunnel: a client writes, the site answers, the client writes
// again. The gateway never decrypts a tunnel, but it sees its turns, and
// each request after the first one goes on a turn of its own: it is held
// until a slot of its host's pace, as a lease would be.
//
// Over plain HTTP the first turn is the first request. Over TLS the
// gateway follows the record layer, which travels in clear: the client's
// first turn is its ClientHello, its second finishes the handshake (a
// ChangeCipherSpec for compatibility, then its Finished) and often carries
// the first request with it (any application-data record after the
// Finished). If it does not, the client's next turn is the first request,
// whatever the server wrote meanwhile (TLS 1.3 session tickets, TLS 1.2's
// Finished). Every turn after the first request that begins with a record
// of application data large enough for a request is paced (an alert, such
// as the close_notify a client sends after its last answer, is no request,
// nor is an HTTP/2 settings ack or window update). HTTP/2 sends
// frames of its own after the server's (settings, window updates), so its
// turns are at least its requests: paced as tightly, often more. What
// cannot be told apart is counted as a request: a delay, never a request
// over the pace.

// TLS record content types the turn counter reads.
const (
	recordChangeCipherSpec = 0x14
	recordAlert            = 0x15
	recordHandshake        = 0x16
	recordApplicationData  = 0x17
	recordHeader           = 5
)

// Where a tunnel's client is.
const (
	turnsStart     = iota // nothing written yet
	turnsHandshake        // TLS: the ClientHello went, the handshake is on
	turnsFinishing        // TLS: the turn that finishes the handshake
	turnsRequests         // the first request went: every new turn is paced
)

// turnCounter follows one tunnel's client direction. It is not safe for
// concurrent use: the client's direction alone calls it.
type turnCounter struct {
	state int
	// tls: the client speaks TLS; only a write that begins with an
	// application-data record can then be a request (an alert such as
	// close_notify after the last answer is none).
	tls bool
	// requestSeen: an application-data record came after the Finished in
	// the finishing turn (the first request rode along).
	requestSeen bool
	// records counts the records since the finishing turn's
	// ChangeCipherSpec (or since its start, for a client that sends none).
	records int
	// hdr gathers a record header across writes; left is what remains of
	// the current record's body.
	hdr  [recordHeader]byte
	hdrN int
	left int
}

// What a client write begins, for the tunnel's pacing.
const (
	turnNone  = iota // nothing to hold: the handshake, or the same turn going on
	turnFirst        // the turn that may carry the first request: it waits for the lease's slot
	turnPaced        // a later request's turn: it takes a slot of its own
)

// turn is called as a client write begins (head is what came at once, and
// answered says the upstream wrote since the client's last turn): what the
// write begins, and whether it used up the answer (a write that is no turn,
// such as an HTTP/2 window update after a response, leaves it for the next
// one). The first request goes on the lease's slot: over plain HTTP it is
// the first write; over TLS it cannot come before the turn that finishes
// the handshake, which is held until the slot whether or not the request
// rides along (a request in its own next turn then comes later still, and
// takes no slot).
func (c *turnCounter) turn(head []byte, answered bool) (kind int, consumed bool) {
	first := head[0]
	switch c.state {
	case turnsStart:
		c.state = turnsRequests
		if first == recordHandshake {
			c.state, c.tls = turnsHandshake, true
			return turnNone, true
		}
		return turnFirst, true
	case turnsHandshake:
		if answered {
			c.state, c.records = turnsFinishing, 0
			return turnFirst, true
		}
		return turnNone, false
	case turnsFinishing:
		if !answered {
			return turnNone, false // the same turn goes on
		}
		c.state = turnsRequests
		if !c.requestSeen {
			return turnNone, true // this turn is the first request
		}
	}
	if answered && c.request(head) {
		return turnPaced, true
	}
	return turnNone, false
}

// minRequestRecord is the smallest TLS record that may carry a request:
// below it are alerts (a TLS 1.3 close_notify is 19 bytes, encrypted) and
// HTTP/2's small control frames in TLS 1.3 (a settings ack is 26 bytes, a
// window update or a stream reset 30, a ping 34). An HTTP/2 request whose
// headers HPACK shrank to a few bytes can be as small as 40: anything from
// here up is counted as a request, a delay at worst.
const minRequestRecord = 35

// request says whether a write beginning with head may carry a request:
// anything over plain HTTP; over TLS, an application-data record large
// enough to hold one among the records that came at once (an HTTP/2
// client may write a window update and its next request together).
func (c *turnCounter) request(head []byte) bool {
	if !c.tls {
		return true
	}
	for off := 0; off < len(head); {
		if len(head)-off < recordHeader {
			return head[off] == recordApplicationData // cut short: it may be one
		}
		n := int(head[off+3])<<8 | int(head[off+4])
		if head[off] == recordApplicationData && n >= minRequestRecord {
			return true
		}
		off += recordHeader + n
	}
	return false
}

// observe reads a client write's bytes: in the finishing turn, whether an
// application-data record follows the Finished.
func (c *turnCounter) observe(p []byte) {
	if c.state != turnsFinishing && c.state != turnsHandshake {
		return
	}
	for len(p) > 0 {
		if c.left > 0 {
			n := min(c.left, len(p))
			c.left -= n
			p = p[n:]
			continue
		}
		n := copy(c.hdr[c.hdrN:], p)
		c.hdrN += n
		p = p[n:]
		if c.hdrN < recordHeader {
			return
		}
		c.hdrN = 0
		c.left = int(c.hdr[3])<<8 | int(c.hdr[4])
		if c.state != turnsFinishing {
			continue
		}
		switch typ := c.hdr[0]; {
		case typ == recordChangeCipherSpec:
			c.records = 0
		case c.records > 0 && typ == recordApplicationData:
			c.requestSeen = true
			c.records++
		default:
			c.records++ // the first is the Finished
		}
	}
}

// hello reads a tunnel's ClientHello from the client's first bytes (they
// travel in clear) and hands its JA4 fingerprint on once. It is not safe
// for concurrent use: the client's direction alone calls it.
type hello struct {
	buf  []byte
	done bool
	saw  func(client string)
}

// observe reads a client write's bytes until the ClientHello is whole, or
// turns out to be none.
func (h *hello) observe(p []byte) {
	if h.done || len(p) == 0 {
		return
	}
	if h.buf == nil {
		if p[0] != recordHandshake {
			h.done = true
			clientHellos.WithLabelValues("not_tls").Inc()
			return
		}
		// Most ClientHellos come whole in the first write: no copy.
		if fp, err := tlsprint.FromBytes(p); !errors.Is(err, tlsprint.ErrIncomplete) {
			h.finish(fp, err)
			return
		}
	}
	h.buf = append(h.buf, p[:min(len(p), tlsprint.MaxHello-len(h.buf))]...)
	fp, err := tlsprint.FromBytes(h.buf)
	if errors.Is(err, tlsprint.ErrIncomplete) && len(h.buf) >= tlsprint.MaxHello {
		err = tlsprint.ErrNotTLS
	}
	if !errors.Is(err, tlsprint.ErrIncomplete) {
		h.finish(fp, err)
	}
}

func (h *hello) finish(fp string, err error) {
	h.done, h.buf = true, nil
	if err != nil {
		clientHellos.WithLabelValues("unreadable").Inc()
		return
	}
	clientHellos.WithLabelValues("read").Inc()
	h.saw(fp)
}
