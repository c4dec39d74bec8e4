// Package fakecompute is an in-process fake of the Compute Engine REST API
// subset the gcp provider uses (instances insert/get/delete/list/
// aggregatedList, zone operations get/wait, firewalls insert/get/patch/
// delete/list), with the Secret Manager calls it makes for VMs' lease keys
// and the metadata server's token a VM reads them with. The real client
// libraries talk to
// it over HTTP, so tests exercise the real wire protocol: JSON bodies,
// requestId de-duplication, error payloads, lost replies. VMs move
// PROVISIONING -> STAGING -> RUNNING on a clock the test controls. It is
// test support only; production code must never import it.
package fakecompute

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"net/http"
	"net/http/httptest"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"k8s.io/utils/clock"
)

// Timings of a VM's life on the fake clock.
type Timings struct {
	// Provisioning and Staging are how long a new VM spends in each state
	// before RUNNING.
	Provisioning, Staging time.Duration
	// Stopping is how long a deleted VM stays STOPPING before it is gone.
	Stopping time.Duration
}

// Fault is an injected failure for the next matching requests.
type Fault struct {
	// Method is one of insert, get, delete, list, aggregatedList; empty
	// matches any.
	Method string
	// Status, when set, is returned instead of serving the request, with
	// Reason and Message in the error body.
	Status  int
	Reason  string
	Message string
	// LoseReply serves the request, then drops the connection before any
	// reply: the insert happens, the client never hears of it.
	LoseReply bool
	// OperationError, on insert, accepts the request but fails its
	// operation with this code (QUOTA_EXCEEDED, say): no VM is created.
	OperationError string
	// Times is how many requests it affects; 0 means 1.
	Times int
	// Zone, when set, limits the fault to the requests for that zone (a
	// zone out of capacity).
	Zone string
}

// Server is a fake Compute Engine API.
type Server struct {
	// URL is the endpoint to give the client (option.WithEndpoint).
	URL string

	clock   clock.PassiveClock
	timings Timings
	srv     *httptest.Server

	mu            sync.Mutex
	vms           map[string]*vm // by zone/name
	ops           map[string]*computepb.Operation
	requestIDs    map[string]string // requestId -> operation name
	faults        []Fault
	nextID        uint64
	created       int
	stuckStopping bool
	requests      map[string]int
	// attempted: zone -> the VMs an insert asked for there.
	attempted map[string]map[string]bool
	firewalls map[firewallKey]*computepb.Firewall
	// reuse: the NAT address of a VM that went goes to the next VM
	// created, once (as GCE hands a new VM an ephemeral IP someone
	// released): released are those waiting, reused those handed out
	// again already.
	reuse    bool
	released []string
	reused   map[string]bool
	// secrets are Secret Manager's, by name; vmTokens the tokens the
	// metadata server issued.
	secrets  map[string]*secret
	vmTokens map[string]bool
}

// ReuseReleasedIPs makes the fake hand the address of a VM that is gone to
// the next VM it creates, each address at most once more; false stops it
// and forgets the addresses waiting.
func (s *Server) ReuseReleasedIPs(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reuse, s.released = on, nil
	if s.reused == nil {
		s.reused = map[string]bool{}
	}
}

// goneLocked forgets the VM at key, its address released.
func (s *Server) goneLocked(key string) {
	v, ok := s.vms[key]
	if !ok {
		return
	}
	delete(s.vms, key)
	if s.reuse && !s.reused[v.natIP] {
		s.released = append(s.released, v.natIP)
	}
}

type vm struct {
	res          *computepb.Instance
	createdAt    time.Time
	deleteAt     time.Time // zero unless being deleted
	statusPinned bool      // SetStatus fixed it
	pinnedStatus string
	natIP        string
	// ipv6 is the first address of its external /96, for an interface
	// that asked for one ("" otherwise).
	ipv6          string
	deleteStarted bool
}

