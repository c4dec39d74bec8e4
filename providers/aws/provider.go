// Package aws is the provider that runs Managed proxies as EC2 instances
// with a public IPv4 address, through aws-sdk-go-v2 and the SDK's default
// credential chain (IRSA or EKS Pod Identity in a cluster: no key
// plumbing). Like gcp, it starts work and never waits: the reconciler reads
// an instance's state on its next pass. Instances are found by their tags
// (cluster id, operator id, provider instance, owner, spec hash) and
// created under a ClientToken derived from the Proxy's UID and spec hash,
// so a retried create is a no-op; IMDSv2 is required on every instance,
// and its Squid is the hardened one every Managed proxy runs, with the
// proxy's credentials, through user-data. It must never import the
// controllers.
package aws

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/aws-sdk-go-v2/service/ssm"
	"github.com/aws/smithy-go"
	"github.com/google/uuid"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/providers"
	"github.com/example/egress-proxies-operator/providers/squidconf"
)

// Type is this provider's type name in the providers config.
const Type = "aws"

// DefaultRequestTimeout bounds each EC2 API call: the SDK retries by
// itself, and a reconcile must not block behind it.
const DefaultRequestTimeout = 30 * time.Second

// Settings are an aws provider instance's settings in the providers config.
type Settings struct {
	// Region the instances live in. Required.
	Region string `json:"region"`
	// Zone (an Availability Zone), InstanceType and ImageID (an AMI of
	// Debian or Ubuntu) are defaults for Proxies whose placement leaves
	// them out (spec.placement.zone, machineType, image).
	Zone         string `json:"zone,omitempty"`
	InstanceType string `json:"instanceType,omitempty"`
	ImageID      string `json:"imageId,omitempty"`
	// SubnetID the instances' interface attaches to (default: the zone's
	// default subnet); VPCID the security group lives in (default: the
	// default VPC).
	SubnetID string `json:"subnetId,omitempty"`
	VPCID    string `json:"vpcId,omitempty"`
	// InstanceProfile is the IAM instance profile of the instances.
	// Required: each instance fetches its lease key from SSM Parameter
	// Store with its role, which needs ssm:GetParameter on the operator's
	// parameters (/egress-proxy/*); the account's aws/ssm key decrypts.
	InstanceProfile string `json:"instanceProfile"`
	// SecurityGroup is the ingress the operator keeps for these
	// instances. Required.
	SecurityGroup *SecurityGroupSettings `json:"securityGroup"`
	// Tags are extra tags on every instance (for billing, say).
	Tags map[string]string `json:"tags,omitempty"`
	// IPv6 gives every instance a delegated IPv6 /80 of its subnet (which
	// must have an IPv6 CIDR: subnetId is then required, and the instance
	// type must be Nitro-based): Squid leaves from ipv6.sessionAddresses
	// addresses of it, one per gateway session, to sites with an IPv6
	// address. Every instance of a subnet shares its /64, which sites
	// count as one sender (and the operator does, --ipv6-identity-prefix):
	// more senders take more subnets.
	IPv6 *squidconf.IPv6Egress `json:"ipv6,omitempty"`
	// Endpoint overrides the EC2 endpoint (private endpoints, tests).
	Endpoint string `json:"endpoint,omitempty"`
	// SSMEndpoint overrides the SSM endpoint, for the operator and the
	// instances alike (private endpoints, tests). Default: the region's,
	// https://ssm.<region>.amazonaws.com.
	SSMEndpoint string `json:"ssmEndpoint,omitempty"`
	// WithoutAuthentication signs with a fixed fake key: for emulators and
	// tests only, and only together with Endpoint.
	WithoutAuthentication bool `json:"withoutAuthentication,omitempty"`
	// RequestTimeout bounds each API call, as a Go duration. Default: 30s.
	RequestTimeout string `json:"requestTimeout,omitempty"`
}

