// Package fakeec2 is an in-process EC2 API speaking the EC2 Query protocol
// (form-encoded requests, XML answers) as aws-sdk-go-v2 sends and parses
// it, for the calls the aws provider makes: RunInstances (with ClientToken
// idempotency), DescribeInstances (filters by tag and state),
// TerminateInstances, and the security group calls. Instances boot, and a
// test can stop, terminate or interrupt one behind the operator's back, or
// make the next creates fail for capacity or quota. It also serves the SSM
// Parameter Store calls the provider keeps lease keys with and the IMDSv2
// a VM reads its credentials from (ssm.go). It is test support; it
// never opens a network connection of its own.
package fakeec2

import (
	"encoding/base64"
	"encoding/xml"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Instance states, as EC2 names them.
const (
	StatePending      = "pending"
	StateRunning      = "running"
	StateShuttingDown = "shutting-down"
	StateTerminated   = "terminated"
	StateStopping     = "stopping"
	StateStopped      = "stopped"
)

var stateCodes = map[string]int{StatePending: 0, StateRunning: 16, StateShuttingDown: 32, StateTerminated: 48, StateStopping: 64, StateStopped: 80}

// Instance is one fake instance.
type Instance struct {
	ID, Zone, Type, Image, State, PublicIP, UserData, ClientToken string
	// Lifecycle is "spot" for a Spot instance, "" on demand.
	Lifecycle string
	// HTTPTokens is the IMDS setting it was launched with ("required":
	// IMDSv2 only).
	HTTPTokens     string
	PublicIPAsked  bool
	SecurityGroups []string
	SubnetID       string
	Tags           map[string]string
	Launched       time.Time
	// StateReason is why it stopped or ended (Server.SpotInstanceTermination
	// for an interruption).
	StateReason string
	// polls counts the describes it was in while pending.
	polls int
	// seq numbers the instance in the order it was run.
	seq int
}

// Permission is one ingress rule of a security group.
type Permission struct {
	Protocol         string
	FromPort, ToPort int32
	CIDR             string
}

// SecurityGroup is one fake security group.
type SecurityGroup struct {
	ID, Name, Description, VPC string
	Tags                       map[string]string
	Ingress                    []Permission
}

// Server is the fake EC2 API. Its zero value is not usable: call New.
type Server struct {
	mu        sync.Mutex
	instances map[string]*Instance
	order     []string
	tokens    map[string]string
	groups    map[string]*SecurityGroup
	next      int
	// BootPolls is how many describes a new instance stays pending in
	// (default 1).
	BootPolls int
	// NextIP hands out the public IP of each instance that boots (default
	// 127.90.x.y, one per instance: never a network target of a test).
	NextIP func() string
	// Calls counts the API calls by Action.
	calls map[string]int
	// failures are the answers the next calls of an Action get instead.
	failures map[string][]APIError
	// lostReplies counts the next calls of an Action that act and then
	// answer 500, as a reply lost on the way back would.
	lostReplies map[string]int
	// capacity is the zones out of capacity (InsufficientInstanceCapacity
	// for every RunInstances there).
	fullZones map[string]bool
	// maxInstances caps the live instances (InstanceLimitExceeded beyond).
	maxInstances int
	// down answers every call 503 while true.
	down bool
	// parameters are SSM's, by name; issued the credentials IMDS handed
	// out, by access key id; imdsTokens IMDSv2's session tokens.
	parameters map[string]*parameter
	issued     map[string]issued
	imdsTokens map[string]bool
}

// APIError is an error answer: its HTTP status, code and message.
type APIError struct {
	Status        int
	Code, Message string
}

// New returns an empty fake EC2.
func New() *Server {
	s := &Server{instances: map[string]*Instance{}, tokens: map[string]string{}, groups: map[string]*SecurityGroup{},
		calls: map[string]int{}, failures: map[string][]APIError{}, lostReplies: map[string]int{}, fullZones: map[string]bool{}, BootPolls: 1,
		parameters: map[string]*parameter{}, issued: map[string]issued{}, imdsTokens: map[string]bool{}}
	return s
}

// Calls is how many times action was called.
func (s *Server) Calls(action string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[action]
}

// FailNext makes the next call of action answer err.
func (s *Server) FailNext(action string, err APIError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failures[action] = append(s.failures[action], err)
}

// LoseNextReply makes the next call of action take effect and then answer
// 500 InternalError, as a reply lost on its way back: the SDK retries it,
// and only the ClientToken keeps a retried RunInstances from running a
// second instance.
func (s *Server) LoseNextReply(action string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lostReplies[action]++
}

// SetZoneFull makes every RunInstances in zone answer
// InsufficientInstanceCapacity while full.
func (s *Server) SetZoneFull(zone string, full bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fullZones[zone] = full
}

// SetInstanceLimit caps the live (not terminated) instances: beyond it,
// RunInstances answers InstanceLimitExceeded. 0: no cap.
func (s *Server) SetInstanceLimit(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.maxInstances = n
}

// SetDown makes every call answer 503 Unavailable while down.
func (s *Server) SetDown(down bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down = down
}

// Instances is a copy of every instance, terminated ones too, in launch
// order.
func (s *Server) Instances() []Instance {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Instance, 0, len(s.order))
	for _, id := range s.order {
		in := *s.instances[id]
		in.Tags = cloneMap(in.Tags)
		out = append(out, in)
	}
	return out
}

