package broker

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unique"

	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/credentials"
	"github.com/example/egress-proxies-operator/feed"
	"github.com/example/egress-proxies-operator/lease"
	"github.com/example/egress-proxies-operator/netid"
)

// HealthSource says whether a proxy passes its probes. The health engine
// answers on the leader; elsewhere known is false and the view falls back to
// the Healthy condition in the cached status.
type HealthSource interface {
	// Healthy is the verdict for the proxy as probed at address (host:port);
	// known is false when the source has none for that address (a new one
	// nobody has probed yet is never served on the old one's verdict).
	Healthy(key types.NamespacedName, address string) (healthy, known bool)
	// Generation changes whenever any verdict changes, so the view knows
	// when its cached candidate lists are stale.
	Generation() uint64
}

// entry is what discovery knows of one Proxy: enough to list and lease it
// without touching the Proxy object again.
type entry struct {
	key  types.NamespacedName
	id   string
	ip   string
	port int32
	// egress is where sites see its requests come from, when the health
	// engine learnt another address than ip (status.egressIP).
	egress string
	// ipv6Prefix is the IPv6 range it leaves from to IPv6 sites, and
	// sessionAddresses how many of its addresses its Squid leaves from,
	// one per gateway session (status).
	ipv6Prefix       string
	sessionAddresses int32
	// sender is the identity sites count its exit IP as (netid; the exit
	// IP's own string for an IPv4 one), and sender6 its IPv6 range's, for
	// sites reached over IPv6 ("": none): kept, so a lease's paces per
	// candidate parse no address.
	sender, sender6 string
	// lastIP is the last address it had (ip, or while it has none, the
	// one before): a new one means it moved.
	lastIP     string
	attributes *attributeSet // spec.attributes plus the derived ones, shared
	// serving: Ready phase with an address. statusReady: Ready by the
	// recorded status (Proxy.IsReady, the rule of the Ready condition).
	serving, statusReady bool
	// creds is where the proxy's credentials are (hasCreds false: none),
	// a handle because a fleet shares a few: 8 bytes per entry, not 64.
	creds    unique.Handle[credentials.Ref]
	hasCreds bool
}

// exitIP is where sites see e's requests come from (Proxy.ExitIP, from
// the fields the entry keeps).
func (e *entry) exitIP() string {
	if e.egress != "" {
		return e.egress
	}
	return e.ip
}

// View is the broker's in-memory index of Proxies, fed by the manager's
// informer: requests read it under a read lock and never reach the API
// server or deep-copy cached objects.
type View struct {
	health HealthSource
	// credentialsNamespace is the operator's, where Managed proxies'
	// credentials records are.
	credentialsNamespace string
	// onMove is told of a proxy that came back on a new address (the
	// server forgets its cooldowns and record there); nil: nobody.
	onMove func(id string)

	attributeSets attributeSets
	// clouds: provider instance -> its cloud (SetClouds).
	clouds map[string]string
	// identity is what a site counts as one sender (SetIdentity).
	identity netid.Rule

	mu         sync.RWMutex
	entries    map[string]*entry
	ids        []string // sorted, for stable listings
	generation uint64   // bumped by every change to entries
	// pools indexes the entries by their pool's name (every namespace), so
	// a pool's members are found without walking the fleet.
	pools map[string]map[string]struct{}
	// senders indexes the entries by their exit IP's identity (netid), and
	// a dual-stack one by its IPv6 range's too, so the proxies a site sees
	// as one sender are found without a walk.
	senders map[string]map[string]struct{}

	// cache holds the candidates per selector: matching 10,000 proxies'
	// attributes on every lease would dominate the cost of a lease.
	cacheMu sync.Mutex
	cache   map[string]cachedCandidates
	// candidatesVersion numbers every distinct candidate list built.
	candidatesVersion atomic.Uint64
}

type cachedCandidates struct {
	viewGen, healthGen uint64
	candidates         lease.Candidates
}

// SetClouds names the cloud each provider instance runs in (its type, for
// the clouds: gcp, aws), which Managed proxies carry as the attribute
// cloud. Call it before the view's informer starts.
func (v *View) SetClouds(clouds map[string]string) { v.clouds = clouds }

// SetIdentity sets what a site counts as one sender (--ipv6-identity-prefix).
// Call it before the view's informer starts.
func (v *View) SetIdentity(rule netid.Rule) { v.identity = rule }

// NewView returns an empty view; feed it with Handler. credentialsNamespace
// is the operator's namespace, where Managed proxies' credentials are kept.
func NewView(health HealthSource, credentialsNamespace string) *View {
	return &View{health: health, credentialsNamespace: credentialsNamespace, entries: map[string]*entry{}, pools: map[string]map[string]struct{}{}, senders: map[string]map[string]struct{}{}, cache: map[string]cachedCandidates{}}
}

