package aws

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/providers"
)

// SecurityGroupSettings are the ingress the operator keeps for an aws
// provider instance's instances, as the gcp provider keeps its firewall
// rule: never empty and never the whole internet, since a proxy open to it
// is abused within minutes.
type SecurityGroupSettings struct {
	// SourceRanges are the CIDRs that may reach the proxy port: the
	// crawlers' egress addresses. Required; neither empty nor a /0. The
	// instances' Squid admits the same ranges.
	SourceRanges []string `json:"sourceRanges"`
	// Ports the group opens; every Proxy of this provider instance must
	// listen on one of them. Default: 3128.
	Ports []int32 `json:"ports,omitempty"`
}

// validate names the first field at fault; it runs at startup.
func (g *SecurityGroupSettings) validate() error {
	if g == nil {
		return providers.CheckIngress("settings.securityGroup", nil, nil)
	}
	return providers.CheckIngress("settings.securityGroup", g.SourceRanges, g.Ports)
}

// ports are the configured ports, or the default.
func (g *SecurityGroupSettings) ports() []int32 {
	if len(g.Ports) == 0 {
		return []int32{3128}
	}
	return g.Ports
}

// SecurityGroupName is the group of provider instance name for owner:
// unique per cluster, operator and provider instance in a shared account.
func SecurityGroupName(owner providers.Owner, name string) string {
	sum := sha256.Sum256([]byte(owner.String()))
	return "egress-proxy-" + hex.EncodeToString(sum[:])[:8] + "-" + name
}

// wanted is the ingress the group must have: tcp on each port from each
// range.
func (p *Provider) wanted() []types.IpPermission {
	var out []types.IpPermission
	for _, port := range p.settings.SecurityGroup.ports() {
		for _, cidr := range p.settings.SecurityGroup.SourceRanges {
			out = append(out, permission(port, cidr))
		}
	}
	return out
}

func permission(port int32, cidr string) types.IpPermission {
	return types.IpPermission{IpProtocol: awssdk.String("tcp"), FromPort: awssdk.Int32(port), ToPort: awssdk.Int32(port),
		IpRanges: []types.IpRange{{CidrIp: awssdk.String(cidr)}}}
}

// EnsureFirewall creates this provider instance's security group when
// missing (tagged with owner and the provider's name), then makes its
// ingress exactly the settings': what is missing is authorized, anything
// else revoked.
func (p *Provider) EnsureFirewall(ctx context.Context, owner providers.Owner) error {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	name := SecurityGroupName(owner, p.name)
	group, err := p.findGroup(ctx, name)
	if err != nil {
		return err
	}
	if group == nil {
		in := &ec2.CreateSecurityGroupInput{
			GroupName:   awssdk.String(name),
			Description: awssdk.String(fmt.Sprintf("Managed by egress-proxies-operator: the proxy port of aws provider %s's instances, open to its securityGroup.sourceRanges alone", p.name)),
			TagSpecifications: []types.TagSpecification{{ResourceType: types.ResourceTypeSecurityGroup, Tags: []types.Tag{
				{Key: awssdk.String(crawlv1alpha1.LabelClusterID), Value: awssdk.String(owner.ClusterID)},
				{Key: awssdk.String(crawlv1alpha1.LabelOperatorID), Value: awssdk.String(owner.OperatorID)},
				{Key: awssdk.String(crawlv1alpha1.LabelProvider), Value: awssdk.String(p.name)},
			}}},
		}
		if p.settings.VPCID != "" {
			in.VpcId = awssdk.String(p.settings.VPCID)
		}
		out, err := p.ec2.CreateSecurityGroup(ctx, in)
		if err != nil {
			return classify(fmt.Errorf("creating security group %s: %w", name, err))
		}
		group = &types.SecurityGroup{GroupId: out.GroupId, GroupName: awssdk.String(name)}
	}
	have := flatten(group.IpPermissions)
	want := p.wanted()
	var missing, extra []types.IpPermission
	for _, w := range want {
		if !slices.ContainsFunc(have, func(h types.IpPermission) bool { return samePermission(h, w) }) {
			missing = append(missing, w)
		}
	}
	for _, h := range have {
		if !slices.ContainsFunc(want, func(w types.IpPermission) bool { return samePermission(h, w) }) {
			extra = append(extra, h)
		}
	}
	if len(missing) > 0 {
		if _, err := p.ec2.AuthorizeSecurityGroupIngress(ctx, &ec2.AuthorizeSecurityGroupIngressInput{GroupId: group.GroupId, IpPermissions: missing}); err != nil {
			return classify(fmt.Errorf("opening security group %s: %w", name, err))
		}
	}
	if len(extra) > 0 {
		if _, err := p.ec2.RevokeSecurityGroupIngress(ctx, &ec2.RevokeSecurityGroupIngressInput{GroupId: group.GroupId, IpPermissions: extra}); err != nil {
			return classify(fmt.Errorf("closing what security group %s must not open: %w", name, err))
		}
	}
	if err := p.ensureIPv6Egress(ctx, group); err != nil {
		return err
	}
	p.mu.Lock()
	p.groupID = awssdk.ToString(group.GroupId)
	p.mu.Unlock()
	return nil
}

