package v1alpha1

// Labels the operator writes on every provider instance it creates. They make
// an instance findable from its owner (Get by deterministic name is the fast
// path; these serve List for orphan GC) and tell a stale instance from a
// current one without reading anything else.
const (
	// LabelClusterID names the cluster whose operator created the instance,
	// so two clusters sharing a cloud project never collect each other's VMs.
	LabelClusterID = "crawl.example.com/cluster-id"
	// LabelOperatorID names the operator, among those of one cluster, that
	// created the instance: two releases (one per tenant, say) never list,
	// watch or collect each other's instances, even with provider instances
	// of the same name in the same cloud project.
	LabelOperatorID = "crawl.example.com/operator-id"
	// LabelOwnerNamespace is the namespace of the owning Proxy.
	LabelOwnerNamespace = "crawl.example.com/owner-namespace"
	// LabelOwnerName is the name of the owning Proxy.
	LabelOwnerName = "crawl.example.com/owner-name"
	// LabelOwnerUID is the UID of the owning Proxy; a Proxy deleted and
	// recreated under the same name does not adopt its predecessor's instance.
	LabelOwnerUID = "crawl.example.com/owner-uid"
	// LabelProvider is the name of the provider instance (gcp-eu, say) that
	// created the instance. Two provider instances of one type share a
	// project or a cluster; each lists, collects and deletes only its own.
	LabelProvider = "crawl.example.com/provider"
	// LabelSpecHash is the hash of the spec fields whose change forces a
	// replacement; an instance whose hash differs from the Proxy's is deleted.
	LabelSpecHash = "crawl.example.com/spec-hash"

	// LabelCloudInit marks a Secret the operator may read for cloud-init.
	// The manager's cache holds only Secrets with this label set to "true", so
	// an unlabelled Secret is invisible to the operator by design.
	LabelCloudInit = "crawl.example.com/cloud-init"

	// LabelCredentials marks a Secret holding proxy credentials. The
	// operator watches only Secrets with this label set to "true": the ones
	// it generates per provider instance, the record of what each Managed
	// instance was built with, and the ones Proxies name.
	LabelCredentials = "crawl.example.com/proxy-credentials"
	// LabelCredentialsRole tells the operator's own credentials Secrets
	// apart: "provider" (generated for a provider instance) or "instance"
	// (what one Managed instance was built with). A user's Secret has none.
	LabelCredentialsRole = "crawl.example.com/credentials-role"
)

// Finalizer keeps a Managed Proxy in the API until its provider instance is
// confirmed gone, so deleting a Proxy never leaks a VM. A Proxy whose
// instance the cluster's garbage collector deletes with it (a kubernetes
// provider's pod, owned by the Proxy) goes without one, unless its pool
// created it with one.
const Finalizer = "crawl.example.com/instance-cleanup"

// Condition types reported in status.conditions.
const (
	// ConditionProvisioned is True when the provider instance exists, runs
	// and matches the current spec.
	ConditionProvisioned = "Provisioned"
	// ConditionHealthy is True when probes through the proxy succeed, False
	// when they fail past the threshold, Unknown while the instance has no
	// verdict (AwaitingProbe) or does not serve (NotServing). The health
	// engine is its only writer, and writes it once the instance serves:
	// a new proxy has no Healthy condition until its first verdict.
	ConditionHealthy = "Healthy"
	// ConditionReady is True when the proxy is provisioned and healthy, i.e.
	// when discovery may hand it out (Proxy.ReadyCondition is the rule).
	ConditionReady = "Ready"
	// ConditionBanned is True when sites have blocked the proxy's current
	// instance on at least spec.banRecycling.hosts hosts within its window
	// (status.bannedInstance names the instance): a Managed proxy is then
	// replaced (a pool member by its pool). The ban judge is its only
	// writer.
	ConditionBanned = "Banned"
)

// Attribute keys the geo database fills from where it places a proxy's
// exit IP (status.geo), for the proxies whose spec.attributes do not
// declare them: discovery and the gateway select by them, and the geo
// controller checks a declared country or asn against the database.
// Country is the ISO code in lower case, as usernames select it.
const (
	AttrCountry = "country"
	AttrCity    = "city"
	AttrASN     = "asn"
	AttrASNOrg  = "asnOrg"
)

// The field managers of Proxy and ProxyPool status: each applies (server-side
// apply) only the fields it owns, so no two writers replace each other's.
const (
	// FieldManagerReconciler owns a Managed Proxy's phase, message,
	// address, instance record, observedGeneration and Provisioned
	// condition.
	FieldManagerReconciler = "egress-proxies-operator/proxy-reconciler"
	// FieldManagerHealth owns a Proxy's Healthy and Ready conditions,
	// lastHealthCheckTime, healthCheckedInstance, egressIP and canaries,
	// and an External Proxy's record too (Proxy.AsRecorded).
	FieldManagerHealth = "egress-proxies-operator/health-engine"
	// FieldManagerBans owns a Proxy's Banned condition and
	// bannedInstance (the ban judge).
	FieldManagerBans = "egress-proxies-operator/ban-judge"
	// FieldManagerGeo owns a Proxy's status.geo.
	FieldManagerGeo = "egress-proxies-operator/geo-controller"
	// FieldManagerPool owns a ProxyPool's status.
	FieldManagerPool = "egress-proxies-operator/pool-controller"
	// FieldManagerCrawlTarget owns a CrawlTarget's status.
	FieldManagerCrawlTarget = "egress-proxies-operator/crawltarget-controller"
)

// DefaultPort is the port a Proxy listens on when spec.port is not set:
// Squid's conventional port.
const DefaultPort int32 = 3128

// SpotParameters are the placement parameters that ask each provider type
// for a Spot instance, and their Spot value: a pool that may fall back to
// standard instances drops them (PlacementFallback.StandardForSpot).
var SpotParameters = map[string]string{"provisioningModel": "SPOT", "marketType": "spot"}

// IsSpot says whether a placement asks for a Spot instance.
func (p *Placement) IsSpot() bool {
	if p == nil {
		return false
	}
	for key, spot := range SpotParameters {
		if p.Parameters[key] == spot {
			return true
		}
	}
	return false
}

// DropSpot removes the parameters that ask for a Spot instance.
func (p *Placement) DropSpot() {
	if p == nil {
		return
	}
	for key, spot := range SpotParameters {
		if p.Parameters[key] == spot {
			delete(p.Parameters, key)
		}
	}
}
