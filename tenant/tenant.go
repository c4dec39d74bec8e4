// Package tenant says who a crawler team is and which proxies it may
// lease. A team's identity is a Kubernetes ServiceAccount: its crawlers send
// a token issued for the operator's audience (a projected ServiceAccount
// token), which the API server checks (TokenReview), and RBAC grants it
// proxies through virtual subresources (SubjectAccessReview) in the
// proxies' namespace:
//
//	create proxypools/lease  on a pool (resourceNames) or every pool: lease its members
//	create proxies/lease     on a Proxy (resourceNames) or every Proxy: lease it
//	get proxies/attribution  cluster-wide: ask the ledger who held an IP when
//	get proxies/usage        cluster-wide: read every team's usage, not only its own
//
// so granting a team a pool is an ordinary Role and RoleBinding, and
// deleting the binding stops its next lease within the review cache's
// lifetime. The static discovery token is the Platform tenant, which may
// lease every proxy. The API server's answers come through a Reviewer
// (package kubeauth's, which caches them).
//
// It must never import discovery, the gateway or the controllers
// (discovery asks it), nor kubeauth (main wires a Reviewer in): depguard
// enforces it.
package tenant

import (
	"context"
	"fmt"
	"net"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
)

// The virtual resources RBAC grants leases on.
const (
	// VerbLease is the verb of a lease.
	VerbLease = "create"
	// SubresourceLease is the subresource a lease is made on.
	SubresourceLease = "lease"
	// ResourcePools and ResourceProxies are the resources it is made on.
	ResourcePools   = "proxypools"
	ResourceProxies = "proxies"
	// VerbAttribution on SubresourceAttribution of ResourceProxies,
	// cluster-wide, reads the ledger.
	VerbAttribution        = "get"
	SubresourceAttribution = "attribution"
	// SubresourceUsage of ResourceProxies, cluster-wide, reads every
	// team's usage (VerbAttribution).
	SubresourceUsage = "usage"
)

// DefaultAudience is the audience a crawler's ServiceAccount token must be
// issued for (--tenant-audience).
const DefaultAudience = "egress-proxies-operator"

// PlatformName names the Platform tenant in leases, logs and metrics.
const PlatformName = "platform"

// Tenant is one client of the discovery API or the gateway.
type Tenant struct {
	// Name is what leases and logs call it: the ServiceAccount's user name
	// (system:serviceaccount:<namespace>:<name>), or PlatformName.
	Name string
	// user is who RBAC judges; nil for the Platform tenant.
	user *authenticationv1.UserInfo
}

// Platform is the holder of the static discovery token: it may lease every
// proxy, as the discovery API allowed before it knew tenants.
var Platform = &Tenant{Name: PlatformName}

// Anonymous is every client of an API run with --discovery-auth=none: it
// may lease every proxy (and is never handed credentials).
var Anonymous = &Tenant{Name: "anonymous"}

// ForUser is the tenant of an authenticated user.
func ForUser(user *authenticationv1.UserInfo) *Tenant {
	return &Tenant{Name: user.Username, user: user}
}

// All says whether t may lease every proxy without asking RBAC.
func (t *Tenant) All() bool { return t.user == nil }

// Proxy is what RBAC is asked about a proxy: where it is, and its pool
// ("" for none).
type Proxy struct {
	Namespace, Name, Pool string
}

// Reviewer is the API server's side (kubeauth.Reviewer). client is the
// address that presented the token: reviews are rate-limited per client.
type Reviewer interface {
	Authenticate(ctx context.Context, token, client string) (*authenticationv1.UserInfo, error)
	Allowed(ctx context.Context, user *authenticationv1.UserInfo, attrs authorizationv1.ResourceAttributes) (bool, error)
}

// Checker identifies ServiceAccount tenants and says what they may lease.
type Checker struct{ reviewer Reviewer }

// NewChecker is a Checker over a Reviewer.
func NewChecker(reviewer Reviewer) *Checker { return &Checker{reviewer: reviewer} }

// Identify is the tenant a bearer token belongs to, nil when it belongs to
// nobody the API server knows for the operator's audience (a wrong
// audience, expired, or its ServiceAccount deleted).
func (c *Checker) Identify(ctx context.Context, token string) (*Tenant, error) {
	user, err := c.reviewer.Authenticate(ctx, token, ClientOf(ctx))
	if err != nil || user == nil {
		return nil, err
	}
	return ForUser(user), nil
}

type clientKey struct{}

// WithClient is ctx carrying the address of the client whose token is to
// be identified (a request's RemoteAddr, port dropped): the API server's
// reviews are bounded per client address.
func WithClient(ctx context.Context, remoteAddr string) context.Context {
	if host, _, err := net.SplitHostPort(remoteAddr); err == nil {
		remoteAddr = host
	}
	return context.WithValue(ctx, clientKey{}, remoteAddr)
}

// ClientOf is the client address WithClient put in ctx ("" none).
func ClientOf(ctx context.Context) string {
	s, _ := ctx.Value(clientKey{}).(string)
	return s
}

// MayLease says whether t may lease p. A pool's member is leasable through
// a grant on its pool or on every Proxy of its namespace (two reviews per
// pool at most, whatever its size); a Proxy of no pool through a grant on
// it by name or on every Proxy of its namespace.
func (c *Checker) MayLease(ctx context.Context, t *Tenant, p Proxy) (bool, error) {
	if t.All() {
		return true, nil
	}
	if p.Pool != "" {
		ok, err := c.allowed(ctx, t, p.Namespace, ResourcePools, p.Pool)
		if ok || err != nil {
			return ok, err
		}
		return c.allowed(ctx, t, p.Namespace, ResourceProxies, "")
	}
	return c.allowed(ctx, t, p.Namespace, ResourceProxies, p.Name)
}

// MayReadAttribution says whether t may ask the ledger who held an IP.
func (c *Checker) MayReadAttribution(ctx context.Context, t *Tenant) (bool, error) {
	return c.mayGetClusterWide(ctx, t, SubresourceAttribution, "read the ledger")
}

// MayReadUsage says whether t may read every team's usage (a team always
// reads its own).
func (c *Checker) MayReadUsage(ctx context.Context, t *Tenant) (bool, error) {
	return c.mayGetClusterWide(ctx, t, SubresourceUsage, "read every team's usage")
}

// mayGetClusterWide says whether t may get proxies/<subresource> in every
// namespace (what, for the error, says what that lets it do).
func (c *Checker) mayGetClusterWide(ctx context.Context, t *Tenant, subresource, what string) (bool, error) {
	if t.All() {
		return true, nil
	}
	ok, err := c.reviewer.Allowed(ctx, t.user, authorizationv1.ResourceAttributes{
		Verb: VerbAttribution, Group: crawlv1alpha1.GroupVersion.Group, Resource: ResourceProxies, Subresource: subresource,
	})
	if err != nil {
		return false, fmt.Errorf("asking whether %s may %s: %w", t.Name, what, err)
	}
	return ok, nil
}

func (c *Checker) allowed(ctx context.Context, t *Tenant, namespace, resource, name string) (bool, error) {
	ok, err := c.reviewer.Allowed(ctx, t.user, authorizationv1.ResourceAttributes{
		Namespace: namespace, Verb: VerbLease, Group: crawlv1alpha1.GroupVersion.Group,
		Resource: resource, Subresource: SubresourceLease, Name: name,
	})
	if err != nil {
		return false, fmt.Errorf("asking whether %s may lease %s %s/%s: %w", t.Name, resource, namespace, name, err)
	}
	return ok, nil
}
