package lease

import (
	"encoding/json"
	"io"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
)

// The ledger answers an abuse complaint ("who used 34.1.2.3 at 14:02 on
// Tuesday?"): its records are kept by the Store (AppendLedger, ReadLedger)
// and written to a LedgerSink; HoldersAt folds them into the answer.

// Kinds and events of ledger records.
const (
	LedgerLease  = "lease"
	LedgerTunnel = "tunnel"

	LedgerStart = "start"
	LedgerRenew = "renew"
	LedgerEnd   = "end"
)

// LedgerEntry is one record: a lease or tunnel starting, renewed or ending.
type LedgerEntry struct {
	// At is when it was recorded (the store's clock orders them).
	At    time.Time `json:"at"`
	Kind  string    `json:"kind"`
	Event string    `json:"event"`
	// LeaseID is the lease the API or the tunnel holds.
	LeaseID string `json:"leaseID"`
	Tenant  string `json:"tenant"`
	// Session is the gateway session (tunnels only; "" rotates).
	Session string `json:"session,omitempty"`
	Proxy   string `json:"proxy"`
	// IP is the proxy's address when the record was made; ExitIP the
	// address sites saw instead, when the health engine learnt another
	// (NAT, a provider's gateway); IPv6 its IPv6 range (a dual-stack
	// VM's): sites that speak IPv6 saw an address of it.
	IP     string    `json:"ip"`
	ExitIP string    `json:"exitIP,omitempty"`
	IPv6   string    `json:"ipv6,omitempty"`
	Target string    `json:"target,omitempty"`
	Start  time.Time `json:"start"`
	// Until is the lease's expiry (start, renew), or when it ended (end).
	Until time.Time `json:"until"`
	// Bytes a tunnel carried, both ways (end of a tunnel only).
	Bytes int64 `json:"bytes,omitempty"`
}

// LedgerSink writes records where people read them (the JSON-lines log).
type LedgerSink interface {
	Write(e LedgerEntry)
}

// JSONLines writes each record as one JSON line to w, in order.
type JSONLines struct {
	mu  sync.Mutex
	w   io.Writer
	log logr.Logger
}

// NewJSONLines is a sink writing to w; write failures go to log.
func NewJSONLines(w io.Writer, log logr.Logger) *JSONLines { return &JSONLines{w: w, log: log} }

// Write implements LedgerSink.
func (j *JSONLines) Write(e LedgerEntry) {
	line, err := json.Marshal(e)
	if err != nil {
		j.log.Error(err, "encoding a ledger record")
		return
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if _, err := j.w.Write(append(line, '\n')); err != nil {
		j.log.Error(err, "writing a ledger record", "lease", e.LeaseID)
	}
}

// LogSink writes each record to a logger (the operator's JSON log), for
// installs with no ledger file.
type LogSink struct{ Log logr.Logger }

// Write implements LedgerSink.
func (l LogSink) Write(e LedgerEntry) {
	l.Log.Info("ledger", "kind", e.Kind, "event", e.Event, "leaseID", e.LeaseID, "tenant", e.Tenant, "session", e.Session,
		"proxy", e.Proxy, "ip", e.IP, "exitIP", e.ExitIP, "ipv6", e.IPv6, "target", e.Target, "start", e.Start, "until", e.Until, "bytes", e.Bytes)
}

// DefaultLedgerRetention is how long the lease store keeps records.
const DefaultLedgerRetention = 30 * 24 * time.Hour

// Holding is one lease or tunnel that held an IP at a moment.
type Holding struct {
	Tenant  string    `json:"tenant"`
	Kind    string    `json:"kind"`
	Session string    `json:"session,omitempty"`
	LeaseID string    `json:"leaseID"`
	Proxy   string    `json:"proxy"`
	Target  string    `json:"target,omitempty"`
	Start   time.Time `json:"start"`
	// End is when it ended, or when it will unless renewed.
	End time.Time `json:"end"`
}

// HoldersAt folds ledger records into the leases and tunnels that held ip
// at the moment at: started by then, and neither ended nor expired before
// it. A lease is followed by its id through all its records; its IP is the
// one its records name (its address or the exit IP sites saw), or any
// address of the IPv6 range they name.
// Sorted by start, then lease id.
func HoldersAt(entries []LedgerEntry, ip string, at time.Time) []Holding {
	type folded struct {
		h      Holding
		ip     string
		exitIP string
		ipv6   netip.Prefix
		until  time.Time
		ended  time.Time
	}
	byID := map[string]*folded{}
	for _, e := range entries {
		f, ok := byID[e.LeaseID]
		if !ok {
			f = &folded{h: Holding{Tenant: e.Tenant, Kind: e.Kind, Session: e.Session, LeaseID: e.LeaseID, Proxy: e.Proxy, Target: e.Target, Start: e.Start}, ip: e.IP, exitIP: e.ExitIP}
			f.ipv6, _ = netip.ParsePrefix(e.IPv6)
			byID[e.LeaseID] = f
		}
		switch e.Event {
		case LedgerEnd:
			if f.ended.IsZero() || e.Until.Before(f.ended) {
				f.ended = e.Until
			}
		default:
			if e.Until.After(f.until) {
				f.until = e.Until
			}
		}
	}
	addr, _ := netip.ParseAddr(ip)
	var out []Holding
	for _, f := range byID {
		end := f.until
		if !f.ended.IsZero() && (end.IsZero() || f.ended.Before(end)) {
			end = f.ended
		}
		held := f.ip == ip || (f.exitIP != "" && f.exitIP == ip) || (f.ipv6.IsValid() && f.ipv6.Contains(addr))
		if !held || f.h.Start.After(at) || end.Before(at) {
			continue
		}
		f.h.End = end
		out = append(out, f.h)
	}
	slices.SortFunc(out, func(a, b Holding) int {
		if c := a.Start.Compare(b.Start); c != 0 {
			return c
		}
		return compareStrings(a.LeaseID, b.LeaseID)
	})
	return out
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