// Provider runs proxies as EC2 instances.
type Provider struct {
	name     string
	settings Settings
	timeout  time.Duration
	ec2      *ec2.Client
	ssm      *ssm.Client

	mu sync.Mutex
	// groupID is the security group's id once found or made.
	groupID string
}

var (
	_ providers.Provider   = (*Provider)(nil)
	_ providers.Firewalled = (*Provider)(nil)
)

// New builds an aws provider instance from its settings, with the SDK's
// default credential chain. It connects nowhere.
func New(name string, raw map[string]any, _ providers.Dependencies) (providers.Provider, error) {
	var s Settings
	if err := providers.DecodeSettings(raw, &s); err != nil {
		return nil, err
	}
	return NewFromSettings(name, s)
}

// NewFromSettings builds a provider from decoded settings.
func NewFromSettings(name string, s Settings) (*Provider, error) {
	var errs []error
	if s.Region == "" {
		errs = append(errs, errors.New("settings.region is required"))
	}
	if s.WithoutAuthentication && (s.Endpoint == "" || s.SSMEndpoint == "") {
		errs = append(errs, errors.New("settings.withoutAuthentication needs settings.endpoint and settings.ssmEndpoint: it is for emulators only"))
	}
	if s.InstanceProfile == "" {
		errs = append(errs, errors.New("settings.instanceProfile is required: each instance fetches its lease key from SSM Parameter Store with its role"))
	}
	for k := range s.Tags {
		if strings.HasPrefix(k, "crawl.example.com/") || strings.HasPrefix(strings.ToLower(k), "aws:") || k == "Name" {
			errs = append(errs, fmt.Errorf("settings.tags[%q]: keys under crawl.example.com/, aws: and Name are the operator's or AWS's", k))
		}
	}
	if err := s.SecurityGroup.validate(); err != nil {
		errs = append(errs, err)
	}
	if err := s.IPv6.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("settings.%w", err))
	}
	if s.IPv6 != nil && s.SubnetID == "" {
		errs = append(errs, errors.New("settings.ipv6 needs settings.subnetId: a subnet with an IPv6 CIDR, which default subnets do not have"))
	}
	timeout := DefaultRequestTimeout
	if s.RequestTimeout != "" {
		d, err := time.ParseDuration(s.RequestTimeout)
		if err != nil || d <= 0 {
			errs = append(errs, fmt.Errorf("settings.requestTimeout: %q is not a positive duration", s.RequestTimeout))
		}
		timeout = d
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	opts := []func(*config.LoadOptions) error{config.WithRegion(s.Region)}
	if s.WithoutAuthentication {
		opts = append(opts, config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider(fakeAccessKey, fakeSecretKey, "")))
	}
	cfg, err := config.LoadDefaultConfig(context.Background(), opts...)
	if err != nil {
		return nil, fmt.Errorf("loading the AWS configuration (the SDK's default chain: IRSA, EKS Pod Identity, environment, shared files): %w", err)
	}
	client := ec2.NewFromConfig(cfg, func(o *ec2.Options) {
		if s.Endpoint != "" {
			o.BaseEndpoint = awssdk.String(s.Endpoint)
		}
	})
	parameters := ssm.NewFromConfig(cfg, func(o *ssm.Options) {
		if s.SSMEndpoint != "" {
			o.BaseEndpoint = awssdk.String(s.SSMEndpoint)
		}
	})
	return &Provider{name: name, settings: s, timeout: timeout, ec2: client, ssm: parameters}, nil
}

// placement is a Proxy's placement with the instance defaults applied.
type placement struct {
	zone, instanceType, image string
	spot                      bool
}

// Parameters a Proxy may set in spec.placement.parameters for this provider.
const (
	// paramMarketType is on-demand (default) or spot.
	paramMarketType = "marketType"
)