// New starts a fake on a loopback port; it stops when the test ends (call
// Close).
func New(clk clock.PassiveClock, timings Timings) *Server {
	s := &Server{
		clock: clk, timings: timings,
		vms: map[string]*vm{}, ops: map[string]*computepb.Operation{}, requestIDs: map[string]string{},
		requests: map[string]int{}, firewalls: map[firewallKey]*computepb.Firewall{}, attempted: map[string]map[string]bool{},
		secrets: map[string]*secret{}, vmTokens: map[string]bool{},
	}
	mux := http.NewServeMux()
	const zone = "/compute/v1/projects/{project}/zones/{zone}"
	mux.HandleFunc("POST "+zone+"/instances", s.insert)
	mux.HandleFunc("GET "+zone+"/instances", s.list)
	mux.HandleFunc("GET "+zone+"/instances/{name}", s.get)
	mux.HandleFunc("DELETE "+zone+"/instances/{name}", s.delete)
	mux.HandleFunc("GET /compute/v1/projects/{project}/aggregated/instances", s.aggregatedList)
	mux.HandleFunc("GET "+zone+"/operations/{op}", s.getOperation)
	mux.HandleFunc("POST "+zone+"/operations/{op}/wait", s.getOperation)
	s.registerFirewalls(mux)
	s.registerSecrets(mux)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "notFound", fmt.Sprintf("fakecompute does not serve %s %s", r.Method, r.URL.Path))
	})
	s.srv = httptest.NewServer(mux)
	s.URL = s.srv.URL
	return s
}

// Close stops the server.
func (s *Server) Close() { s.srv.Close() }

// Inject queues a fault.
func (s *Server) Inject(f Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f.Times == 0 {
		f.Times = 1
	}
	s.faults = append(s.faults, f)
}

// StickInStopping makes deleted VMs stay STOPPING until called with false.
func (s *Server) StickInStopping(stuck bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stuckStopping = stuck
}

// SetStatus pins a VM's status (TERMINATED, say), as if GCE changed it:
// a VM stopped behind the operator's back, or preempted.
func (s *Server) SetStatus(zone, name, status string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v, ok := s.vms[zone+"/"+name]; ok {
		v.statusPinned, v.pinnedStatus = true, status
	}
}

// Remove deletes a VM at once, as someone with the console might, or as GCE
// does with a preempted Spot VM whose termination action is DELETE. It says
// whether the VM existed.
func (s *Server) Remove(zone, name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.vms[zone+"/"+name]
	s.goneLocked(zone + "/" + name)
	return ok
}

// Attempted counts the distinct VMs an insert asked for in zone, created
// or refused (a retried insert of the same VM counts once).
func (s *Server) Attempted(zone string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.attempted[zone])
}

// Created counts the VMs ever created (a de-duplicated insert creates none).
func (s *Server) Created() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.created
}

// PendingFaults counts the injected faults not yet used up, so a test can
// check its faults really happened.
func (s *Server) PendingFaults() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, f := range s.faults {
		n += f.Times
	}
	return n
}

// Requests counts the requests served per method.
func (s *Server) Requests(method string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests[method]
}

// Instances returns copies of every VM that exists now, sorted by zone and
// name.
func (s *Server) Instances() []*computepb.Instance {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.advanceLocked()
	keys := make([]string, 0, len(s.vms))
	for k := range s.vms {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]*computepb.Instance, 0, len(keys))
	for _, k := range keys {
		out = append(out, proto.CloneOf(s.vms[k].res))
	}
	return out
}

// PutInstance adds a VM directly (an orphan left by a crash, another
// cluster's VM), created at createdAt and RUNNING.
func (s *Server) PutInstance(zone string, res *computepb.Instance, createdAt time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.addLocked("any", zone, proto.CloneOf(res), createdAt)
}

// --- state ---

