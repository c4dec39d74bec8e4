package discovery

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/julienschmidt/httprouter"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
)

// The ledger answers an abuse complaint ("who used 34.1.2.3 at 14:02 on
// Tuesday?"): every lease is recorded when it starts, each time its holder
// renews it and when it ends; every gateway tunnel when it starts, at a
// checkpoint every TunnelLedgerHorizon it lasts and when it ends (never
// per renewal: the ledger grows with tunnels, not with traffic). Each
// record is whole (who, which proxy, its exit IP, the target), so any one
// of them names the holder. Records go to a JSON-lines log always (a file, or the operator's
// log under the logger "ledger") and to the lease store, which keeps them
// for the retention period (a Redis stream, shared by the replicas) and
// answers GET /v1/attribution.

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
	// IP is the proxy's exit address when the record was made.
	IP     string    `json:"ip"`
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
		"proxy", e.Proxy, "ip", e.IP, "target", e.Target, "start", e.Start, "until", e.Until, "bytes", e.Bytes)
}

// DefaultLedgerRetention is how long the lease store keeps records.
const DefaultLedgerRetention = 30 * 24 * time.Hour

// record writes a ledger entry to the sink and the store. A record the
// store could not take is logged: the JSON-lines log still has it.
func (s *Server) record(ctx context.Context, kind, event string, l Lease, session string, until time.Time, bytes int64) {
	ip := ""
	if info, ok := s.opts.View.lookup(l.ProxyID, 0); ok {
		ip = info.IP
	}
	e := LedgerEntry{At: s.opts.Clock.Now().UTC(), Kind: kind, Event: event, LeaseID: l.ID, Tenant: l.Holder, Session: session,
		Proxy: l.ProxyID, IP: ip, Target: l.Target, Start: l.CreatedAt.UTC(), Until: until.UTC(), Bytes: bytes}
	if s.opts.Ledger != nil {
		s.opts.Ledger.Write(e)
	}
	if err := s.store.AppendLedger(ctx, e, s.ledgerRetention()); err != nil {
		warn(logf.FromContext(ctx), "a ledger record reached the log but not the lease store", "lease", l.ID, "error", err.Error())
	}
}

func (s *Server) ledgerRetention() time.Duration {
	if s.opts.LedgerRetention > 0 {
		return s.opts.LedgerRetention
	}
	return DefaultLedgerRetention
}

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

// holdersAt folds ledger records into the leases and tunnels that held ip
// at the moment at: started by then, and neither ended nor expired before
// it. A lease is followed by its id through all its records; its IP is the
// one its records name. Sorted by start, then lease id.
func holdersAt(entries []LedgerEntry, ip string, at time.Time) []Holding {
	type folded struct {
		h     Holding
		ip    string
		until time.Time
		ended time.Time
	}
	byID := map[string]*folded{}
	for _, e := range entries {
		f, ok := byID[e.LeaseID]
		if !ok {
			f = &folded{h: Holding{Tenant: e.Tenant, Kind: e.Kind, Session: e.Session, LeaseID: e.LeaseID, Proxy: e.Proxy, Target: e.Target, Start: e.Start}, ip: e.IP}
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
	var out []Holding
	for _, f := range byID {
		end := f.until
		if !f.ended.IsZero() && (end.IsZero() || f.ended.Before(end)) {
			end = f.ended
		}
		if f.ip != ip || f.h.Start.After(at) || end.Before(at) {
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

// attributionResponse is GET /v1/attribution's answer.
type attributionResponse struct {
	IP       string    `json:"ip"`
	At       time.Time `json:"at"`
	Tenants  []string  `json:"tenants"`
	Holdings []Holding `json:"holdings"`
}

// getAttribution answers which tenants held an IP at a moment: the
// records from the longest a lease can go unrenewed before it up to it.
func (s *Server) getAttribution(w http.ResponseWriter, r *http.Request, _ httprouter.Params) int {
	t := tenantOf(r.Context())
	allowed, err := s.mayReadAttribution(r.Context())
	if err != nil {
		return authUnavailable(r.Context(), w, err)
	}
	if !allowed {
		return writeError(w, http.StatusForbidden, CodeForbidden, fmt.Sprintf(
			"%s may not read the ledger: it needs get on proxies/attribution (crawl.example.com) cluster-wide", t.Name))
	}
	q := r.URL.Query()
	ip, err := netip.ParseAddr(q.Get("ip"))
	if err != nil {
		return writeError(w, http.StatusBadRequest, CodeInvalidRequest, fmt.Sprintf("ip must be an IP address, got %q", q.Get("ip")))
	}
	at, err := time.Parse(time.RFC3339, q.Get("at"))
	if err != nil {
		return writeError(w, http.StatusBadRequest, CodeInvalidRequest, fmt.Sprintf("at must be an RFC 3339 time such as 2026-12-01T14:02:00Z, got %q", q.Get("at")))
	}
	// Every lease or tunnel live at at has a record within this window
	// before it: a lease's each renewal, a tunnel's start or checkpoint.
	window := max(s.opts.MaxTTL+DefaultTTL, TunnelLedgerHorizon)
	entries, err := s.store.ReadLedger(r.Context(), at.Add(-window), at)
	if err != nil {
		return storeUnavailable(r.Context(), w, err)
	}
	holdings := holdersAt(entries, ip.String(), at)
	resp := attributionResponse{IP: ip.String(), At: at.UTC(), Tenants: []string{}, Holdings: holdings}
	for _, h := range holdings {
		if !slices.Contains(resp.Tenants, h.Tenant) {
			resp.Tenants = append(resp.Tenants, h.Tenant)
		}
	}
	if resp.Holdings == nil {
		resp.Holdings = []Holding{}
	}
	return writeJSON(w, http.StatusOK, resp)
}