// SecurityGroups is a copy of every security group, by name.
func (s *Server) SecurityGroups() []SecurityGroup {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]SecurityGroup, 0, len(s.groups))
	for _, g := range s.groups {
		c := *g
		c.Tags, c.Ingress = cloneMap(g.Tags), slices.Clone(g.Ingress)
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// SpotInstanceTermination is the state reason of an interrupted Spot
// instance.
const SpotInstanceTermination = "Server.SpotInstanceTermination"

// Interrupt ends a Spot instance as EC2 does when it takes the capacity
// back: terminated, with SpotInstanceTermination as its reason.
func (s *Server) Interrupt(id string) { s.setState(id, StateTerminated, SpotInstanceTermination) }

// Terminate ends an instance behind the operator's back.
func (s *Server) Terminate(id string) {
	s.setState(id, StateTerminated, "Client.UserInitiatedShutdown: User initiated shutdown")
}

// Stop stops an instance behind the operator's back.
func (s *Server) Stop(id string) {
	s.setState(id, StateStopped, "Client.UserInitiatedShutdown: User initiated shutdown")
}

func (s *Server) setState(id, state, reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if in, ok := s.instances[id]; ok {
		in.State, in.StateReason = state, reason
		if state == StateTerminated || state == StateStopped {
			in.PublicIP = ""
		}
	}
}

// ServeHTTP answers one EC2 Query request, SSM call or IMDS read.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if target := r.Header.Get("X-Amz-Target"); strings.HasPrefix(target, "AmazonSSM.") {
		s.serveSSM(w, r, target)
		return
	}
	if strings.HasPrefix(r.URL.Path, "/latest/") {
		s.serveIMDS(w, r)
		return
	}
	if err := r.ParseForm(); err != nil {
		writeError(w, APIError{http.StatusBadRequest, "MalformedQueryString", err.Error()})
		return
	}
	form := r.PostForm
	action := form.Get("Action")
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls[action]++
	if s.down {
		writeError(w, APIError{http.StatusServiceUnavailable, "Unavailable", "The service is unavailable. Please try again shortly."})
		return
	}
	if queued := s.failures[action]; len(queued) > 0 {
		s.failures[action] = queued[1:]
		writeError(w, queued[0])
		return
	}
	var (
		body any
		err  *APIError
	)
	switch action {
	case "RunInstances":
		body, err = s.runInstances(form)
	case "DescribeInstances":
		body, err = s.describeInstances(form)
	case "TerminateInstances":
		body, err = s.terminateInstances(form)
	case "CreateSecurityGroup":
		body, err = s.createSecurityGroup(form)
	case "DescribeSecurityGroups":
		body, err = s.describeSecurityGroups(form)
	case "AuthorizeSecurityGroupIngress":
		body, err = s.changeIngress(form, true)
	case "RevokeSecurityGroupIngress":
		body, err = s.changeIngress(form, false)
	case "DeleteSecurityGroup":
		body, err = s.deleteSecurityGroup(form)
	default:
		err = &APIError{http.StatusBadRequest, "InvalidAction", fmt.Sprintf("The action %s is not valid for this web service.", action)}
	}
	if err != nil {
		writeError(w, *err)
		return
	}
	if s.lostReplies[action] > 0 {
		s.lostReplies[action]--
		writeError(w, APIError{http.StatusInternalServerError, "InternalError", "An internal error has occurred (the call took effect)."})
		return
	}
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	out, merr := xml.Marshal(body)
	if merr != nil {
		writeError(w, APIError{http.StatusInternalServerError, "InternalError", merr.Error()})
		return
	}
	_, _ = w.Write([]byte(xml.Header))
	_, _ = w.Write(out)
}

