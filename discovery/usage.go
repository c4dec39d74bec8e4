package discovery

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/julienschmidt/httprouter"

	"github.com/example/egress-proxies-operator/broker"
)

// usageResponse is GET /v1/usage's answer.
type usageResponse struct {
	From    string            `json:"from"`
	To      string            `json:"to"`
	GroupBy []string          `json:"groupBy"`
	Rows    []broker.UsageRow `json:"rows"`
	Total   broker.UsageRow   `json:"total"`
}

// defaultUsageGroups are what a usage read groups by when it does not say.
var defaultUsageGroups = []string{broker.GroupTenant, broker.GroupHost, broker.GroupDay}

// getUsage answers what the caller's team did (every team's, for the
// platform and a tenant RBAC lets get proxies/usage), per tenant, host,
// day or provider, from one UTC day to another (today by default).
func (s *Server) getUsage(w http.ResponseWriter, r *http.Request, _ httprouter.Params) int {
	q := r.URL.Query()
	today := s.opts.Clock.Now().UTC().Truncate(24 * time.Hour)
	day := func(name string) (time.Time, error) {
		v := q.Get(name)
		if v == "" {
			return today, nil
		}
		d, err := time.Parse(time.DateOnly, v)
		if err != nil {
			return time.Time{}, fmt.Errorf("%s must be a UTC day such as 2026-12-01, got %q", name, v)
		}
		return d, nil
	}
	from, err := day("from")
	if err != nil {
		return writeError(w, http.StatusBadRequest, CodeInvalidRequest, err.Error())
	}
	to, err := day("to")
	if err != nil {
		return writeError(w, http.StatusBadRequest, CodeInvalidRequest, err.Error())
	}
	groupBy := defaultUsageGroups
	if v := q.Get("groupBy"); v != "" {
		groupBy = strings.Split(v, ",")
	}
	rows, err := s.broker.Usage(r.Context(), tenantOf(r.Context()), broker.UsageQuery{From: from, To: to, GroupBy: groupBy})
	switch {
	case errors.Is(err, broker.ErrInvalidUsageQuery):
		return writeError(w, http.StatusBadRequest, CodeInvalidRequest, err.Error())
	case errors.Is(err, broker.ErrTenantsUnavailable):
		return authUnavailable(r.Context(), w, err)
	case err != nil:
		return storeUnavailable(r.Context(), w, err)
	}
	resp := usageResponse{From: from.Format(time.DateOnly), To: to.Format(time.DateOnly), GroupBy: groupBy, Rows: rows}
	for _, row := range rows {
		resp.Total.Add(row.UsageCounts)
		resp.Total.ProxyHours += row.ProxyHours
		if row.Cost != nil {
			if resp.Total.Cost == nil {
				resp.Total.Cost = new(float64)
			}
			*resp.Total.Cost += *row.Cost
		}
	}
	return writeJSON(w, http.StatusOK, resp)
}
