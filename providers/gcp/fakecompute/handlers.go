package fakecompute

import (
	"fmt"
	"io"
	"net/http"

	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// The instance and operation handlers, each serving one call of the
// Compute REST API as the client library sends it.

func (s *Server) insert(w http.ResponseWriter, r *http.Request) {
	f, ok := s.beginIn(w, "insert", r.PathValue("zone"))
	if !ok {
		return
	}
	project, zone := r.PathValue("project"), r.PathValue("zone")
	body, err := io.ReadAll(r.Body)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid", err.Error())
		return
	}
	res := &computepb.Instance{}
	if err := protojson.Unmarshal(body, res); err != nil {
		writeError(w, http.StatusBadRequest, "invalid", "Invalid JSON payload: "+err.Error())
		return
	}
	s.mu.Lock()
	if s.attempted[zone] == nil {
		s.attempted[zone] = map[string]bool{}
	}
	s.attempted[zone][res.GetName()] = true
	op, status, reason, msg := s.insertLocked(project, zone, r.URL.Query().Get("requestId"), res, f)
	s.mu.Unlock()
	if status != 0 {
		writeError(w, status, reason, msg)
		return
	}
	if f != nil && f.LoseReply {
		dropConnection(w)
		return
	}
	writeProto(w, op)
}

func (s *Server) insertLocked(project, zone, requestID string, res *computepb.Instance, f *Fault) (*computepb.Operation, int, string, string) {
	if requestID != "" {
		if opName, seen := s.requestIDs[requestID]; seen {
			// GCE answers a repeated requestId with the original operation
			// as it is now, whatever became of its VM since; here, as
			// getOperation says, that is DONE.
			op := proto.CloneOf(s.ops[opName])
			op.Status = computepb.Operation_DONE.Enum()
			return op, 0, "", ""
		}
	}
	if err := validateInsert(res); err != "" {
		return nil, http.StatusBadRequest, "invalid", err
	}
	if _, exists := s.vms[zone+"/"+res.GetName()]; exists {
		return nil, http.StatusConflict, "alreadyExists",
			fmt.Sprintf("The resource 'projects/%s/zones/%s/instances/%s' already exists", project, zone, res.GetName())
	}
	op := s.newOperationLocked(project, zone, "insert", res.GetName())
	if f != nil && f.OperationError != "" {
		op.Status = computepb.Operation_DONE.Enum()
		op.Error = &computepb.Error{Errors: []*computepb.Errors{{
			Code: proto.String(f.OperationError), Message: proto.String(orDefault(f.Message, "operation failed")),
		}}}
	} else {
		s.addLocked(project, zone, res, s.clock.Now())
	}
	if requestID != "" {
		s.requestIDs[requestID] = op.GetName()
	}
	return op, 0, "", ""
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) {
	if _, ok := s.begin(w, "get"); !ok {
		return
	}
	s.mu.Lock()
	s.advanceLocked()
	v, ok := s.vms[r.PathValue("zone")+"/"+r.PathValue("name")]
	var res *computepb.Instance
	if ok {
		res = proto.CloneOf(v.res)
	}
	s.mu.Unlock()
	if !ok {
		writeError(w, http.StatusNotFound, "notFound", fmt.Sprintf("The resource 'projects/%s/zones/%s/instances/%s' was not found",
			r.PathValue("project"), r.PathValue("zone"), r.PathValue("name")))
		return
	}
	writeProto(w, res)
}

func (s *Server) delete(w http.ResponseWriter, r *http.Request) {
	f, ok := s.begin(w, "delete")
	if !ok {
		return
	}
	project, zone, name := r.PathValue("project"), r.PathValue("zone"), r.PathValue("name")
	s.mu.Lock()
	s.advanceLocked()
	v, exists := s.vms[zone+"/"+name]
	var op *computepb.Operation
	if exists {
		if !v.deleteStarted {
			v.deleteStarted, v.deleteAt = true, s.clock.Now().Add(s.timings.Stopping)
		}
		s.advanceLocked()
		op = s.newOperationLocked(project, zone, "delete", name)
	}
	s.mu.Unlock()
	if !exists {
		writeError(w, http.StatusNotFound, "notFound", fmt.Sprintf("The resource 'projects/%s/zones/%s/instances/%s' was not found", project, zone, name))
		return
	}
	if f != nil && f.LoseReply {
		dropConnection(w)
		return
	}
	writeProto(w, op)
}

func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	if _, ok := s.begin(w, "list"); !ok {
		return
	}
	match, err := parseFilter(r.URL.Query().Get("filter"))
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid", err.Error())
		return
	}
	out := &computepb.InstanceList{}
	for _, res := range s.Instances() {
		if lastSegment(res.GetZone()) == r.PathValue("zone") && match(res) {
			out.Items = append(out.Items, res)
		}
	}
	writeProto(w, out)
}

func (s *Server) aggregatedList(w http.ResponseWriter, r *http.Request) {
	if _, ok := s.begin(w, "aggregatedList"); !ok {
		return
	}
	match, err := parseFilter(r.URL.Query().Get("filter"))
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid", err.Error())
		return
	}
	out := &computepb.InstanceAggregatedList{Items: map[string]*computepb.InstancesScopedList{}}
	for _, res := range s.Instances() {
		if !match(res) {
			continue
		}
		scope := "zones/" + lastSegment(res.GetZone())
		if out.Items[scope] == nil {
			out.Items[scope] = &computepb.InstancesScopedList{}
		}
		out.Items[scope].Instances = append(out.Items[scope].Instances, res)
	}
	writeProto(w, out)
}

func (s *Server) getOperation(w http.ResponseWriter, r *http.Request) {
	if _, ok := s.begin(w, "operation"); !ok {
		return
	}
	s.mu.Lock()
	op, ok := s.ops[r.PathValue("op")]
	if ok {
		op = proto.CloneOf(op)
		op.Status = computepb.Operation_DONE.Enum()
	}
	s.mu.Unlock()
	if !ok {
		writeError(w, http.StatusNotFound, "notFound", "operation "+r.PathValue("op")+" not found")
		return
	}
	writeProto(w, op)
}

// begin counts the request and applies the first matching fault: a status
// fault answers here (ok false); a LoseReply or OperationError fault is
// returned for the handler to apply.
func (s *Server) begin(w http.ResponseWriter, method string) (*Fault, bool) {
	return s.beginIn(w, method, "")
}

// beginIn is begin for a request about zone.
func (s *Server) beginIn(w http.ResponseWriter, method, zone string) (*Fault, bool) {
	s.mu.Lock()
	s.requests[method]++
	var hit *Fault
	for i := range s.faults {
		f := &s.faults[i]
		if f.Times > 0 && (f.Method == "" || f.Method == method) && (f.Zone == "" || f.Zone == zone) {
			f.Times--
			copied := *f
			hit = &copied
			break
		}
	}
	s.mu.Unlock()
	if hit != nil && hit.Status != 0 {
		writeError(w, hit.Status, orDefault(hit.Reason, http.StatusText(hit.Status)), orDefault(hit.Message, "injected fault"))
		return nil, false
	}
	return hit, true
}