func writeError(w http.ResponseWriter, e APIError) {
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	w.WriteHeader(e.Status)
	type xmlError struct {
		Code    string `xml:"Code"`
		Message string `xml:"Message"`
	}
	out, _ := xml.Marshal(struct {
		XMLName   xml.Name   `xml:"Response"`
		Errors    []xmlError `xml:"Errors>Error"`
		RequestID string     `xml:"RequestID"`
	}{Errors: []xmlError{{e.Code, e.Message}}, RequestID: "fake-request"})
	_, _ = w.Write([]byte(xml.Header))
	_, _ = w.Write(out)
}

const xmlns = "http://ec2.amazonaws.com/doc/2016-11-15/"

// indexed returns the values of prefix.1, prefix.2, ... (for prefix.N.rest
// with rest "", the value itself).
func indexed(form url.Values, prefix, rest string) []string {
	var out []string
	for i := 1; ; i++ {
		key := prefix + "." + strconv.Itoa(i)
		if rest != "" {
			key += "." + rest
		}
		v, ok := form[key]
		if !ok {
			return out
		}
		out = append(out, v[0])
	}
}

// tagsOf reads TagSpecification.N.Tag.M of resource type kind.
func tagsOf(form url.Values, kind string) map[string]string {
	tags := map[string]string{}
	for i := 1; ; i++ {
		spec := "TagSpecification." + strconv.Itoa(i)
		rt, ok := form[spec+".ResourceType"]
		if !ok {
			return tags
		}
		if rt[0] != kind {
			continue
		}
		keys := indexed(form, spec+".Tag", "Key")
		values := indexed(form, spec+".Tag", "Value")
		for j, k := range keys {
			if j < len(values) {
				tags[k] = values[j]
			}
		}
	}
}

func (s *Server) live() int {
	n := 0
	for _, in := range s.instances {
		if in.State != StateTerminated {
			n++
		}
	}
	return n
}