// Handler is the informer event handler that keeps the view current.
func (v *View) Handler() toolscache.ResourceEventHandler {
	return feed.Handler(v.Upsert, func(p *crawlv1alpha1.Proxy) { v.Remove(p.Namespace + "/" + p.Name) })
}

// Upsert puts a Proxy into the view, or updates it: what the informer's
// handler does on an add or update, and how tests feed a view.
func (v *View) Upsert(p *crawlv1alpha1.Proxy) {
	e := entryOf(p, &v.attributeSets, v.clouds)
	ref, hasCreds := credentials.RefFor(p, v.credentialsNamespace)
	e.creds, e.hasCreds = unique.Make(ref), hasCreds
	e.lastIP = e.ip
	v.setSenders(e)
	v.mu.Lock()
	old, exists := v.entries[e.id]
	if !exists {
		i, _ := slices.BinarySearch(v.ids, e.id)
		v.ids = slices.Insert(v.ids, i, e.id)
	}
	if exists && e.ip == "" {
		e.lastIP = old.lastIP
	}
	moved := exists && old.lastIP != "" && e.ip != "" && e.ip != old.lastIP
	if exists {
		v.unindexLocked(old)
	}
	v.indexLocked(e)
	v.entries[e.id] = e
	v.generation++
	onMove := v.onMove
	v.mu.Unlock()
	if moved && onMove != nil {
		onMove(e.id)
	}
}

// Remove takes the Proxy id (namespace/name) out of the view: what the
// informer's handler does on a delete.
func (v *View) Remove(id string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	old, exists := v.entries[id]
	if !exists {
		return
	}
	v.unindexLocked(old)
	delete(v.entries, id)
	if i, found := slices.BinarySearch(v.ids, id); found {
		v.ids = slices.Delete(v.ids, i, i+1)
	}
	v.generation++
}

// indexLocked adds e to its pool's and its senders' indexes.
func (v *View) indexLocked(e *entry) {
	addToIndex(v.pools, e.attributes.m[attrPool], e.id)
	for _, s := range sendersOf(e) {
		addToIndex(v.senders, s, e.id)
	}
}

// unindexLocked drops e from its pool's and its senders' indexes.
func (v *View) unindexLocked(e *entry) {
	dropFromIndex(v.pools, e.attributes.m[attrPool], e.id)
	for _, s := range sendersOf(e) {
		dropFromIndex(v.senders, s, e.id)
	}
}

func addToIndex(index map[string]map[string]struct{}, key, id string) {
	if key == "" {
		return
	}
	members := index[key]
	if members == nil {
		members = map[string]struct{}{}
		index[key] = members
	}
	members[id] = struct{}{}
}

func dropFromIndex(index map[string]map[string]struct{}, key, id string) {
	if members := index[key]; members != nil {
		delete(members, id)
		if len(members) == 0 {
			delete(index, key)
		}
	}
}

// Derived attribute keys, reserved in spec.attributes by the CRD (zone,
// region and cloud for Managed proxies only: an External proxy declares
// its own).
const (
	attrProvider = "provider"
	attrMode     = "mode"
	attrZone     = "zone"
	attrRegion   = "region"
	// attrCloud is the network a Managed proxy leaves from, as sites block
	// whole clouds by ASN: its provider's type (gcp, aws).
	attrCloud = "cloud"
	// attrPool is the name of the ProxyPool a member belongs to, so
	// crawlers lease from a pool by name.
	attrPool = "pool"
)

func entryOf(p *crawlv1alpha1.Proxy, sets *attributeSets, clouds map[string]string) *entry {
	attrs := make(map[string]string, len(p.Spec.Attributes)+6)
	for k, val := range p.Spec.Attributes {
		attrs[k] = val
	}
	attrs[attrMode] = string(p.Spec.Mode)
	if pool := p.PoolName(); pool != "" {
		attrs[attrPool] = pool
	}
	if p.Spec.Provider != "" {
		attrs[attrProvider] = p.Spec.Provider
		if cloud := clouds[p.Spec.Provider]; cloud != "" {
			attrs[attrCloud] = cloud
		}
	}
	if g := p.Status.Geo; g != nil && g.IP == p.ExitIP() {
		// Where the geo database places the exit IP, for what the spec
		// does not declare (a declared value is the user's word; a
		// contradiction is in status.geo.mismatch).
		fill := func(key, value string) {
			if _, declared := attrs[key]; !declared && value != "" {
				attrs[key] = value
			}
		}
		fill(crawlv1alpha1.AttrCountry, strings.ToLower(g.Country))
		fill(crawlv1alpha1.AttrCity, g.City)
		if g.ASN != 0 {
			fill(crawlv1alpha1.AttrASN, strconv.FormatInt(g.ASN, 10))
		}
		fill(crawlv1alpha1.AttrASNOrg, g.ASNOrg)
	}
	if pl := p.Spec.Placement; pl != nil {
		if pl.Zone != "" {
			attrs[attrZone] = pl.Zone
		}
		if pl.Region != "" {
			attrs[attrRegion] = pl.Region
		}
	}
	return &entry{
		key:         types.NamespacedName{Namespace: p.Namespace, Name: p.Name},
		id:          p.Namespace + "/" + p.Name,
		ip:          p.Status.IP,
		egress:      p.Status.EgressIP,
		ipv6Prefix:  p.Status.IPv6Prefix,
		port:        p.Status.Port,
		attributes:  sets.intern(attrs),
		serving:     p.Serving(),
		statusReady: p.IsReady(),

		sessionAddresses: p.Status.SessionAddresses,
	}
}