// ensureIPv6Egress lets the instances reach IPv6 sites when settings.ipv6
// gives them a prefix: a new security group's only outbound rule is EC2's
// default for IPv4, so IPv6 traffic needs a rule of its own.
func (p *Provider) ensureIPv6Egress(ctx context.Context, group *types.SecurityGroup) error {
	if p.settings.IPv6 == nil {
		return nil
	}
	for _, perm := range group.IpPermissionsEgress {
		if awssdk.ToString(perm.IpProtocol) == "-1" && slices.ContainsFunc(perm.Ipv6Ranges, func(r types.Ipv6Range) bool { return awssdk.ToString(r.CidrIpv6) == "::/0" }) {
			return nil
		}
	}
	_, err := p.ec2.AuthorizeSecurityGroupEgress(ctx, &ec2.AuthorizeSecurityGroupEgressInput{GroupId: group.GroupId, IpPermissions: []types.IpPermission{{
		IpProtocol: awssdk.String("-1"), Ipv6Ranges: []types.Ipv6Range{{CidrIpv6: awssdk.String("::/0")}},
	}}})
	if err != nil {
		return classify(fmt.Errorf("letting security group %s's instances reach IPv6 sites: %w", awssdk.ToString(group.GroupName), err))
	}
	return nil
}

// flatten splits permissions into one per port range and CIDR.
func flatten(perms []types.IpPermission) []types.IpPermission {
	var out []types.IpPermission
	for _, p := range perms {
		for _, r := range p.IpRanges {
			out = append(out, types.IpPermission{IpProtocol: p.IpProtocol, FromPort: p.FromPort, ToPort: p.ToPort, IpRanges: []types.IpRange{{CidrIp: r.CidrIp}}})
		}
		for _, r := range p.Ipv6Ranges {
			out = append(out, types.IpPermission{IpProtocol: p.IpProtocol, FromPort: p.FromPort, ToPort: p.ToPort, Ipv6Ranges: []types.Ipv6Range{{CidrIpv6: r.CidrIpv6}}})
		}
		if len(p.IpRanges) == 0 && len(p.Ipv6Ranges) == 0 {
			out = append(out, p) // groups or prefix lists: never ours, revoked
		}
	}
	return out
}

func samePermission(a, b types.IpPermission) bool {
	cidr := func(p types.IpPermission) string {
		if len(p.IpRanges) == 1 && len(p.Ipv6Ranges) == 0 {
			return awssdk.ToString(p.IpRanges[0].CidrIp)
		}
		return ""
	}
	return awssdk.ToString(a.IpProtocol) == awssdk.ToString(b.IpProtocol) && awssdk.ToInt32(a.FromPort) == awssdk.ToInt32(b.FromPort) &&
		awssdk.ToInt32(a.ToPort) == awssdk.ToInt32(b.ToPort) && cidr(a) != "" && cidr(a) == cidr(b)
}

// findGroup reads the group called name in the VPC, nil when there is none.
func (p *Provider) findGroup(ctx context.Context, name string) (*types.SecurityGroup, error) {
	filters := []types.Filter{{Name: awssdk.String("group-name"), Values: []string{name}}}
	if p.settings.VPCID != "" {
		filters = append(filters, types.Filter{Name: awssdk.String("vpc-id"), Values: []string{p.settings.VPCID}})
	}
	out, err := p.ec2.DescribeSecurityGroups(ctx, &ec2.DescribeSecurityGroupsInput{Filters: filters})
	if err != nil {
		return nil, classify(fmt.Errorf("reading security group %s: %w", name, err))
	}
	if len(out.SecurityGroups) == 0 {
		return nil, nil
	}
	return &out.SecurityGroups[0], nil
}

// securityGroupID is the group instances go in, as EnsureFirewall left it;
// until it has run, no instance is made (it would be in no group of ours).
func (p *Provider) securityGroupID(context.Context) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.groupID == "" {
		return "", providers.Transient(fmt.Errorf("aws provider %s has no security group yet: the operator makes it before the first instance", p.name))
	}
	return p.groupID, nil
}

// StrayFirewalls lists the security groups owner made for provider
// instances keep rejects.
func (p *Provider) StrayFirewalls(ctx context.Context, owner providers.Owner, keep func(provider string) bool) ([]providers.FirewallRule, error) {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	out, err := p.ec2.DescribeSecurityGroups(ctx, &ec2.DescribeSecurityGroupsInput{Filters: []types.Filter{
		{Name: awssdk.String("tag:" + crawlv1alpha1.LabelClusterID), Values: []string{owner.ClusterID}},
		{Name: awssdk.String("tag:" + crawlv1alpha1.LabelOperatorID), Values: []string{owner.OperatorID}},
	}})
	if err != nil {
		return nil, classify(fmt.Errorf("listing the operator's security groups: %w", err))
	}
	var stray []providers.FirewallRule
	for _, g := range out.SecurityGroups {
		provider := ""
		for _, t := range g.Tags {
			if awssdk.ToString(t.Key) == crawlv1alpha1.LabelProvider {
				provider = awssdk.ToString(t.Value)
			}
		}
		if provider != "" && !keep(provider) {
			stray = append(stray, providers.FirewallRule{Name: awssdk.ToString(g.GroupName), Provider: provider, Location: awssdk.ToString(g.GroupId)})
		}
	}
	return stray, nil
}

// DeleteFirewall deletes a security group StrayFirewalls returned; one gone
// already is fine. A group still attached to an instance is refused by EC2
// (DependencyViolation): transient, it goes once the instances do.
func (p *Provider) DeleteFirewall(ctx context.Context, rule providers.FirewallRule) error {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	_, err := p.ec2.DeleteSecurityGroup(ctx, &ec2.DeleteSecurityGroupInput{GroupId: awssdk.String(rule.Location)})
	var apiErr interface{ ErrorCode() string }
	switch {
	case err == nil || isNotFound(err):
		return nil
	case errors.As(err, &apiErr) && apiErr.ErrorCode() == "DependencyViolation":
		return providers.Transient(fmt.Errorf("deleting security group %s: still attached: %w", rule.Name, err))
	}
	return classify(fmt.Errorf("deleting security group %s: %w", rule.Name, err))
}