func (s *Server) runInstances(form url.Values) (any, *APIError) {
	if token := form.Get("ClientToken"); token != "" {
		if id, ok := s.tokens[token]; ok {
			return reservation("RunInstancesResponse", s.instances[id]), nil
		}
	}
	zone := form.Get("Placement.AvailabilityZone")
	if zone == "" {
		zone = "fake-1a"
	}
	switch {
	case form.Get("ImageId") == "" || form.Get("InstanceType") == "":
		return nil, &APIError{http.StatusBadRequest, "MissingParameter", "ImageId and InstanceType are required"}
	case s.fullZones[zone] && form.Get("InstanceMarketOptions.MarketType") == "spot":
		return nil, &APIError{http.StatusBadRequest, "InsufficientInstanceCapacity",
			fmt.Sprintf("There is no Spot capacity available that matches your request in %s.", zone)}
	case s.fullZones[zone]:
		return nil, &APIError{http.StatusBadRequest, "InsufficientInstanceCapacity",
			fmt.Sprintf("We currently do not have sufficient %s capacity in the Availability Zone you requested (%s).", form.Get("InstanceType"), zone)}
	case s.maxInstances > 0 && s.live() >= s.maxInstances:
		return nil, &APIError{http.StatusBadRequest, "InstanceLimitExceeded",
			fmt.Sprintf("You have requested more instances than your current instance limit of %d allows.", s.maxInstances)}
	}
	userData, err := base64.StdEncoding.DecodeString(form.Get("UserData"))
	if err != nil {
		return nil, &APIError{http.StatusBadRequest, "InvalidParameterValue", "UserData must be base64"}
	}
	s.next++
	in := &Instance{
		ID: fmt.Sprintf("i-%017x", s.next), Zone: zone, Type: form.Get("InstanceType"), Image: form.Get("ImageId"),
		State: StatePending, UserData: string(userData), ClientToken: form.Get("ClientToken"),
		HTTPTokens: form.Get("MetadataOptions.HttpTokens"), PublicIPAsked: form.Get("NetworkInterface.1.AssociatePublicIpAddress") == "true",
		SecurityGroups: indexed(form, "NetworkInterface.1.SecurityGroupId", ""), SubnetID: form.Get("NetworkInterface.1.SubnetId"),
		Tags: tagsOf(form, "instance"), Launched: time.Now().UTC().Truncate(time.Second), seq: s.next,
	}
	if form.Get("InstanceMarketOptions.MarketType") == "spot" {
		in.Lifecycle = "spot"
	}
	s.instances[in.ID] = in
	s.order = append(s.order, in.ID)
	if in.ClientToken != "" {
		s.tokens[in.ClientToken] = in.ID
	}
	return reservation("RunInstancesResponse", in), nil
}

// filter is one Filter.N of a describe request.
type filter struct {
	name   string
	values []string
}

// filtersOf reads a request's Filter.N, once per request.
func filtersOf(form url.Values) []filter {
	var out []filter
	for i := 1; ; i++ {
		f := "Filter." + strconv.Itoa(i)
		names, ok := form[f+".Name"]
		if !ok {
			return out
		}
		out = append(out, filter{name: names[0], values: indexed(form, f+".Value", "")})
	}
}

// passes says whether a resource passes every filter: field reads the
// resource's value for a filter name (ok false: it has none, or the filter
// is unknown), and tag-key filters ask its tags.
func passes(filters []filter, field func(name string) (string, bool), tags map[string]string) bool {
	for _, f := range filters {
		if f.name == "tag-key" {
			if !slices.ContainsFunc(f.values, func(k string) bool { _, has := tags[k]; return has }) {
				return false
			}
			continue
		}
		have, ok := field(f.name)
		if key, isTag := strings.CutPrefix(f.name, "tag:"); isTag {
			have, ok = tags[key]
		}
		if !ok || !slices.Contains(f.values, have) {
			return false
		}
	}
	return true
}

// matches says whether in passes every filter.
func matches(filters []filter, in *Instance) bool {
	return passes(filters, func(name string) (string, bool) {
		switch name {
		case "instance-state-name":
			return in.State, true
		case "instance-id":
			return in.ID, true
		case "availability-zone":
			return in.Zone, true
		}
		return "", false
	}, in.Tags)
}

func (s *Server) describeInstances(form url.Values) (any, *APIError) {
	ids := indexed(form, "InstanceId", "")
	for _, id := range ids {
		if _, ok := s.instances[id]; !ok {
			return nil, &APIError{http.StatusBadRequest, "InvalidInstanceID.NotFound", fmt.Sprintf("The instance ID '%s' does not exist", id)}
		}
	}
	var items []xmlReservation
	filters := filtersOf(form)
	for _, id := range s.order {
		in := s.instances[id]
		if len(ids) > 0 && !slices.Contains(ids, id) || !matches(filters, in) {
			continue
		}
		s.boot(in)
		items = append(items, xmlReservation{ReservationID: "r-" + in.ID[2:], Instances: []xmlInstance{instanceXML(in)}})
	}
	return struct {
		XMLName      xml.Name         `xml:"DescribeInstancesResponse"`
		Xmlns        string           `xml:"xmlns,attr"`
		RequestID    string           `xml:"requestId"`
		Reservations []xmlReservation `xml:"reservationSet>item"`
	}{Xmlns: xmlns, RequestID: "fake-request", Reservations: items}, nil
}

