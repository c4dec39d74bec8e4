package broker

import (
	"slices"

	"github.com/example/egress-proxies-operator/tenant"
)

// The view by pool and tenant: what RBAC is asked about a proxy, and the
// pools a selector names.

// tenantProxy is what RBAC is asked about the proxy id.
func (v *View) tenantProxy(id string) (tenant.Proxy, bool) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	e, ok := v.entries[id]
	if !ok {
		return tenant.Proxy{}, false
	}
	return tenant.Proxy{Namespace: e.key.Namespace, Name: e.key.Name, Pool: e.attributes.m[attrPool]}, true
}

// poolsSelected are the pools (namespace/name) that have a member sel
// matches, serving or not: the autoscalers a refused lease concerns. The
// names come from the cluster, never from the request, so a client cannot
// make the store remember pools that do not exist; only the members of
// pools named sel's pool are looked at, not the fleet.
func (v *View) poolsSelected(sel Selector) []tenant.Proxy {
	if sel[attrPool] == "" {
		return nil
	}
	v.mu.RLock()
	defer v.mu.RUnlock()
	var pools []tenant.Proxy
	for id := range v.pools[sel[attrPool]] {
		e := v.entries[id]
		if !sel.Matches(e.attributes.m) {
			continue
		}
		if p := (tenant.Proxy{Namespace: e.key.Namespace, Pool: sel[attrPool]}); !slices.Contains(pools, p) {
			pools = append(pools, p)
		}
	}
	return pools
}

// poolMembers are the ids of the Proxies of one pool, serving or not.
func (v *View) poolMembers(namespace, pool string) []string {
	v.mu.RLock()
	defer v.mu.RUnlock()
	var ids []string
	for id := range v.pools[pool] {
		if v.entries[id].key.Namespace == namespace {
			ids = append(ids, id)
		}
	}
	return ids
}