// resolvePlacement applies defaults and names the first missing field.
func (p *Provider) resolvePlacement(proxy *crawlv1alpha1.Proxy) (placement, error) {
	placed, err := providers.ResolvePlacement("aws provider "+p.name,
		providers.Placed{Zone: p.settings.Zone, MachineType: p.settings.InstanceType, Image: p.settings.ImageID}, proxy)
	pl := placement{zone: placed.Zone, instanceType: placed.MachineType, image: placed.Image}
	if err != nil {
		return pl, err
	}
	params := placed.Parameters
	for key, value := range params {
		switch key {
		case paramMarketType:
			switch value {
			case "on-demand":
			case "spot":
				pl.spot = true
			default:
				return pl, providers.Terminal("placement.parameters.%s must be on-demand or spot, got %q", key, value)
			}
		default:
			return pl, providers.Terminal("placement.parameters.%s is not known to aws provider %s (known: %s)", key, p.name, paramMarketType)
		}
	}
	return pl, nil
}

// Validate checks the placement, and that the security group opens the
// Proxy's port, without calling the API.
func (p *Provider) Validate(proxy *crawlv1alpha1.Proxy) error {
	if _, err := p.resolvePlacement(proxy); err != nil {
		return err
	}
	if ports := p.settings.SecurityGroup.ports(); !slices.Contains(ports, proxy.Spec.Port) {
		return providers.Terminal("spec.port %d is not opened by aws provider %s's security group (settings.securityGroup.ports: %v): use one of those ports or add it to the providers config",
			proxy.Spec.Port, p.name, ports)
	}
	return nil
}

// Tags the operator reads back from an instance, beside its labels, and
// the one naming its lease key's parameter (for a user's own cloud-init).
const (
	tagName     = "Name"
	tagPort     = "crawl.example.com/port"
	tagLeaseKey = "crawl.example.com/lease-key-parameter"
	// tagSessionAddresses: how many addresses of its IPv6 prefix the
	// instance's Squid leaves from (settings.ipv6 when it was made).
	tagSessionAddresses = "crawl.example.com/session-addresses"
)

// liveStates are the instance states Get and List see: a terminated
// instance is gone, as a deleted VM is on GCE.
var liveStates = []string{"pending", "running", "shutting-down", "stopping", "stopped"}

// Get finds the instance called name by its tags, in any zone.
func (p *Provider) Get(ctx context.Context, name string, _ *crawlv1alpha1.Proxy) (*providers.Instance, error) {
	found, err := p.describe(ctx, []types.Filter{
		{Name: awssdk.String("tag:" + tagName), Values: []string{name}},
		{Name: awssdk.String("tag:" + crawlv1alpha1.LabelProvider), Values: []string{p.name}},
	})
	if err != nil {
		return nil, err
	}
	if len(found) == 0 {
		return nil, fmt.Errorf("%w: EC2 instance %s in %s", providers.ErrNotFound, name, p.settings.Region)
	}
	return &found[0], nil
}

// Create runs the instance under a ClientToken derived from the Proxy's
// UID and spec hash, so a create retried after a lost reply returns the
// first instance instead of a second one. EC2 keeps answering a token with
// its instance after that instance is terminated: Create then runs under
// the spec's next token, as gcp does with requestIds.
func (p *Provider) Create(ctx context.Context, req providers.CreateRequest) error {
	pl, err := p.resolvePlacement(req.Proxy)
	if err != nil {
		return err
	}
	if req.Credentials.IsZero() {
		return providers.ErrNoCredentials
	}
	userData, err := squidconf.VMUserData(req.CloudInit, squidconf.VMParams{Owner: req.Owner(), Port: req.Proxy.Spec.Port,
		AllowedSources: p.settings.SecurityGroup.SourceRanges, IPv6: p.settings.IPv6,
		LeaseKey: squidconf.ParameterStoreKey(ParameterName(req.Name), p.settings.Region, p.ssmURL())})
	if err != nil {
		return providers.Terminal("%v", err)
	}
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	if err := p.putLeaseKey(ctx, req, req.LeaseKeyFile()); err != nil {
		return err
	}
	group, err := p.securityGroupID(ctx)
	if err != nil {
		return err
	}
	return providers.CreateUnderKeys(clientTokenNamespace, req, fmt.Sprintf("running instance %s in %s", req.Name, pl.zone), func(token string) (bool, error) {
		out, err := p.ec2.RunInstances(ctx, p.runInput(req, pl, userData, group, token))
		if err != nil {
			return false, classify(fmt.Errorf("running instance %s in %s: %w", req.Name, pl.zone, err))
		}
		// The token's instance was terminated since: run under the next.
		return len(out.Instances) > 0 && out.Instances[0].State != nil && out.Instances[0].State.Name == types.InstanceStateNameTerminated, nil
	})
}

