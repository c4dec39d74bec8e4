package fakeec2

import (
	"encoding/base64"
	"encoding/xml"
	"fmt"
	"hash/fnv"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The instance actions: run (under a client token), describe (by filter),
// terminate, and the boot a describe moves on.

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
	prefixes, _ := strconv.Atoi(form.Get("NetworkInterface.1.Ipv6PrefixCount"))
	if prefixes > 0 && form.Get("NetworkInterface.1.SubnetId") == "" {
		// The default subnets have no IPv6 CIDR.
		return nil, &APIError{http.StatusBadRequest, "InvalidParameterCombination",
			"You must specify a subnet with an IPv6 CIDR block to assign IPv6 prefixes."}
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
		IPv6PrefixesAsked: prefixes,
		Tags:              tagsOf(form, "instance"), Launched: time.Now().UTC().Truncate(time.Second), seq: s.next,
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
	for i := range in.IPv6PrefixesAsked {
		// /80s of the subnet's /64, in the documentation range: never a
		// real host.
		in.IPv6Prefixes = append(in.IPv6Prefixes, fmt.Sprintf("2001:db8:a:%x:%x::/80", subnetIndex(in.SubnetID), in.seq*8+i))
	}
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

func instanceXML(in *Instance) xmlInstance {
	x := xmlInstance{ID: in.ID, ImageID: in.Image, State: stateXML(in.State), Type: in.Type, LaunchTime: in.Launched.Format(time.RFC3339),
		Zone: in.Zone, PublicIP: in.PublicIP, Lifecycle: in.Lifecycle, Tags: tagsXML(in.Tags)}
	if len(in.IPv6Prefixes) > 0 {
		iface := xmlInterface{ID: "eni-" + in.ID[2:]}
		for _, p := range in.IPv6Prefixes {
			iface.IPv6Prefixes = append(iface.IPv6Prefixes, struct {
				Prefix string `xml:"ipv6Prefix"`
			}{p})
		}
		x.Interfaces = []xmlInterface{iface}
	}
	if in.StateReason != "" {
		code, msg, _ := strings.Cut(in.StateReason, ": ")
		x.Reason = &struct {
			Code    string `xml:"code"`
			Message string `xml:"message"`
		}{code, msg}
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

// subnetIndex numbers a subnet's /64 within the fake VPC's IPv6 range.
func subnetIndex(subnet string) uint32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(subnet))
	return h.Sum32() & 0xffff
}