// boot moves a pending instance on: running, with a public IP (when it
// asked for one), after BootPolls describes.
func (s *Server) boot(in *Instance) {
	if in.State != StatePending {
		if in.State == StateShuttingDown {
			in.State = StateTerminated
		}
		return
	}
	in.polls++
	if in.polls < max(s.BootPolls, 1) {
		return
	}
	in.State = StateRunning
	if in.PublicIPAsked {
		if s.NextIP != nil {
			in.PublicIP = s.NextIP()
		} else {
			in.PublicIP = fmt.Sprintf("127.90.%d.%d", in.seq/250, 1+in.seq%250)
		}
	}
}

func (s *Server) terminateInstances(form url.Values) (any, *APIError) {
	ids := indexed(form, "InstanceId", "")
	type change struct {
		ID       string   `xml:"instanceId"`
		Current  xmlState `xml:"currentState"`
		Previous xmlState `xml:"previousState"`
	}
	var out []change
	for _, id := range ids {
		in, ok := s.instances[id]
		if !ok {
			return nil, &APIError{http.StatusBadRequest, "InvalidInstanceID.NotFound", fmt.Sprintf("The instance ID '%s' does not exist", id)}
		}
		prev := in.State
		if in.State != StateTerminated {
			in.State, in.PublicIP = StateShuttingDown, ""
		}
		out = append(out, change{ID: id, Current: stateXML(in.State), Previous: stateXML(prev)})
	}
	return struct {
		XMLName   xml.Name `xml:"TerminateInstancesResponse"`
		Xmlns     string   `xml:"xmlns,attr"`
		RequestID string   `xml:"requestId"`
		Instances []change `xml:"instancesSet>item"`
	}{Xmlns: xmlns, RequestID: "fake-request", Instances: out}, nil
}

func (s *Server) createSecurityGroup(form url.Values) (any, *APIError) {
	name := form.Get("GroupName")
	if name == "" || form.Get("GroupDescription") == "" {
		return nil, &APIError{http.StatusBadRequest, "MissingParameter", "GroupName and GroupDescription are required"}
	}
	for _, g := range s.groups {
		if g.Name == name && g.VPC == form.Get("VpcId") {
			return nil, &APIError{http.StatusBadRequest, "InvalidGroup.Duplicate", fmt.Sprintf("The security group '%s' already exists", name)}
		}
	}
	s.next++
	g := &SecurityGroup{ID: fmt.Sprintf("sg-%017x", s.next), Name: name, Description: form.Get("GroupDescription"), VPC: form.Get("VpcId"),
		Tags: tagsOf(form, "security-group")}
	s.groups[g.ID] = g
	return struct {
		XMLName   xml.Name `xml:"CreateSecurityGroupResponse"`
		Xmlns     string   `xml:"xmlns,attr"`
		RequestID string   `xml:"requestId"`
		Return    bool     `xml:"return"`
		GroupID   string   `xml:"groupId"`
	}{Xmlns: xmlns, RequestID: "fake-request", Return: true, GroupID: g.ID}, nil
}

