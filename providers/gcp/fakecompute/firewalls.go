package fakecompute

import (
	"fmt"
	"io"
	"net/http"
	"sort"

	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// Firewalls are the project's firewall rules, sorted by name: what a test
// asserts on.
func (s *Server) Firewalls(project string) []*computepb.Firewall {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*computepb.Firewall
	for key, fw := range s.firewalls {
		if key.project == project {
			out = append(out, proto.CloneOf(fw))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].GetName() < out[j].GetName() })
	return out
}

// PutFirewall stores a rule as is, as one made by someone else would be.
func (s *Server) PutFirewall(project string, fw *computepb.Firewall) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.storeFirewallLocked(project, proto.CloneOf(fw))
}

type firewallKey struct{ project, name string }

func (s *Server) registerFirewalls(mux *http.ServeMux) {
	const global = "/compute/v1/projects/{project}/global"
	mux.HandleFunc("POST "+global+"/firewalls", s.insertFirewall)
	mux.HandleFunc("GET "+global+"/firewalls", s.listFirewalls)
	mux.HandleFunc("GET "+global+"/firewalls/{name}", s.getFirewall)
	mux.HandleFunc("PATCH "+global+"/firewalls/{name}", s.patchFirewall)
	mux.HandleFunc("DELETE "+global+"/firewalls/{name}", s.deleteFirewall)
	mux.HandleFunc("GET "+global+"/operations/{op}", s.getOperation)
}

func readFirewall(w http.ResponseWriter, r *http.Request) (*computepb.Firewall, bool) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid", err.Error())
		return nil, false
	}
	fw := &computepb.Firewall{}
	if err := protojson.Unmarshal(body, fw); err != nil {
		writeError(w, http.StatusBadRequest, "invalid", "Invalid JSON payload: "+err.Error())
		return nil, false
	}
	return fw, true
}

func (s *Server) insertFirewall(w http.ResponseWriter, r *http.Request) {
	if _, ok := s.begin(w, "firewalls.insert"); !ok {
		return
	}
	fw, ok := readFirewall(w, r)
	if !ok {
		return
	}
	if !gceName.MatchString(fw.GetName()) {
		writeError(w, http.StatusBadRequest, "invalid", fmt.Sprintf("Invalid value for field 'resource.name': '%s'.", fw.GetName()))
		return
	}
	project := r.PathValue("project")
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, exists := s.firewalls[firewallKey{project, fw.GetName()}]; exists {
		writeError(w, http.StatusConflict, "alreadyExists", fmt.Sprintf("The resource 'projects/%s/global/firewalls/%s' already exists", project, fw.GetName()))
		return
	}
	s.storeFirewallLocked(project, fw)
	writeProto(w, s.globalOperationLocked(project, "insert", fw.GetName()))
}

// storeFirewallLocked stores fw with what GCE fills in, including its most
// dangerous default: an ingress rule with neither source ranges nor source
// tags admits the whole internet.
func (s *Server) storeFirewallLocked(project string, fw *computepb.Firewall) {
	s.nextID++
	fw.Id = proto.Uint64(s.nextID)
	fw.SelfLink = proto.String(fmt.Sprintf("https://www.googleapis.com/compute/v1/projects/%s/global/firewalls/%s", project, fw.GetName()))
	if fw.Network == nil || lastSegment(fw.GetNetwork()) == fw.GetNetwork() {
		fw.Network = proto.String(fmt.Sprintf("https://www.googleapis.com/compute/v1/projects/%s/global/networks/%s", project, orDefault(lastSegment(fw.GetNetwork()), "default")))
	}
	if fw.Direction == nil {
		fw.Direction = proto.String(computepb.Firewall_INGRESS.String())
	}
	if fw.Priority == nil {
		fw.Priority = proto.Int32(1000)
	}
	if fw.GetDirection() == computepb.Firewall_INGRESS.String() && len(fw.GetSourceRanges()) == 0 && len(fw.GetSourceTags()) == 0 {
		fw.SourceRanges = []string{"0.0.0.0/0"}
	}
	s.firewalls[firewallKey{project, fw.GetName()}] = fw
}

func (s *Server) getFirewall(w http.ResponseWriter, r *http.Request) {
	if _, ok := s.begin(w, "firewalls.get"); !ok {
		return
	}
	s.mu.Lock()
	fw, ok := s.firewalls[firewallKey{r.PathValue("project"), r.PathValue("name")}]
	if ok {
		fw = proto.CloneOf(fw)
	}
	s.mu.Unlock()
	if !ok {
		firewallNotFound(w, r.PathValue("project"), r.PathValue("name"))
		return
	}
	writeProto(w, fw)
}

// patchFirewall merges the fields the body sets, as GCE's PATCH does.
func (s *Server) patchFirewall(w http.ResponseWriter, r *http.Request) {
	if _, ok := s.begin(w, "firewalls.patch"); !ok {
		return
	}
	patch, ok := readFirewall(w, r)
	if !ok {
		return
	}
	project, name := r.PathValue("project"), r.PathValue("name")
	s.mu.Lock()
	defer s.mu.Unlock()
	fw, exists := s.firewalls[firewallKey{project, name}]
	if !exists {
		firewallNotFound(w, project, name)
		return
	}
	if patch.SourceRanges != nil {
		fw.SourceRanges = nil // lists are replaced, not appended to
	}
	if patch.TargetTags != nil {
		fw.TargetTags = nil
	}
	if patch.Allowed != nil {
		fw.Allowed = nil
	}
	proto.Merge(fw, patch)
	writeProto(w, s.globalOperationLocked(project, "patch", name))
}

func (s *Server) deleteFirewall(w http.ResponseWriter, r *http.Request) {
	if _, ok := s.begin(w, "firewalls.delete"); !ok {
		return
	}
	project, name := r.PathValue("project"), r.PathValue("name")
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, exists := s.firewalls[firewallKey{project, name}]; !exists {
		firewallNotFound(w, project, name)
		return
	}
	delete(s.firewalls, firewallKey{project, name})
	writeProto(w, s.globalOperationLocked(project, "delete", name))
}

func (s *Server) listFirewalls(w http.ResponseWriter, r *http.Request) {
	if _, ok := s.begin(w, "firewalls.list"); !ok {
		return
	}
	all := s.Firewalls(r.PathValue("project"))
	writeProto(w, &computepb.FirewallList{Items: all})
}

// globalOperationLocked is a finished global operation: firewall changes
// take effect at once here.
func (s *Server) globalOperationLocked(project, opType, target string) *computepb.Operation {
	s.nextID++
	name := fmt.Sprintf("operation-%d", s.nextID)
	base := fmt.Sprintf("https://www.googleapis.com/compute/v1/projects/%s/global", project)
	op := &computepb.Operation{
		Name: proto.String(name), Id: proto.Uint64(s.nextID), OperationType: proto.String(opType),
		TargetLink: proto.String(base + "/firewalls/" + target), Status: computepb.Operation_DONE.Enum(),
		SelfLink: proto.String(base + "/operations/" + name),
	}
	s.ops[name] = op
	return op
}

// firewallNotFound is GCE's 404 for a rule.
func firewallNotFound(w http.ResponseWriter, project, name string) {
	writeError(w, http.StatusNotFound, "notFound", fmt.Sprintf("The resource 'projects/%s/global/firewalls/%s' was not found", project, name))
}