func (s *Server) addLocked(project, zone string, res *computepb.Instance, createdAt time.Time) {
	s.nextID++
	s.created++
	zoneURL := fmt.Sprintf("https://www.googleapis.com/compute/v1/projects/%s/zones/%s", project, zone)
	res.Id = proto.Uint64(s.nextID)
	res.Zone = proto.String(zoneURL)
	res.SelfLink = proto.String(zoneURL + "/instances/" + res.GetName())
	res.CreationTimestamp = proto.String(createdAt.Format(time.RFC3339Nano))
	// Distinct addresses, all in the loopback range: never a real host.
	ip := fmt.Sprintf("127.2.%d.%d", 1+s.nextID/250, 1+s.nextID%250)
	if s.reuse && len(s.released) > 0 {
		ip, s.released = s.released[0], s.released[1:]
		s.reused[ip] = true
	}
	v := &vm{res: res, createdAt: createdAt, natIP: ip}
	for _, iface := range res.GetNetworkInterfaces() {
		if len(iface.GetIpv6AccessConfigs()) > 0 {
			// A /96 of the subnetwork's /64 (one per region, as GCE's
			// subnetworks are regional), in the documentation range:
			// never a real host.
			v.ipv6 = fmt.Sprintf("2001:db8:6:%x:0:%x::", regionIndex(zone), s.nextID)
		}
	}
	s.vms[zone+"/"+res.GetName()] = v
	s.advanceLocked()
}

// advanceLocked brings every VM's status up to the clock's now, removing
// VMs whose deletion finished.
func (s *Server) advanceLocked() {
	now := s.clock.Now()
	for key, v := range s.vms {
		status := "RUNNING"
		age := now.Sub(v.createdAt)
		switch {
		case v.deleteStarted && !s.stuckStopping && !now.Before(v.deleteAt):
			s.goneLocked(key)
			continue
		case v.deleteStarted:
			status = "STOPPING"
		case v.statusPinned:
			status = v.pinnedStatus
		case age < s.timings.Provisioning:
			status = "PROVISIONING"
		case age < s.timings.Provisioning+s.timings.Staging:
			status = "STAGING"
		}
		v.res.Status = proto.String(status)
		if status != "PROVISIONING" {
			for _, iface := range v.res.GetNetworkInterfaces() {
				for _, ac := range iface.GetAccessConfigs() {
					ac.NatIP = proto.String(v.natIP)
				}
				for _, ac := range iface.GetIpv6AccessConfigs() {
					ac.ExternalIpv6, ac.ExternalIpv6PrefixLength = proto.String(v.ipv6), proto.Int32(96)
				}
			}
		}
	}
}

func (s *Server) newOperationLocked(project, zone, opType, target string) *computepb.Operation {
	s.nextID++
	name := fmt.Sprintf("operation-%d", s.nextID)
	zoneURL := fmt.Sprintf("https://www.googleapis.com/compute/v1/projects/%s/zones/%s", project, zone)
	op := &computepb.Operation{
		Name: proto.String(name), Id: proto.Uint64(s.nextID), Zone: proto.String(zoneURL),
		OperationType: proto.String(opType), TargetLink: proto.String(zoneURL + "/instances/" + target),
		Status: computepb.Operation_RUNNING.Enum(), SelfLink: proto.String(zoneURL + "/operations/" + name),
	}
	s.ops[name] = op
	return op
}

var (
	gceName       = regexp.MustCompile(`^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$`)
	gceLabelKey   = regexp.MustCompile(`^[a-z][-_a-z0-9]{0,62}$`)
	gceLabelValue = regexp.MustCompile(`^[-_a-z0-9]{0,63}$`)
)

// validateInsert applies the checks GCE makes that the provider could get
// wrong; the message is what GCE would say.
func validateInsert(res *computepb.Instance) string {
	switch {
	case !gceName.MatchString(res.GetName()):
		return fmt.Sprintf("Invalid value for field 'resource.name': '%s'. Must be a match of regex '(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'", res.GetName())
	case res.GetMachineType() == "":
		return "Invalid value for field 'resource.machineType': ''. Machine type is required."
	case len(res.GetDisks()) == 0 || !res.GetDisks()[0].GetBoot() || res.GetDisks()[0].GetInitializeParams().GetSourceImage() == "":
		return "Invalid value for field 'resource.disks': a boot disk with a source image is required."
	case len(res.GetNetworkInterfaces()) == 0:
		return "Invalid value for field 'resource.networkInterfaces': at least one is required."
	}
	for _, iface := range res.GetNetworkInterfaces() {
		for _, ac := range iface.GetIpv6AccessConfigs() {
			switch {
			case iface.GetStackType() != "IPV4_IPV6":
				return "Invalid value for field 'resource.networkInterfaces[0].ipv6AccessConfigs': an IPv6 access config needs stackType IPV4_IPV6."
			case ac.GetType() != "DIRECT_IPV6":
				return fmt.Sprintf("Invalid value for field 'resource.networkInterfaces[0].ipv6AccessConfigs[0].type': '%s'. Must be DIRECT_IPV6.", ac.GetType())
			case ac.GetNetworkTier() != "" && ac.GetNetworkTier() != "PREMIUM":
				return fmt.Sprintf("Invalid value for field 'resource.networkInterfaces[0].ipv6AccessConfigs[0].networkTier': '%s'. External IPv6 is only in the PREMIUM tier.", ac.GetNetworkTier())
			}
		}
	}
	for k, v := range res.GetLabels() {
		if !gceLabelKey.MatchString(k) || !gceLabelValue.MatchString(v) {
			return fmt.Sprintf("Invalid value for field 'resource.labels': '%s=%s'.", k, v)
		}
	}
	return ""
}

