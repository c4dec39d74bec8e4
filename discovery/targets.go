package discovery

import (
	"net/http"
	"time"

	"github.com/julienschmidt/httprouter"

	"github.com/example/egress-proxies-operator/broker"
)

// targetView is GET /v1/targets/{host}: what paces a host now.
type targetView struct {
	Host string `json:"host"`
	// Policies are the declared ones, per namespace.
	Policies []policyView `json:"policies"`
	// Learned is the pace its push-backs taught (absent: none).
	Learned *learnedView `json:"learned,omitempty"`
}

type policyView struct {
	Name                   string  `json:"name"`
	Host                   string  `json:"host"`
	RequestsPerSecondPerIP float64 `json:"requestsPerSecondPerIP,omitempty"`
	Burst                  int     `json:"burst,omitempty"`
	MaxConcurrentPerIP     int     `json:"maxConcurrentPerIP,omitempty"`
	FleetRequestsPerSecond float64 `json:"fleetRequestsPerSecond,omitempty"`
	FleetBurst             int     `json:"fleetBurst,omitempty"`
	IntervalSecondsPerIP   float64 `json:"intervalSecondsPerIP,omitempty"`
	FleetIntervalSeconds   float64 `json:"fleetIntervalSeconds,omitempty"`
}

type learnedView struct {
	IntervalSeconds float64   `json:"intervalSeconds"`
	Since           time.Time `json:"since"`
	PushBacks       int       `json:"pushBacks"`
}

func perSecond(d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return 1 / d.Seconds()
}

func (s *Server) getTarget(w http.ResponseWriter, r *http.Request, ps httprouter.Params) int {
	host := broker.NormalizeTarget(ps.ByName("host"))
	if err := broker.ValidateTarget(host, true); err != nil {
		return writeError(w, http.StatusBadRequest, CodeInvalidRequest, err.Error())
	}
	out := targetView{Host: host, Policies: []policyView{}}
	if s.opts.Politeness.Policies != nil {
		for _, p := range s.opts.Politeness.Policies.ForHost(host) {
			out.Policies = append(out.Policies, policyView{
				Name: p.Name, Host: p.Host, Burst: p.Pace.Burst, MaxConcurrentPerIP: p.Pace.MaxConcurrent, FleetBurst: p.Pace.FleetBurst,
				RequestsPerSecondPerIP: perSecond(p.Pace.Interval), IntervalSecondsPerIP: p.Pace.Interval.Seconds(),
				FleetRequestsPerSecond: perSecond(p.Pace.FleetInterval), FleetIntervalSeconds: p.Pace.FleetInterval.Seconds(),
			})
		}
	}
	l, err := s.broker.Store().LearnedPace(r.Context(), host)
	if err != nil {
		return storeUnavailable(r.Context(), w, err)
	}
	if l.Interval > 0 {
		out.Learned = &learnedView{IntervalSeconds: l.Interval.Seconds(), Since: l.Since.UTC(), PushBacks: l.PushBacks}
	}
	return writeJSON(w, http.StatusOK, out)
}