func (s *Server) describeSecurityGroups(form url.Values) (any, *APIError) {
	ids := indexed(form, "GroupId", "")
	var out []xmlGroup
	ordered := make([]*SecurityGroup, 0, len(s.groups))
	for _, g := range s.groups {
		ordered = append(ordered, g)
	}
	sort.Slice(ordered, func(i, j int) bool { return ordered[i].ID < ordered[j].ID })
	for _, id := range ids {
		if _, ok := s.groups[id]; !ok {
			return nil, &APIError{http.StatusBadRequest, "InvalidGroup.NotFound", fmt.Sprintf("The security group '%s' does not exist", id)}
		}
	}
	filters := filtersOf(form)
	for _, g := range ordered {
		if len(ids) > 0 && !slices.Contains(ids, g.ID) || !groupMatches(filters, g) {
			continue
		}
		out = append(out, groupXML(g))
	}
	return struct {
		XMLName   xml.Name   `xml:"DescribeSecurityGroupsResponse"`
		Xmlns     string     `xml:"xmlns,attr"`
		RequestID string     `xml:"requestId"`
		Groups    []xmlGroup `xml:"securityGroupInfo>item"`
	}{Xmlns: xmlns, RequestID: "fake-request", Groups: out}, nil
}

// groupMatches says whether g passes every filter.
func groupMatches(filters []filter, g *SecurityGroup) bool {
	return passes(filters, func(name string) (string, bool) {
		switch name {
		case "group-name":
			return g.Name, true
		case "vpc-id":
			return g.VPC, true
		}
		return "", false
	}, g.Tags)
}

// permissionsOf reads IpPermissions.N (protocol, ports, IpRanges.M.CidrIp).
func permissionsOf(form url.Values) []Permission {
	var out []Permission
	for i := 1; ; i++ {
		p := "IpPermissions." + strconv.Itoa(i)
		proto, ok := form[p+".IpProtocol"]
		if !ok {
			return out
		}
		from, _ := strconv.Atoi(form.Get(p + ".FromPort"))
		to, _ := strconv.Atoi(form.Get(p + ".ToPort"))
		for _, cidr := range indexed(form, p+".IpRanges", "CidrIp") {
			out = append(out, Permission{Protocol: proto[0], FromPort: int32(from), ToPort: int32(to), CIDR: cidr})
		}
	}
}

func (s *Server) changeIngress(form url.Values, add bool) (any, *APIError) {
	g, ok := s.groups[form.Get("GroupId")]
	if !ok {
		return nil, &APIError{http.StatusBadRequest, "InvalidGroup.NotFound", fmt.Sprintf("The security group '%s' does not exist", form.Get("GroupId"))}
	}
	for _, p := range permissionsOf(form) {
		has := slices.Contains(g.Ingress, p)
		switch {
		case add && has:
			return nil, &APIError{http.StatusBadRequest, "InvalidPermission.Duplicate", fmt.Sprintf("the specified rule %v already exists", p)}
		case add:
			g.Ingress = append(g.Ingress, p)
		case !has:
			return nil, &APIError{http.StatusBadRequest, "InvalidPermission.NotFound", fmt.Sprintf("The specified rule %v does not exist in this security group", p)}
		default:
			g.Ingress = slices.DeleteFunc(g.Ingress, func(q Permission) bool { return q == p })
		}
	}
	action := "AuthorizeSecurityGroupIngressResponse"
	if !add {
		action = "RevokeSecurityGroupIngressResponse"
	}
	return returnTrue(action), nil
}

func (s *Server) deleteSecurityGroup(form url.Values) (any, *APIError) {
	id := form.Get("GroupId")
	if _, ok := s.groups[id]; !ok {
		return nil, &APIError{http.StatusBadRequest, "InvalidGroup.NotFound", fmt.Sprintf("The security group '%s' does not exist", id)}
	}
	for _, in := range s.instances {
		if in.State != StateTerminated && slices.Contains(in.SecurityGroups, id) {
			return nil, &APIError{http.StatusBadRequest, "DependencyViolation", fmt.Sprintf("resource %s has a dependent object", id)}
		}
	}
	delete(s.groups, id)
	return returnTrue("DeleteSecurityGroupResponse"), nil
}

func returnTrue(name string) any {
	return struct {
		XMLName   xml.Name
		Xmlns     string `xml:"xmlns,attr"`
		RequestID string `xml:"requestId"`
		Return    bool   `xml:"return"`
	}{XMLName: xml.Name{Local: name}, Xmlns: xmlns, RequestID: "fake-request", Return: true}
}

// XML shapes of the answers.