// ClientToken is the RunInstances token for a Proxy's spec after the
// instance replaces (providers.IdempotencyKey), stable across retries;
// attempt numbers the instances since that one (see Create).
func ClientToken(uid, specHash, replaces string, attempt int) string {
	return providers.IdempotencyKey(clientTokenNamespace, uid, specHash, replaces, attempt)
}

var clientTokenNamespace = uuid.MustParse("8d0b9c6e-2f4a-4e1b-a7c3-91e5d2f0b6a4")

// runInput is the RunInstances request for req: one instance, one
// interface with a public IPv4 in the operator's security group, IMDSv2
// required, the user-data, and the operator's tags on the instance.
func (p *Provider) runInput(req providers.CreateRequest, pl placement, userData, group, token string) *ec2.RunInstancesInput {
	tags := []types.Tag{{Key: awssdk.String(tagName), Value: awssdk.String(req.Name)},
		{Key: awssdk.String(tagPort), Value: awssdk.String(strconv.Itoa(int(req.Proxy.Spec.Port)))},
		{Key: awssdk.String(tagLeaseKey), Value: awssdk.String(ParameterName(req.Name))}}
	for _, k := range sortedKeys(req.Labels) {
		tags = append(tags, types.Tag{Key: awssdk.String(k), Value: awssdk.String(req.Labels[k])})
	}
	tags = append(tags, types.Tag{Key: awssdk.String(crawlv1alpha1.LabelProvider), Value: awssdk.String(p.name)})
	for _, k := range sortedKeys(p.settings.Tags) {
		tags = append(tags, types.Tag{Key: awssdk.String(k), Value: awssdk.String(p.settings.Tags[k])})
	}
	iface := types.InstanceNetworkInterfaceSpecification{
		DeviceIndex: awssdk.Int32(0), AssociatePublicIpAddress: awssdk.Bool(true), DeleteOnTermination: awssdk.Bool(true),
		Groups: []string{group},
	}
	if p.settings.SubnetID != "" {
		iface.SubnetId = awssdk.String(p.settings.SubnetID)
	}
	if p.settings.IPv6 != nil {
		// One delegated /80 of the subnet's /64 (prefix delegation).
		iface.Ipv6PrefixCount = awssdk.Int32(1)
		if req.CloudInit == "" {
			tags = append(tags, types.Tag{Key: awssdk.String(tagSessionAddresses), Value: awssdk.String(strconv.Itoa(p.settings.IPv6.Count()))})
		}
	}
	in := &ec2.RunInstancesInput{
		ImageId: awssdk.String(pl.image), InstanceType: types.InstanceType(pl.instanceType),
		MinCount: awssdk.Int32(1), MaxCount: awssdk.Int32(1), ClientToken: awssdk.String(token),
		Placement:         &types.Placement{AvailabilityZone: awssdk.String(pl.zone)},
		NetworkInterfaces: []types.InstanceNetworkInterfaceSpecification{iface},
		MetadataOptions: &types.InstanceMetadataOptionsRequest{
			HttpTokens: types.HttpTokensStateRequired, HttpEndpoint: types.InstanceMetadataEndpointStateEnabled, HttpPutResponseHopLimit: awssdk.Int32(1),
		},
		UserData:          awssdk.String(base64.StdEncoding.EncodeToString([]byte(userData))),
		TagSpecifications: []types.TagSpecification{{ResourceType: types.ResourceTypeInstance, Tags: tags}},
	}
	if p.settings.InstanceProfile != "" {
		in.IamInstanceProfile = &types.IamInstanceProfileSpecification{Name: awssdk.String(p.settings.InstanceProfile)}
	}
	if pl.spot {
		in.InstanceMarketOptions = &types.InstanceMarketOptionsRequest{
			MarketType: types.MarketTypeSpot,
			SpotOptions: &types.SpotMarketOptions{
				SpotInstanceType: types.SpotInstanceTypeOneTime, InstanceInterruptionBehavior: types.InstanceInterruptionBehaviorTerminate,
			},
		}
	}
	return in
}

