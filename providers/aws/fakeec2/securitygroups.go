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
)

// The security group actions: create, describe, authorize and revoke
// ingress, authorize egress, delete.

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
		Tags: tagsOf(form, "security-group"), Egress: []Permission{{Protocol: "-1", CIDR: "0.0.0.0/0"}}}
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

// permissionsOf reads IpPermissions.N (protocol, ports, IpRanges.M.CidrIp
// and Ipv6Ranges.M.CidrIpv6).
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
		for _, cidr := range append(indexed(form, p+".IpRanges", "CidrIp"), indexed(form, p+".Ipv6Ranges", "CidrIpv6")...) {
			out = append(out, Permission{Protocol: proto[0], FromPort: int32(from), ToPort: int32(to), CIDR: cidr})
		}
	}
}

// changeRules authorizes (add) or revokes a group's ingress or egress
// permissions, as EC2 does: a duplicate or a missing one is an error.
func (s *Server) changeRules(form url.Values, add, egress bool) (any, *APIError) {
	g, ok := s.groups[form.Get("GroupId")]
	if !ok {
		return nil, &APIError{http.StatusBadRequest, "InvalidGroup.NotFound", fmt.Sprintf("The security group '%s' does not exist", form.Get("GroupId"))}
	}
	rules := &g.Ingress
	if egress {
		rules = &g.Egress
	}
	for _, p := range permissionsOf(form) {
		has := slices.Contains(*rules, p)
		switch {
		case add && has:
			return nil, &APIError{http.StatusBadRequest, "InvalidPermission.Duplicate", fmt.Sprintf("the specified rule %v already exists", p)}
		case add:
			*rules = append(*rules, p)
		case !has:
			return nil, &APIError{http.StatusBadRequest, "InvalidPermission.NotFound", fmt.Sprintf("The specified rule %v does not exist in this security group", p)}
		default:
			*rules = slices.DeleteFunc(*rules, func(q Permission) bool { return q == p })
		}
	}
	action := map[[2]bool]string{{true, false}: "AuthorizeSecurityGroupIngressResponse", {false, false}: "RevokeSecurityGroupIngressResponse",
		{true, true}: "AuthorizeSecurityGroupEgressResponse", {false, true}: "RevokeSecurityGroupEgressResponse"}[[2]bool{add, egress}]
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

func groupXML(g *SecurityGroup) xmlGroup {
	x := xmlGroup{OwnerID: "000000000000", GroupID: g.ID, GroupName: g.Name, Description: g.Description, VPC: g.VPC, Tags: tagsXML(g.Tags)}
	for _, p := range g.Ingress {
		x.Ingress = append(x.Ingress, permissionXML(p))
	}
	for _, p := range g.Egress {
		x.Egress = append(x.Egress, permissionXML(p))
	}
	return x
}

func permissionXML(p Permission) xmlPermission {
	x := xmlPermission{Protocol: p.Protocol, FromPort: p.FromPort, ToPort: p.ToPort}
	if strings.Contains(p.CIDR, ":") {
		x.IPv6Ranges = []xmlRange{{CIDRv6: p.CIDR}}
	} else {
		x.Ranges = []xmlRange{{CIDR: p.CIDR}}
	}
	return x
}
