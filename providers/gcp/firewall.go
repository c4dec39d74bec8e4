package gcp

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/api/iterator"
	"google.golang.org/protobuf/proto"

	"github.com/example/egress-proxies-operator/providers"
)

// FirewallSettings are the ingress rule the operator keeps for a gcp
// provider instance's VMs: GCE's default for a rule without source ranges is
// the whole internet, and a proxy open to it is abused within minutes, so
// the rule is the operator's to write, never the user's.
type FirewallSettings struct {
	// SourceRanges are the CIDRs that may reach the proxy port: the
	// crawlers' egress addresses. Required; neither empty nor the whole
	// internet (a /0). The VMs' Squid admits the same ranges.
	SourceRanges []string `json:"sourceRanges"`
	// Ports the rule opens; every Proxy of this provider instance must
	// listen on one of them. Default: 3128.
	Ports []int32 `json:"ports,omitempty"`
}

// validate names the first field at fault; it runs at startup, so a bad
// config never reaches a VM.
func (f *FirewallSettings) validate() error {
	if f == nil {
		return providers.CheckIngress("settings.firewall", nil, nil)
	}
	return providers.CheckIngress("settings.firewall", f.SourceRanges, f.Ports)
}

// ports are the configured ports, or the default.
func (f *FirewallSettings) ports() []int32 {
	if len(f.Ports) == 0 {
		return []int32{3128}
	}
	return f.Ports
}

// maxGCEName is GCE's limit on resource names and network tags.
const maxGCEName = 63

// gceName fits prefix+name into a GCE name, replacing the tail of a long one
// with a hash so that distinct names stay distinct.
func gceName(prefix, name string) string {
	full := prefix + name
	if len(full) <= maxGCEName {
		return full
	}
	sum := sha256.Sum256([]byte(full))
	suffix := "-" + hex.EncodeToString(sum[:])[:8]
	return strings.TrimRight(full[:maxGCEName-len(suffix)], "-") + suffix
}

// TargetTag is the network tag every VM of provider instance name carries,
// which its firewall rule targets.
func TargetTag(name string) string { return gceName("egress-proxy-", name) }

// FirewallName is the rule of provider instance name for owner: unique per
// cluster, operator and provider instance in a shared project.
func FirewallName(owner providers.Owner, name string) string {
	sum := sha256.Sum256([]byte(owner.String()))
	return gceName("egress-proxy-"+hex.EncodeToString(sum[:])[:8]+"-", name)
}

// GCE firewalls carry no labels, so the rule says whose it is in its
// description, which GC parses back. A rule made before operator ids
// existed names no operator, matches no owner and is never collected.
var ownerPattern = regexp.MustCompile(`\(cluster-id=([^,()\s]+), operator-id=([^,()\s]+), provider=([a-z0-9-]+)\)`)

func firewallDescription(owner providers.Owner, name string) string {
	return fmt.Sprintf("Managed by egress-proxies-operator (cluster-id=%s, operator-id=%s, provider=%s): opens the proxy port of this provider instance's VMs to its firewall.sourceRanges. Edits are overwritten; the operator deletes it when the provider instance leaves its config.",
		owner.ClusterID, owner.OperatorID, name)
}

// firewall is the rule this provider instance needs.
func (p *Provider) firewall(owner providers.Owner) *computepb.Firewall {
	ports := make([]string, 0, len(p.settings.Firewall.ports()))
	for _, port := range p.settings.Firewall.ports() {
		ports = append(ports, strconv.Itoa(int(port)))
	}
	return &computepb.Firewall{
		Name:         proto.String(FirewallName(owner, p.name)),
		Description:  proto.String(firewallDescription(owner, p.name)),
		Network:      proto.String(or(p.settings.Network, "global/networks/default")),
		Direction:    proto.String(computepb.Firewall_INGRESS.String()),
		Priority:     proto.Int32(1000),
		SourceRanges: slices.Clone(p.settings.Firewall.SourceRanges),
		TargetTags:   []string{TargetTag(p.name)},
		Allowed:      []*computepb.Allowed{{IPProtocol: proto.String("tcp"), Ports: ports}},
	}
}