// filterClause matches one clause of the filters the provider sends:
// `name = "x"` and `labels.key = "value"`, alone or as parenthesised clauses
// joined by AND (GCE's syntax; a space between clauses means AND as well).
var (
	filterClause   = regexp.MustCompile(`^\s*([a-zA-Z.\-_]+)\s*=\s*"([^"]*)"\s*$`)
	filterSplitter = regexp.MustCompile(`\)\s*(?:AND\s*)?\(`)
)

func parseFilter(filter string) (func(*computepb.Instance) bool, error) {
	if strings.TrimSpace(filter) == "" {
		return func(*computepb.Instance) bool { return true }, nil
	}
	clauses := []string{filter}
	if trimmed := strings.TrimSpace(filter); strings.HasPrefix(trimmed, "(") && strings.HasSuffix(trimmed, ")") {
		clauses = filterSplitter.Split(trimmed[1:len(trimmed)-1], -1)
	}
	var matchers []func(*computepb.Instance) bool
	for _, clause := range clauses {
		m, err := parseClause(clause)
		if err != nil {
			return nil, err
		}
		matchers = append(matchers, m)
	}
	return func(res *computepb.Instance) bool {
		for _, m := range matchers {
			if !m(res) {
				return false
			}
		}
		return true
	}, nil
}

func parseClause(clause string) (func(*computepb.Instance) bool, error) {
	m := filterClause.FindStringSubmatch(clause)
	if m == nil {
		return nil, fmt.Errorf("Invalid value for field 'filter': '%s'. fakecompute understands `field = \"value\"` clauses only", clause) //nolint:staticcheck // GCE's wording
	}
	field, value := m[1], m[2]
	switch {
	case field == "name":
		return func(res *computepb.Instance) bool { return res.GetName() == value }, nil
	case strings.HasPrefix(field, "labels."):
		key := strings.TrimPrefix(field, "labels.")
		return func(res *computepb.Instance) bool { return res.GetLabels()[key] == value }, nil
	}
	return nil, fmt.Errorf("Invalid value for field 'filter': unsupported field %q", field) //nolint:staticcheck // GCE's wording
}

// --- wire helpers ---

func writeProto(w http.ResponseWriter, m proto.Message) {
	data, err := protojson.Marshal(m)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "internal", err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(data)
}

// writeError writes GCE's error envelope, which googleapi.CheckResponse
// decodes into a *googleapi.Error.
func writeError(w http.ResponseWriter, status int, reason, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{
		"code": status, "message": message,
		"errors": []map[string]string{{"domain": "global", "reason": reason, "message": message}},
	}})
}

func dropConnection(w http.ResponseWriter) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		panic("fakecompute: the response writer cannot be hijacked")
	}
	conn, _, err := hj.Hijack()
	if err == nil {
		_ = conn.Close()
	}
}

func lastSegment(url string) string { return url[strings.LastIndex(url, "/")+1:] }

func orDefault(s, fallback string) string {
	if s == "" {
		return fallback
	}
	return s
}

// regionIndex numbers a zone's region (us-central1 of us-central1-a), so
// that the VMs of one region share a subnetwork's /64.
func regionIndex(zone string) uint32 {
	region := zone
	if i := strings.LastIndex(zone, "-"); i > 0 {
		region = zone[:i]
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(region))
	return h.Sum32() & 0xffff
}
