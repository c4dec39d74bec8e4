package discovery

import (
	"context"
	"fmt"

	"github.com/example/egress-proxies-operator/broker"
	"github.com/example/egress-proxies-operator/tenant"
)

// Authorize is the tenant a gateway client's password names (the gateway's
// Authorizer): the
// discovery token, or a ServiceAccount token for the operator's audience.
// ErrGatewayLocked comes first, whatever the password (even none): a
// gateway that can check no token refuses everyone alike.
func (s *Server) Authorize(ctx context.Context, password string) (*tenant.Tenant, error) {
	token, required := s.opts.Tokens.Token()
	if authStateOf(token, required) != authEnforced {
		return nil, broker.ErrGatewayLocked
	}
	who, err := s.identify(ctx, password, token)
	switch {
	case err != nil:
		return nil, fmt.Errorf("reviewing the proxy password: %w", err)
	case who == nil:
		return nil, broker.ErrWrongToken
	}
	return who, nil
}

// Tunnels is the gateway's side of the API: who a gateway client is
// (Authorize) and the broker's tunnel path, the one the API's leases take.
type Tunnels struct {
	*broker.Broker
	s *Server
}

// Tunnels joins Authorize and the broker for the gateway
// (gateway.Upstreams).
func (s *Server) Tunnels() Tunnels { return Tunnels{Broker: s.broker, s: s} }

// Authorize is the tenant a gateway client's password names (Server.Authorize).
func (t Tunnels) Authorize(ctx context.Context, password string) (*tenant.Tenant, error) {
	return t.s.Authorize(ctx, password)
}