// EnsureFirewall creates this provider instance's rule, or patches it back
// when it differs from the config (edited by hand, or the config changed).
func (p *Provider) EnsureFirewall(ctx context.Context, owner providers.Owner) error {
	want := p.firewall(owner)
	if len(want.GetSourceRanges()) == 0 {
		// validate refused this at startup; never send it, as GCE would
		// read no source range as the whole internet.
		return providers.Terminal("firewall %s has no source range", want.GetName())
	}
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	have, err := p.firewalls.Get(ctx, &computepb.GetFirewallRequest{Project: p.settings.Project, Firewall: want.GetName()})
	switch {
	case isNotFound(err):
		if _, err := p.firewalls.Insert(ctx, &computepb.InsertFirewallRequest{Project: p.settings.Project, FirewallResource: want}); err != nil && !isAlreadyExists(err) {
			return classify(fmt.Errorf("creating firewall %s: %w", want.GetName(), err))
		}
		return nil
	case err != nil:
		return classify(fmt.Errorf("reading firewall %s: %w", want.GetName(), err))
	case firewallMatches(have, want):
		return nil
	}
	if _, err := p.firewalls.Patch(ctx, &computepb.PatchFirewallRequest{
		Project: p.settings.Project, Firewall: want.GetName(), FirewallResource: want,
	}); err != nil {
		return classify(fmt.Errorf("updating firewall %s: %w", want.GetName(), err))
	}
	return nil
}

// firewallMatches compares what the operator sets; GCE fills in the rest
// (ids, links, timestamps, full network URLs).
func firewallMatches(have, want *computepb.Firewall) bool {
	sorted := func(s []string) []string { s = slices.Clone(s); slices.Sort(s); return s }
	if have.GetDescription() != want.GetDescription() || have.GetDirection() != want.GetDirection() ||
		have.GetPriority() != want.GetPriority() || have.GetDisabled() ||
		lastSegment(have.GetNetwork()) != lastSegment(want.GetNetwork()) ||
		!slices.Equal(sorted(have.GetSourceRanges()), sorted(want.GetSourceRanges())) ||
		!slices.Equal(sorted(have.GetTargetTags()), sorted(want.GetTargetTags())) ||
		len(have.GetSourceTags()) > 0 || len(have.GetSourceServiceAccounts()) > 0 || len(have.GetTargetServiceAccounts()) > 0 ||
		len(have.GetDenied()) > 0 || len(have.GetAllowed()) != len(want.GetAllowed()) {
		return false
	}
	for i, a := range want.GetAllowed() {
		h := have.GetAllowed()[i]
		if h.GetIPProtocol() != a.GetIPProtocol() || !slices.Equal(sorted(h.GetPorts()), sorted(a.GetPorts())) {
			return false
		}
	}
	return true
}

// StrayFirewalls lists the rules owner made in this provider instance's
// project for provider instances keep rejects: left behind when a provider
// instance left the config. A rule whose description does not name this
// cluster and this operator is never listed.
func (p *Provider) StrayFirewalls(ctx context.Context, owner providers.Owner, keep func(provider string) bool) ([]providers.FirewallRule, error) {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	it := p.firewalls.List(ctx, &computepb.ListFirewallsRequest{Project: p.settings.Project})
	var out []providers.FirewallRule
	for {
		fw, err := it.Next()
		if errors.Is(err, iterator.Done) {
			return out, nil
		}
		if err != nil {
			return nil, classify(fmt.Errorf("listing firewalls of project %s: %w", p.settings.Project, err))
		}
		m := ownerPattern.FindStringSubmatch(fw.GetDescription())
		if m == nil || (providers.Owner{ClusterID: m[1], OperatorID: m[2]}) != owner || fw.GetName() != FirewallName(owner, m[3]) || keep(m[3]) {
			continue
		}
		out = append(out, providers.FirewallRule{Name: fw.GetName(), Provider: m[3], Location: p.settings.Project})
	}
}

// DeleteFirewall deletes a rule StrayFirewalls returned; one already gone
// is fine.
func (p *Provider) DeleteFirewall(ctx context.Context, rule providers.FirewallRule) error {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	_, err := p.firewalls.Delete(ctx, &computepb.DeleteFirewallRequest{Project: p.settings.Project, Firewall: rule.Name})
	if err != nil && !isNotFound(err) {
		return classify(fmt.Errorf("deleting firewall %s: %w", rule.Name, err))
	}
	return nil
}