// healthy: serving, and passing its probes.
func (v *View) healthy(e *entry) bool {
	if !e.serving {
		return false
	}
	if v.health != nil {
		if healthy, known := v.health.Healthy(e.key, net.JoinHostPort(e.ip, strconv.Itoa(int(e.port)))); known {
			return healthy
		}
	}
	return e.statusReady
}

// ProxyInfo is a proxy as the API shows it.
type ProxyInfo struct {
	ID   string `json:"id"`
	IP   string `json:"ip"`
	Port int32  `json:"port"`
	// URL carries the credentials when the API is authenticated and the
	// proxy has them: http://username:password@ip:port.
	URL string `json:"url"`
	// Username and Password are the proxy's credentials, for clients that
	// take them apart from the URL; only from an authenticated API.
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
	// CredentialsWithheld says why a proxy that requires credentials is
	// shown without them.
	CredentialsWithheld string            `json:"credentialsWithheld,omitempty"`
	Attributes          map[string]string `json:"attributes"`
	// ExitIP is the address sites see its requests come from: the
	// proxy's IP, or the egress IP the health engine learnt when another
	// (NAT, a provider's gateway).
	ExitIP string `json:"exitIP,omitempty"`
	// IPv6Prefix is the IPv6 range it leaves from to sites that have an
	// IPv6 address (sites count its /64 as one sender), and
	// SessionAddresses how many of its addresses it leaves from: a
	// CONNECT or request with the X-Egress-Session-Address header i
	// (0 to SessionAddresses-1) leaves from the range's first address
	// plus i+1.
	IPv6Prefix       string `json:"ipv6Prefix,omitempty"`
	SessionAddresses int32  `json:"sessionAddresses,omitempty"`
	Healthy          bool   `json:"healthy"`
	ActiveLeases     int    `json:"activeLeases"`

	creds    credentials.Ref
	hasCreds bool
}

func (v *View) info(e *entry, leases int) ProxyInfo {
	info := ProxyInfo{ID: e.id, IP: e.ip, Port: e.port, Attributes: e.attributes.m, Healthy: v.healthy(e), ActiveLeases: leases,
		ExitIP: e.exitIP(), IPv6Prefix: e.ipv6Prefix, SessionAddresses: e.sessionAddresses, creds: e.creds.Value(), hasCreds: e.hasCreds}
	if e.ip != "" && e.port != 0 {
		info.URL = "http://" + net.JoinHostPort(e.ip, strconv.Itoa(int(e.port)))
	}
	return info
}

// List returns the proxies matching sel (and, when healthyOnly, healthy),
// sorted by id, without their lease counts (the server adds them from the
// store).
func (v *View) List(sel Selector, healthyOnly *bool) []ProxyInfo {
	v.mu.RLock()
	defer v.mu.RUnlock()
	out := []ProxyInfo{}
	for _, id := range v.ids {
		e := v.entries[id]
		if !sel.Matches(e.attributes.m) {
			continue
		}
		info := v.info(e, 0)
		if healthyOnly != nil && info.Healthy != *healthyOnly {
			continue
		}
		out = append(out, info)
	}
	return out
}

