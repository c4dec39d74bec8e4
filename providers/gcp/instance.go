package gcp

import (
	"cmp"
	"fmt"
	"strconv"
	"strings"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/protobuf/proto"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/providers"
	"github.com/example/egress-proxies-operator/providers/squidconf"
)

// A Proxy's VM: the instance resource the provider inserts, and the
// provider-neutral view of one it reads.

// vm is the instance resource for req: one interface with an ephemeral
// external IP (ONE_TO_ONE_NAT, no fixed address), the cloud-init as
// user-data and where the lease key is, its fetcher and the helper beside
// it (never the key itself), the operator's labels, its
// network tag (which its firewall rule targets) with the configured ones,
// and the configured service account.
func (p *Provider) vm(req providers.CreateRequest, pl placement, userData string, key squidconf.LeaseKeySource) *computepb.Instance {
	s := p.settings
	labels := toGCELabels(req.Labels)
	labels[gceLabelKeys[crawlv1alpha1.LabelProvider]] = p.name
	labels[portLabel] = strconv.Itoa(int(req.Proxy.Spec.Port))
	for k, v := range s.Labels {
		labels[k] = v
	}
	machineType := pl.machineType
	if !strings.Contains(machineType, "/") {
		machineType = fmt.Sprintf("zones/%s/machineTypes/%s", pl.zone, machineType)
	}
	iface := &computepb.NetworkInterface{
		AccessConfigs: []*computepb.AccessConfig{{
			Name: proto.String("External NAT"),
			Type: proto.String(computepb.AccessConfig_ONE_TO_ONE_NAT.String()),
		}},
	}
	if s.IPv6 != nil {
		// An external /96 of the subnetwork's, which only the premium
		// tier offers; the VM's own cloud-init has Squid leave from it.
		iface.StackType = proto.String(computepb.NetworkInterface_IPV4_IPV6.String())
		iface.Ipv6AccessConfigs = []*computepb.AccessConfig{{
			Name:        proto.String("External IPv6"),
			Type:        proto.String(computepb.AccessConfig_DIRECT_IPV6.String()),
			NetworkTier: proto.String(computepb.AccessConfig_PREMIUM.String()),
		}}
		if req.CloudInit == "" {
			labels[sessionAddressesLabel] = strconv.Itoa(s.IPv6.Count())
		}
	}
	if s.Network != "" {
		iface.Network = proto.String(s.Network)
	}
	if s.Subnetwork != "" {
		iface.Subnetwork = proto.String(s.Subnetwork)
	}
	disk := &computepb.AttachedDiskInitializeParams{SourceImage: proto.String(pl.image)}
	if pl.diskSizeGB > 0 {
		disk.DiskSizeGb = proto.Int64(pl.diskSizeGB)
	}
	vm := &computepb.Instance{
		Name:        proto.String(req.Name),
		MachineType: proto.String(machineType),
		Labels:      labels,
		Disks: []*computepb.AttachedDisk{{
			Boot: proto.Bool(true), AutoDelete: proto.Bool(true), InitializeParams: disk,
		}},
		NetworkInterfaces: []*computepb.NetworkInterface{iface},
		Metadata: &computepb.Metadata{Items: []*computepb.Items{
			{Key: proto.String("user-data"), Value: proto.String(userData)},
			{Key: proto.String(leaseKeySecretMetadataKey), Value: proto.String(key.Args[0])},
			{Key: proto.String(leaseKeyFetchMetadataKey), Value: proto.String(squidconf.LeaseKeyFetcher)},
			{Key: proto.String(leaseAuthMetadataKey), Value: proto.String(squidconf.LeaseAuthHelper)},
		}},
		Tags: &computepb.Tags{Items: append([]string{TargetTag(p.name)}, s.NetworkTags...)},
	}
	scopes := s.Scopes
	if len(scopes) == 0 {
		scopes = []string{cloudPlatformScope}
	}
	vm.ServiceAccounts = []*computepb.ServiceAccount{{Email: proto.String(s.ServiceAccount), Scopes: scopes}}
	if pl.spot {
		vm.Scheduling = &computepb.Scheduling{
			ProvisioningModel:         proto.String(computepb.Scheduling_SPOT.String()),
			InstanceTerminationAction: proto.String(computepb.Scheduling_DELETE.String()),
		}
	}
	return vm
}

// externalIPv6PrefixLength is the range GCE gives a VM's interface of its
// subnetwork's external IPv6 /64.
const externalIPv6PrefixLength = 96

// instanceOf maps a VM to the provider-neutral instance view.
func instanceOf(vm *computepb.Instance) (*providers.Instance, error) {
	inst := &providers.Instance{
		Name:     vm.GetName(),
		Location: lastSegment(vm.GetZone()),
		Labels:   fromGCELabels(vm.GetLabels()),
		Message:  vm.GetStatusMessage(),
	}
	if port, err := strconv.Atoi(vm.GetLabels()[portLabel]); err == nil {
		inst.Port = int32(port)
	}
	if ts := vm.GetCreationTimestamp(); ts != "" {
		created, err := time.Parse(time.RFC3339, ts)
		if err != nil {
			return nil, fmt.Errorf("VM %s has creationTimestamp %q: %w", vm.GetName(), ts, err)
		}
		inst.CreatedAt = created
	}
	for _, iface := range vm.GetNetworkInterfaces() {
		for _, ac := range iface.GetAccessConfigs() {
			if ip := ac.GetNatIP(); ip != "" && inst.IP == "" {
				inst.IP = ip
			}
		}
		for _, ac := range iface.GetIpv6AccessConfigs() {
			if ip := ac.GetExternalIpv6(); ip != "" && inst.IPv6Prefix == "" {
				inst.IPv6Prefix = fmt.Sprintf("%s/%d", ip, cmp.Or(ac.GetExternalIpv6PrefixLength(), externalIPv6PrefixLength))
			}
		}
	}
	if n, err := strconv.Atoi(vm.GetLabels()[sessionAddressesLabel]); err == nil && inst.IPv6Prefix != "" {
		inst.SessionAddresses = int32(n)
	}
	switch vm.GetStatus() {
	case "PROVISIONING", "STAGING", "REPAIRING":
		inst.State = providers.StatePending
	case "RUNNING":
		inst.State = providers.StateRunning
		if inst.IP == "" {
			inst.State, inst.Message = providers.StatePending, "running, waiting for an external IP"
		}
	case "STOPPING", "SUSPENDING":
		inst.State = providers.StateStopping
	default: // TERMINATED, SUSPENDED, and anything new: not serving, replace it
		inst.State = providers.StateFailed
		inst.Message = fmt.Sprintf("VM status %s %s", vm.GetStatus(), vm.GetStatusMessage())
	}
	return inst, nil
}

func lastSegment(url string) string {
	return url[strings.LastIndex(url, "/")+1:]
}

func or(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
