package discovery

import (
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"time"

	"github.com/julienschmidt/httprouter"

	"github.com/example/egress-proxies-operator/broker"
	"github.com/example/egress-proxies-operator/lease"
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

// attributionResponse is GET /v1/attribution's answer.
type attributionResponse struct {
	IP       string          `json:"ip"`
	At       time.Time       `json:"at"`
	Tenants  []string        `json:"tenants"`
	Holdings []lease.Holding `json:"holdings"`
}

// getAttribution answers which tenants held an IP at a moment: the
// records from the longest a lease can go unrenewed before it up to it.
func (s *Server) getAttribution(w http.ResponseWriter, r *http.Request, _ httprouter.Params) int {
	t := tenantOf(r.Context())
	allowed, err := s.broker.MayReadAttribution(r.Context(), t)
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
	window := max(s.opts.MaxTTL+broker.DefaultTTL, broker.TunnelLedgerHorizon)
	entries, err := s.store.ReadLedger(r.Context(), at.Add(-window), at)
	if err != nil {
		return storeUnavailable(r.Context(), w, err)
	}
	holdings := lease.HoldersAt(entries, ip.String(), at)
	resp := attributionResponse{IP: ip.String(), At: at.UTC(), Tenants: []string{}, Holdings: holdings}
	for _, h := range holdings {
		if !slices.Contains(resp.Tenants, h.Tenant) {
			resp.Tenants = append(resp.Tenants, h.Tenant)
		}
	}
	if resp.Holdings == nil {
		resp.Holdings = []lease.Holding{}
	}
	return writeJSON(w, http.StatusOK, resp)
}