// candidates returns the healthy proxies matching sel. The list is cached
// per selector until the view or any health verdict changes, and its
// Version moves only when the ids themselves do, so a store's index of it
// survives verdicts that change nothing here. Callers must not modify it.
func (v *View) candidates(sel Selector) lease.Candidates {
	var healthGen uint64
	if v.health != nil {
		healthGen = v.health.Generation()
	}
	key := sel.key()
	v.mu.RLock()
	defer v.mu.RUnlock()
	v.cacheMu.Lock()
	c, ok := v.cache[key]
	v.cacheMu.Unlock()
	if ok && c.viewGen == v.generation && c.healthGen == healthGen {
		return c.candidates
	}
	var ids []string
	for _, id := range v.ids {
		e := v.entries[id]
		if sel.Matches(e.attributes.m) && v.healthy(e) {
			ids = append(ids, id)
		}
	}
	fresh := lease.Candidates{Key: key, IDs: ids}
	if ok && slices.Equal(c.candidates.IDs, ids) {
		fresh.Version = c.candidates.Version
	} else {
		fresh.Version = v.candidatesVersion.Add(1)
	}
	v.cacheMu.Lock()
	if len(v.cache) >= maxCachedSelectors {
		clear(v.cache) // selectors are few in practice; bound them anyway
	}
	v.cache[key] = cachedCandidates{viewGen: v.generation, healthGen: healthGen, candidates: fresh}
	v.cacheMu.Unlock()
	return fresh
}

// maxCachedSelectors bounds the candidate cache.
const maxCachedSelectors = 1024

// Unavailable says why a leased proxy can no longer serve its lease (it
// was deleted, or is not healthy), or "" when it can.
func (v *View) Unavailable(id string) string {
	v.mu.RLock()
	defer v.mu.RUnlock()
	e, ok := v.entries[id]
	switch {
	case !ok:
		return fmt.Sprintf("proxy %s no longer exists", id)
	case !e.serving:
		return fmt.Sprintf("proxy %s is not serving (being replaced or deleted)", id)
	case !v.healthy(e):
		return fmt.Sprintf("proxy %s is not healthy", id)
	}
	return ""
}

// state says whether a proxy exists, serves (is not being replaced or
// deleted) and is healthy.
func (v *View) state(id string) (exists, serving, healthy bool) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	e, ok := v.entries[id]
	if !ok {
		return false, false, false
	}
	return true, e.serving, v.healthy(e)
}

// setSenders records the identities sites count e's requests under: its
// exit IP's, and its IPv6 range's when it has one.
func (v *View) setSenders(e *entry) {
	ip := e.exitIP()
	e.sender = v.identity.Of(ip)
	if e.sender == ip {
		e.sender = ip // an IPv4 exit IP is its own sender: share its string
	}
	if e.ipv6Prefix != "" {
		e.sender6 = v.identity.Of(netid.RangeAddr(e.ipv6Prefix))
	}
}

// sendersOf are the identities e is indexed under.
func sendersOf(e *entry) []string {
	if e.sender6 == "" || e.sender6 == e.sender {
		return []string{e.sender}
	}
	return []string{e.sender, e.sender6}
}

// sender is the identity sites count proxy id's requests under (netid:
// its exit IP, or the /64 of an IPv6 one); "" for no exit IP known. A
// dual-stack proxy reaches a site over IPv6 from its range, so overIPv6
// (asked only of such a proxy) says whether the site is reached so.
// Cheap, for a lease's paces per candidate.
func (v *View) sender(id string, overIPv6 func() bool) string {
	v.mu.RLock()
	e, ok := v.entries[id]
	var sender, sender6 string
	if ok {
		sender, sender6 = e.sender, e.sender6
	}
	v.mu.RUnlock()
	if sender6 != "" && overIPv6() {
		return sender6
	}
	return sender
}

// network is the range a site that counts by network sees proxy id in:
// the /24 of its IPv4 exit IP, the identity's network of an IPv6 one (its
// range's for a dual-stack proxy's site reached over IPv6); "" for no
// exit IP known.
func (v *View) network(id string, overIPv6 func() bool) string {
	v.mu.RLock()
	e, ok := v.entries[id]
	var ip, range6 string
	if ok {
		ip, range6 = e.exitIP(), e.ipv6Prefix
	}
	v.mu.RUnlock()
	if range6 != "" && overIPv6() {
		ip = netid.RangeAddr(range6)
	}
	return v.identity.Network(ip)
}

// SameSender is every other proxy sites see as the same sender as proxy
// id (sender: its exit IP's identity, or its IPv6 range's for a site
// reached over IPv6), at most limit of them in no order: the proxies a
// site's block of id blocks too.
func (v *View) SameSender(id string, overIPv6 func() bool, limit int) []string {
	sender := v.sender(id, overIPv6)
	v.mu.RLock()
	defer v.mu.RUnlock()
	var out []string
	for other := range v.senders[sender] {
		if len(out) == limit {
			break
		}
		if other != id {
			out = append(out, other)
		}
	}
	return out
}

// Lookup returns a proxy by id; ok is false once it is deleted.
func (v *View) Lookup(id string, leases int) (ProxyInfo, bool) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	e, ok := v.entries[id]
	if !ok {
		return ProxyInfo{}, false
	}
	return v.info(e, leases), true
}
