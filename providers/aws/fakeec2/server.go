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
	HTTPTokens    string
	PublicIPAsked bool
	// IPv6Prefixes asked (NetworkInterface.1.Ipv6PrefixCount), and the
	// /80s delegated to it from its subnet's /64 once it runs.
	IPv6PrefixesAsked int
	IPv6Prefixes      []string
	SecurityGroups    []string
	SubnetID          string
	Tags              map[string]string
	Launched          time.Time
	// StateReason is why it stopped or ended (Server.SpotInstanceTermination
	// for an interruption).
	StateReason string
	// polls counts the describes it was in while pending.
	polls int
	// seq numbers the instance in the order it was run.
	seq int
}

// Permission is one ingress or egress rule of a security group (CIDR
// IPv4 or IPv6).
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
	// Egress starts as EC2's default: all IPv4 traffic, no IPv6.
	Egress []Permission
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
		body, err = s.changeRules(form, true, false)
	case "AuthorizeSecurityGroupEgress":
		body, err = s.changeRules(form, true, true)
	case "RevokeSecurityGroupIngress":
		body, err = s.changeRules(form, false, false)
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

// filter is one Filter.N of a describe request.
type filter struct {
	name   string
	values []string
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
	ID         string         `xml:"instanceId"`
	ImageID    string         `xml:"imageId"`
	State      xmlState       `xml:"instanceState"`
	Type       string         `xml:"instanceType"`
	LaunchTime string         `xml:"launchTime"`
	Zone       string         `xml:"placement>availabilityZone"`
	PublicIP   string         `xml:"ipAddress,omitempty"`
	Lifecycle  string         `xml:"instanceLifecycle,omitempty"`
	Interfaces []xmlInterface `xml:"networkInterfaceSet>item,omitempty"`
	Reason     *struct {
		Code    string `xml:"code"`
		Message string `xml:"message"`
	} `xml:"stateReason,omitempty"`
	Tags []xmlTag `xml:"tagSet>item"`
}

// xmlInterface is an instance's network interface, with its delegated
// IPv6 prefixes.
type xmlInterface struct {
	ID           string `xml:"networkInterfaceId"`
	IPv6Prefixes []struct {
		Prefix string `xml:"ipv6Prefix"`
	} `xml:"ipv6PrefixSet>item"`
}

type xmlReservation struct {
	ReservationID string        `xml:"reservationId"`
	Instances     []xmlInstance `xml:"instancesSet>item"`
}

type xmlGroup struct {
	OwnerID     string          `xml:"ownerId"`
	GroupID     string          `xml:"groupId"`
	GroupName   string          `xml:"groupName"`
	Description string          `xml:"groupDescription"`
	VPC         string          `xml:"vpcId"`
	Ingress     []xmlPermission `xml:"ipPermissions>item"`
	Egress      []xmlPermission `xml:"ipPermissionsEgress>item"`
	Tags        []xmlTag        `xml:"tagSet>item"`
}

type xmlPermission struct {
	Protocol   string     `xml:"ipProtocol"`
	FromPort   int32      `xml:"fromPort,omitempty"`
	ToPort     int32      `xml:"toPort,omitempty"`
	Ranges     []xmlRange `xml:"ipRanges>item,omitempty"`
	IPv6Ranges []xmlRange `xml:"ipv6Ranges>item,omitempty"`
}

type xmlRange struct {
	CIDR   string `xml:"cidrIp,omitempty"`
	CIDRv6 string `xml:"cidrIpv6,omitempty"`
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

func cloneMap(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