// Delete deletes the instance's lease key parameter and terminates the
// instance, reading it first: a parameter or instance already gone is
// fine, and only one this provider instance made is terminated.
func (p *Provider) Delete(ctx context.Context, inst *providers.Instance) error {
	id := instanceID(inst)
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	if err := p.deleteLeaseKey(ctx, inst.Name); err != nil {
		return err
	}
	found, err := p.describe(ctx, []types.Filter{{Name: awssdk.String("instance-id"), Values: []string{id}},
		{Name: awssdk.String("tag:" + crawlv1alpha1.LabelProvider), Values: []string{p.name}}})
	if err != nil {
		return err
	}
	if len(found) == 0 {
		return nil // gone already, or not this provider instance's
	}
	if _, err := p.ec2.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{id}}); err != nil && !isNotFound(err) {
		return classify(fmt.Errorf("terminating instance %s (%s): %w", inst.Name, id, err))
	}
	return nil
}

// List returns every live instance in the region tagged with owner and
// this provider instance's name.
func (p *Provider) List(ctx context.Context, owner providers.Owner) ([]providers.Instance, error) {
	return p.describe(ctx, []types.Filter{
		{Name: awssdk.String("tag:" + crawlv1alpha1.LabelClusterID), Values: []string{owner.ClusterID}},
		{Name: awssdk.String("tag:" + crawlv1alpha1.LabelOperatorID), Values: []string{owner.OperatorID}},
		{Name: awssdk.String("tag:" + crawlv1alpha1.LabelProvider), Values: []string{p.name}},
	})
}

// describe lists the live instances matching filters, every page.
func (p *Provider) describe(ctx context.Context, filters []types.Filter) ([]providers.Instance, error) {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	filters = append(filters, types.Filter{Name: awssdk.String("instance-state-name"), Values: liveStates})
	pages := ec2.NewDescribeInstancesPaginator(p.ec2, &ec2.DescribeInstancesInput{Filters: filters})
	var out []providers.Instance
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return nil, classify(fmt.Errorf("describing EC2 instances: %w", err))
		}
		for _, r := range page.Reservations {
			for _, in := range r.Instances {
				out = append(out, instanceOf(in))
			}
		}
	}
	return out, nil
}

