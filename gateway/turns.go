package gateway

import (
	"errors"

	"github.com/example/egress-proxies-operator/tlsprint"
)

// Requests inside a tunnel. The gateway never decrypts a tunnel, but the
// TLS record layer travels in clear, and each request a client sends after
// the handshake goes in records of its own: over HTTP/1.1 kept alive, one
// request a write; over HTTP/2, one HEADERS frame a record, however many
// streams are in flight at once. So each application-data record large
// enough to hold a request is held until a slot of its host's pace, as a
// lease would be, and the records before it go on.
//
// The first request goes on the slot the tunnel's lease took. Over TLS it
// cannot come before the client's turn that finishes the handshake (a
// ChangeCipherSpec for compatibility, then its Finished, after the
// server's flight): that turn waits for the lease's slot, and the first
// request record after the Finished (in that turn or later: TLS 1.3
// session tickets, TLS 1.2's Finished from the server) takes no other.
// Records too small for a request are not counted: alerts (a TLS 1.3
// close_notify is 19 bytes, encrypted) and HTTP/2's control frames (a
// settings ack, a window update, a ping). What cannot be told apart is
// counted as a request: a delay, never a request over the pace.
//
// Over plain HTTP the gateway sees no records: the first write is the
// first request, and each later one is the client writing again after the
// upstream answered (a turn), which paces keep-alive, not pipelining.

// TLS record content types the counter reads.
const (
	recordChangeCipherSpec = 0x14
	recordAlert            = 0x15
	recordHandshake        = 0x16
	recordApplicationData  = 0x17
	recordHeader           = 5
)

// minRequestRecord is the smallest TLS record that may carry a request:
// below it are alerts and HTTP/2's small control frames in TLS 1.3 (a
// settings ack is 26 bytes, a window update or a stream reset 30, a ping
// 34). An HTTP/2 request whose headers HPACK shrank to a few bytes is 40
// or more.
const minRequestRecord = 35

// Where a tunnel's client is.
const (
	turnsStart     = iota // nothing written yet
	turnsHandshake        // TLS: the ClientHello went, the handshake is on
	turnsFinishing        // TLS: the client finished the handshake; its first request is next
	turnsRequests         // the first request went: every later one is paced
)

// cut is where a request begins in a client write, and what it waits for.
type cut struct {
	at int
	// first: the first request's, or the turn that may carry it: it waits
	// for the lease's slot; else a slot of its own.
	first bool
}

// turnCounter follows one tunnel's client direction. It is not safe for
// concurrent use: the client's direction alone calls it.
type turnCounter struct {
	state int
	tls   bool
	// records counts the records since the finishing turn's
	// ChangeCipherSpec (or since its start, for a client that sends none):
	// the first is the Finished.
	records int
	// hdr gathers a record header across writes; left is what remains of
	// the current record's body.
	hdr  [recordHeader]byte
	hdrN int
	left int
}

// cuts reads a client write p and says where in it requests begin that
// must wait (in order), given whether the upstream wrote since the client's
// last turn (answered); consumed says the write used that answer up.
func (c *turnCounter) cuts(p []byte, answered bool) (out []cut, consumed bool) {
	if len(p) == 0 {
		return nil, false
	}
	switch c.state {
	case turnsStart:
		if p[0] != recordHandshake {
			c.state = turnsRequests
			return []cut{{at: 0, first: true}}, true
		}
		c.state, c.tls = turnsHandshake, true
		consumed = true
	case turnsHandshake:
		if answered {
			// The server's flight came: this turn finishes the handshake
			// and may carry the first request.
			c.state, c.records = turnsFinishing, 0
			out, consumed = append(out, cut{at: 0, first: true}), true
		}
	case turnsRequests:
		if !c.tls {
			if answered {
				return []cut{{at: 0}}, true
			}
			return nil, false
		}
	}
	c.scan(p, func(at, typ, n int) {
		switch c.state {
		case turnsFinishing:
			switch {
			case typ == recordChangeCipherSpec:
				c.records = 0
			case c.records > 0 && typ == recordApplicationData && n >= minRequestRecord:
				c.state = turnsRequests // the first request: on the lease's slot
			default:
				c.records++ // the first is the Finished
			}
		case turnsRequests:
			if typ == recordApplicationData && n >= minRequestRecord {
				out = append(out, cut{at: at})
			}
		}
	})
	return out, consumed
}

// scan walks the records in p, across writes, calling found at each
// record's start (at is its offset in p, 0 when its header began in an
// earlier write) with its type and length.
func (c *turnCounter) scan(p []byte, found func(at, typ, n int)) {
	for off := 0; off < len(p); {
		if c.left > 0 {
			n := min(c.left, len(p)-off)
			c.left -= n
			off += n
			continue
		}
		start := off - c.hdrN
		n := copy(c.hdr[c.hdrN:], p[off:])
		c.hdrN += n
		off += n
		if c.hdrN < recordHeader {
			return
		}
		c.hdrN = 0
		c.left = int(c.hdr[3])<<8 | int(c.hdr[4])
		found(max(start, 0), int(c.hdr[0]), c.left)
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
