package discovery

import (
	"net/http"

	"github.com/julienschmidt/httprouter"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/example/egress-proxies-operator/inspect"
)

// getInspectCA hands the caller its inspecting CA's certificate (PEM),
// what its crawlers trust to use the gateway's -inspect; the key stays in
// the operator's namespace.
func (s *Server) getInspectCA(w http.ResponseWriter, r *http.Request, _ httprouter.Params) int {
	if s.opts.InspectCA == nil {
		return writeError(w, http.StatusNotFound, CodeNotFound, "the gateway does not inspect tunnels: the operator runs without --gateway-inspect")
	}
	ca, err := s.opts.InspectCA.CA(r.Context(), tenantOf(r.Context()))
	if err != nil {
		logf.FromContext(r.Context()).Error(err, "reading a tenant's inspecting CA", "tenant", tenantOf(r.Context()).Name)
		return writeError(w, http.StatusServiceUnavailable, CodeStoreUnavailable, "the inspecting CA cannot be read now; retry")
	}
	w.Header().Set("Content-Type", "application/x-pem-file")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(inspect.CertificatePEM(ca))
	return http.StatusOK
}