// instanceOf maps an EC2 instance to the provider-neutral view; Location
// is "<zone>/<instance id>".
func instanceOf(in types.Instance) providers.Instance {
	labels := map[string]string{}
	name := ""
	var port, sessionAddresses int32
	for _, t := range in.Tags {
		k, v := awssdk.ToString(t.Key), awssdk.ToString(t.Value)
		switch {
		case k == tagName:
			name = v
		case k == tagPort:
			if n, err := strconv.Atoi(v); err == nil {
				port = int32(n)
			}
		case k == tagSessionAddresses:
			if n, err := strconv.Atoi(v); err == nil {
				sessionAddresses = int32(n)
			}
		case strings.HasPrefix(k, "crawl.example.com/"):
			labels[k] = v
		}
	}
	zone := ""
	if in.Placement != nil {
		zone = awssdk.ToString(in.Placement.AvailabilityZone)
	}
	out := providers.Instance{Name: name, Location: zone + "/" + awssdk.ToString(in.InstanceId), IP: awssdk.ToString(in.PublicIpAddress),
		Port: port, Labels: labels, CreatedAt: awssdk.ToTime(in.LaunchTime)}
	for _, iface := range in.NetworkInterfaces {
		for _, prefix := range iface.Ipv6Prefixes {
			if out.IPv6Prefix == "" {
				out.IPv6Prefix, out.SessionAddresses = awssdk.ToString(prefix.Ipv6Prefix), sessionAddresses
			}
		}
	}
	state := types.InstanceStateNamePending
	if in.State != nil {
		state = in.State.Name
	}
	reason := ""
	if in.StateReason != nil {
		reason = awssdk.ToString(in.StateReason.Message)
	}
	switch state {
	case types.InstanceStateNamePending:
		out.State = providers.StatePending
	case types.InstanceStateNameRunning:
		out.State = providers.StateRunning
		if out.IP == "" {
			out.State, out.Message = providers.StatePending, "running, waiting for a public IPv4 address"
		}
	case types.InstanceStateNameShuttingDown:
		out.State, out.Message = providers.StateStopping, "shutting-down"
	default: // stopping, stopped: not serving, replace it
		out.State = providers.StateFailed
		out.Message = strings.TrimSpace(fmt.Sprintf("EC2 instance %s %s", state, reason))
	}
	return out
}

// instanceID is the EC2 id of an instance Get or List returned.
func instanceID(inst *providers.Instance) string {
	return inst.Location[strings.LastIndex(inst.Location, "/")+1:]
}

// Error codes EC2 answers that the provider tells apart.
var (
	notFoundCodes = []string{"InvalidInstanceID.NotFound", "InvalidGroup.NotFound"}
	capacityCodes = []string{"InsufficientInstanceCapacity", "InsufficientCapacity", "SpotMaxPriceTooLow", "MaxSpotInstanceCountExceeded", "InsufficientHostCapacity"}
	quotaCodes    = []string{"InstanceLimitExceeded", "VcpuLimitExceeded", "AddressLimitExceeded", "InsufficientFreeAddressesInSubnet"}
	retryCodes    = []string{"RequestLimitExceeded", "Unavailable", "InternalError", "ServiceUnavailable"}
)

// classify maps an API error to the provider error kinds: not found; 5xx,
// throttling and transport errors transient; capacity and quota terminal
// and marked so; other 4xx terminal, with EC2's message.
func classify(err error) error {
	var apiErr smithy.APIError
	if !errors.As(err, &apiErr) {
		return providers.Transient(err)
	}
	code := apiErr.ErrorCode()
	var status interface{ HTTPStatusCode() int }
	switch {
	case slices.Contains(notFoundCodes, code):
		return fmt.Errorf("%w: %w", providers.ErrNotFound, err)
	case slices.Contains(retryCodes, code) || errors.As(err, &status) && status.HTTPStatusCode() >= http.StatusInternalServerError:
		return providers.Transient(err)
	case slices.Contains(capacityCodes, code):
		return providers.Capacity("%s: %s", code, apiErr.ErrorMessage())
	case slices.Contains(quotaCodes, code):
		return providers.Quota("quota exceeded: %s: %s", code, apiErr.ErrorMessage())
	}
	return providers.Terminal("%s: %s", code, apiErr.ErrorMessage())
}

func isNotFound(err error) bool {
	var apiErr smithy.APIError
	return errors.As(err, &apiErr) && slices.Contains(notFoundCodes, apiErr.ErrorCode())
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