type xmlTag struct {
	Key   string `xml:"key"`
	Value string `xml:"value"`
}

type xmlState struct {
	Code int    `xml:"code"`
	Name string `xml:"name"`
}

type xmlInstance struct {
	ID         string   `xml:"instanceId"`
	ImageID    string   `xml:"imageId"`
	State      xmlState `xml:"instanceState"`
	Type       string   `xml:"instanceType"`
	LaunchTime string   `xml:"launchTime"`
	Zone       string   `xml:"placement>availabilityZone"`
	PublicIP   string   `xml:"ipAddress,omitempty"`
	Lifecycle  string   `xml:"instanceLifecycle,omitempty"`
	Reason     *struct {
		Code    string `xml:"code"`
		Message string `xml:"message"`
	} `xml:"stateReason,omitempty"`
	Tags []xmlTag `xml:"tagSet>item"`
}

type xmlReservation struct {
	ReservationID string        `xml:"reservationId"`
	Instances     []xmlInstance `xml:"instancesSet>item"`
}

type xmlGroup struct {
	OwnerID     string `xml:"ownerId"`
	GroupID     string `xml:"groupId"`
	GroupName   string `xml:"groupName"`
	Description string `xml:"groupDescription"`
	VPC         string `xml:"vpcId"`
	Ingress     []struct {
		Protocol string `xml:"ipProtocol"`
		FromPort int32  `xml:"fromPort"`
		ToPort   int32  `xml:"toPort"`
		Ranges   []struct {
			CIDR string `xml:"cidrIp"`
		} `xml:"ipRanges>item"`
	} `xml:"ipPermissions>item"`
	Tags []xmlTag `xml:"tagSet>item"`
}

func stateXML(state string) xmlState { return xmlState{Code: stateCodes[state], Name: state} }

func tagsXML(tags map[string]string) []xmlTag {
	out := make([]xmlTag, 0, len(tags))
	for k, v := range tags {
		out = append(out, xmlTag{k, v})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

func instanceXML(in *Instance) xmlInstance {
	x := xmlInstance{ID: in.ID, ImageID: in.Image, State: stateXML(in.State), Type: in.Type, LaunchTime: in.Launched.Format(time.RFC3339),
		Zone: in.Zone, PublicIP: in.PublicIP, Lifecycle: in.Lifecycle, Tags: tagsXML(in.Tags)}
	if in.StateReason != "" {
		code, msg, _ := strings.Cut(in.StateReason, ": ")
		x.Reason = &struct {
			Code    string `xml:"code"`
			Message string `xml:"message"`
		}{code, msg}
	}
	return x
}

func groupXML(g *SecurityGroup) xmlGroup {
	x := xmlGroup{OwnerID: "000000000000", GroupID: g.ID, GroupName: g.Name, Description: g.Description, VPC: g.VPC, Tags: tagsXML(g.Tags)}
	for _, p := range g.Ingress {
		x.Ingress = append(x.Ingress, struct {
			Protocol string `xml:"ipProtocol"`
			FromPort int32  `xml:"fromPort"`
			ToPort   int32  `xml:"toPort"`
			Ranges   []struct {
				CIDR string `xml:"cidrIp"`
			} `xml:"ipRanges>item"`
		}{Protocol: p.Protocol, FromPort: p.FromPort, ToPort: p.ToPort, Ranges: []struct {
			CIDR string `xml:"cidrIp"`
		}{{p.CIDR}}})
	}
	return x
}

func reservation(name string, in *Instance) any {
	return struct {
		XMLName       xml.Name
		Xmlns         string        `xml:"xmlns,attr"`
		RequestID     string        `xml:"requestId"`
		ReservationID string        `xml:"reservationId"`
		Instances     []xmlInstance `xml:"instancesSet>item"`
	}{XMLName: xml.Name{Local: name}, Xmlns: xmlns, RequestID: "fake-request", ReservationID: "r-" + in.ID[2:], Instances: []xmlInstance{instanceXML(in)}}
}

func cloneMap(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
