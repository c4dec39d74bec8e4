// Package gcp is the provider that runs Managed proxies as Compute Engine
// VMs with ephemeral external IPs, through the cloud.google.com/go/compute
// REST client and Application Default Credentials. It starts operations and
// never waits on them: the reconciler reads the VM's status on its next pass.
// It must never import the controllers.
package gcp

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	compute "cloud.google.com/go/compute/apiv1"
	"cloud.google.com/go/compute/apiv1/computepb"
	secretmanager "cloud.google.com/go/secretmanager/apiv1"
	"github.com/google/uuid"
	"google.golang.org/api/iterator"
	"google.golang.org/api/option"
	"google.golang.org/protobuf/proto"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/providers"
	"github.com/example/egress-proxies-operator/providers/squidconf"
)

// Type is this provider's type name in the providers config.
const Type = "gcp"

// DefaultRequestTimeout bounds each Compute API call. The client library
// retries 503s for up to ten minutes by itself; a reconcile must not block
// that long, so the provider gives up sooner and the reconciler backs off.
const DefaultRequestTimeout = 30 * time.Second

// Settings are a gcp provider instance's settings in the providers config.
type Settings struct {
	// Project is the GCP project the VMs live in. Required.
	Project string `json:"project"`
	// Zone, MachineType and Image are defaults for Proxies whose placement
	// leaves them out.
	Zone        string `json:"zone,omitempty"`
	MachineType string `json:"machineType,omitempty"`
	Image       string `json:"image,omitempty"`
	// Network and Subnetwork the VM's one interface attaches to. Default: the
	// project's default network.
	Network    string `json:"network,omitempty"`
	Subnetwork string `json:"subnetwork,omitempty"`
	// ServiceAccount attached to the VMs, with Scopes (default:
	// cloud-platform, which IAM then narrows). Required: each VM fetches
	// its lease key from Secret Manager as this account, which needs
	// roles/secretmanager.secretAccessor on the operator's secrets
	// (egress-proxy-*); attaching it needs roles/iam.serviceAccountUser.
	ServiceAccount string   `json:"serviceAccount"`
	Scopes         []string `json:"scopes,omitempty"`
	// NetworkTags are extra network tags on every VM. The operator adds
	// its own (TargetTag), which its firewall rule targets.
	NetworkTags []string `json:"networkTags,omitempty"`
	// Firewall is the ingress rule the operator keeps for these VMs.
	// Required.
	Firewall *FirewallSettings `json:"firewall"`
	// Labels are extra GCE labels on every VM (for billing, say).
	Labels map[string]string `json:"labels,omitempty"`
	// IPv6 makes every VM dual-stack (stackType IPV4_IPV6) with an
	// external /96 from its subnetwork, which must be dual-stack with
	// external IPv6 access: Squid leaves from ipv6.sessionAddresses
	// addresses of it, one per gateway session, to sites with an IPv6
	// address. Every VM of a subnetwork shares its /64, which sites count
	// as one sender (and the operator does, --ipv6-identity-prefix): more
	// senders take more subnetworks.
	IPv6 *squidconf.IPv6Egress `json:"ipv6,omitempty"`
	// Endpoint overrides the Compute API endpoint (private endpoints, tests).
	Endpoint string `json:"endpoint,omitempty"`
	// SecretManagerEndpoint overrides the Secret Manager endpoint, for the
	// operator and the VMs alike (private endpoints, tests). Default:
	// https://secretmanager.googleapis.com.
	SecretManagerEndpoint string `json:"secretManagerEndpoint,omitempty"`
	// WithoutAuthentication sends no credentials: for emulators and tests
	// only, and only together with Endpoint.
	WithoutAuthentication bool `json:"withoutAuthentication,omitempty"`
	// RequestTimeout bounds each API call, as a Go duration. Default: 30s.
	RequestTimeout string `json:"requestTimeout,omitempty"`
}

// Provider runs proxies as Compute Engine VMs.
type Provider struct {
	name      string
	settings  Settings
	timeout   time.Duration
	instances *compute.InstancesClient
	firewalls *compute.FirewallsClient
	secrets   *secretmanager.Client
}

var (
	_ providers.Provider   = (*Provider)(nil)
	_ providers.Firewalled = (*Provider)(nil)
)

var gceLabelPattern = regexp.MustCompile(`^[a-z][-_a-z0-9]{0,62}$`)
var gceLabelValuePattern = regexp.MustCompile(`^[-_a-z0-9]{0,63}$`)

// New builds a gcp provider instance from its settings, with Application
// Default Credentials.
func New(name string, raw map[string]any, _ providers.Dependencies) (providers.Provider, error) {
	var s Settings
	if err := providers.DecodeSettings(raw, &s); err != nil {
		return nil, err
	}
	var opts []option.ClientOption
	if s.WithoutAuthentication {
		opts = append(opts, option.WithoutAuthentication())
	}
	return NewWithClientOptions(name, s, opts...)
}

// NewWithClientOptions builds a provider with explicit client options, for
// tests that point the real clients at a fake Compute API: opts apply to
// both clients, after the settings' Compute endpoint and before their
// Secret Manager endpoint.
func NewWithClientOptions(name string, s Settings, opts ...option.ClientOption) (*Provider, error) {
	var errs []error
	if s.Project == "" {
		errs = append(errs, errors.New("settings.project is required"))
	}
	if s.ServiceAccount == "" {
		errs = append(errs, errors.New("settings.serviceAccount is required: each VM fetches its lease key from Secret Manager as that account"))
	}
	if len(s.Scopes) > 0 && !slices.Contains(s.Scopes, cloudPlatformScope) {
		errs = append(errs, fmt.Errorf("settings.scopes must include %s: Secret Manager takes no narrower scope (leave scopes out for the default)", cloudPlatformScope))
	}
	if s.WithoutAuthentication && (s.Endpoint == "" || s.SecretManagerEndpoint == "") {
		errs = append(errs, errors.New("settings.withoutAuthentication needs settings.endpoint and settings.secretManagerEndpoint: it is for emulators only"))
	}
	for k, v := range s.Labels {
		if !gceLabelPattern.MatchString(k) || !gceLabelValuePattern.MatchString(v) || strings.HasPrefix(k, "crawl-") {
			errs = append(errs, fmt.Errorf("settings.labels[%q]: GCE labels are lowercase letters, digits, '-' and '_' (keys start with a letter, at most 63 characters), and keys starting with crawl- are the operator's", k))
		}
	}
	if err := s.Firewall.validate(); err != nil {
		errs = append(errs, err)
	}
	if err := s.IPv6.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("settings.%w", err))
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
	var computeOpts, secretsOpts []option.ClientOption
	if s.Endpoint != "" {
		computeOpts = append(computeOpts, option.WithEndpoint(s.Endpoint))
	}
	computeOpts = append(computeOpts, opts...)
	secretsOpts = append(secretsOpts, opts...)
	if s.SecretManagerEndpoint != "" {
		secretsOpts = append(secretsOpts, option.WithEndpoint(s.SecretManagerEndpoint))
	}
	instances, err := compute.NewInstancesRESTClient(context.Background(), computeOpts...)
	if err != nil {
		return nil, fmt.Errorf("creating the Compute Engine client (credentials are Application Default Credentials): %w", err)
	}
	firewalls, err := compute.NewFirewallsRESTClient(context.Background(), computeOpts...)
	if err != nil {
		_ = instances.Close()
		return nil, fmt.Errorf("creating the Compute Engine firewalls client: %w", err)
	}
	secrets, err := secretmanager.NewRESTClient(context.Background(), secretsOpts...)
	if err != nil {
		_ = instances.Close()
		_ = firewalls.Close()
		return nil, fmt.Errorf("creating the Secret Manager client: %w", err)
	}
	return &Provider{name: name, settings: s, timeout: timeout, instances: instances, firewalls: firewalls, secrets: secrets}, nil
}

// Close releases the clients' connections.
func (p *Provider) Close() error {
	return errors.Join(p.instances.Close(), p.firewalls.Close(), p.secrets.Close())
}

// placement is a Proxy's placement with the instance defaults applied.
type placement struct {
	zone, machineType, image string
	spot                     bool
	diskSizeGB               int64
}

// Parameters a Proxy may set in spec.placement.parameters for this provider.
const (
	paramProvisioningModel = "provisioningModel" // STANDARD (default) or SPOT
	paramDiskSizeGB        = "diskSizeGb"        // boot disk size; default: the image's
)

// resolvePlacement applies defaults and names the first missing field.
func (p *Provider) resolvePlacement(proxy *crawlv1alpha1.Proxy) (placement, error) {
	placed, err := providers.ResolvePlacement("gcp provider "+p.name,
		providers.Placed{Zone: p.settings.Zone, MachineType: p.settings.MachineType, Image: p.settings.Image}, proxy)
	pl := placement{zone: placed.Zone, machineType: placed.MachineType, image: placed.Image}
	if err != nil {
		return pl, err
	}
	params := placed.Parameters
	for key, value := range params {
		switch key {
		case paramProvisioningModel:
			switch value {
			case "STANDARD":
			case "SPOT":
				pl.spot = true
			default:
				return pl, providers.Terminal("placement.parameters.%s must be STANDARD or SPOT, got %q", key, value)
			}
		case paramDiskSizeGB:
			n, err := strconv.ParseInt(value, 10, 64)
			if err != nil || n < 10 || n > 65536 {
				return pl, providers.Terminal("placement.parameters.%s must be a whole number of GB from 10 to 65536, got %q", key, value)
			}
			pl.diskSizeGB = n
		default:
			return pl, providers.Terminal("placement.parameters.%s is not known to gcp provider %s (known: %s, %s)", key, p.name, paramProvisioningModel, paramDiskSizeGB)
		}
	}
	return pl, nil
}

// Validate checks the placement, and that the firewall opens the Proxy's
// port, without calling the API.
func (p *Provider) Validate(proxy *crawlv1alpha1.Proxy) error {
	if _, err := p.resolvePlacement(proxy); err != nil {
		return err
	}
	if ports := p.settings.Firewall.ports(); !slices.Contains(ports, proxy.Spec.Port) {
		return providers.Terminal("spec.port %d is not opened by gcp provider %s's firewall (settings.firewall.ports: %v): use one of those ports or add it to the providers config",
			proxy.Spec.Port, p.name, ports)
	}
	return nil
}

// Get reads the VM in the Proxy's zone, and searches every zone when it is
// not there: a placement change leaves the old VM in its old zone until it is
// deleted.
func (p *Provider) Get(ctx context.Context, name string, proxy *crawlv1alpha1.Proxy) (*providers.Instance, error) {
	if pl, err := p.resolvePlacement(proxy); err == nil {
		ctx, cancel := context.WithTimeout(ctx, p.timeout)
		vm, err := p.instances.Get(ctx, &computepb.GetInstanceRequest{Project: p.settings.Project, Zone: pl.zone, Instance: name})
		cancel()
		switch {
		case err == nil:
			return instanceOf(vm)
		case !isNotFound(err):
			return nil, classify(fmt.Errorf("getting VM %s in %s: %w", name, pl.zone, err))
		}
	}
	found, err := p.aggregatedList(ctx, fmt.Sprintf("name = %q", name))
	if err != nil {
		return nil, err
	}
	if len(found) == 0 {
		return nil, fmt.Errorf("%w: VM %s in project %s", providers.ErrNotFound, name, p.settings.Project)
	}
	return &found[0], nil
}

// Create inserts the VM. The requestId is derived from the Proxy's UID and
// spec hash, so an insert retried after a lost reply is a no-op on the
// server; an operation that already failed is reported with its error.
//
// GCE remembers a requestId for an hour at least: when the spec's VM was
// lost and deleted, inserting it again under the same requestId would only
// replay the first, finished operation and create nothing. Create sees that
// (a DONE operation and no VM) and inserts under the spec's next requestId
// (providers.CreateUnderKeys); the keys are salted with the instance the
// create replaces, so a Proxy may be replaced any number of times.
func (p *Provider) Create(ctx context.Context, req providers.CreateRequest) error {
	pl, err := p.resolvePlacement(req.Proxy)
	if err != nil {
		return err
	}
	if req.Credentials.IsZero() {
		return providers.ErrNoCredentials
	}
	keySource := squidconf.SecretManagerKey(p.secretName(req.Name)+"/versions/latest", p.secretManagerURL())
	userData, err := squidconf.VMUserData(req.CloudInit, squidconf.VMParams{Owner: req.Owner(), Port: req.Proxy.Spec.Port,
		AllowedSources: p.settings.Firewall.SourceRanges, LeaseKey: keySource, IPv6: p.settings.IPv6, IPv6PrefixLength: externalIPv6PrefixLength})
	if err != nil {
		return providers.Terminal("%v", err)
	}
	vm := p.vm(req, pl, userData, keySource)
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	if err := p.putLeaseKey(ctx, req.Name, vm.GetLabels(), req.LeaseKeyFile()); err != nil {
		return err
	}
	return providers.CreateUnderKeys(requestIDNamespace, req, fmt.Sprintf("inserting VM %s in %s", req.Name, pl.zone), func(key string) (bool, error) {
		op, err := p.instances.Insert(ctx, &computepb.InsertInstanceRequest{
			Project: p.settings.Project, Zone: pl.zone, RequestId: proto.String(key), InstanceResource: vm,
		})
		if err != nil {
			if isAlreadyExists(err) {
				return false, nil // the VM exists: the next Get reads it
			}
			return false, classify(fmt.Errorf("inserting VM %s in %s: %w", req.Name, pl.zone, err))
		}
		if opErr := op.Proto().GetError(); opErr != nil && len(opErr.GetErrors()) > 0 {
			return false, operationError(req.Name, opErr)
		}
		spent, err := p.replayedGone(ctx, op.Proto(), pl.zone, req.Name)
		if err != nil {
			return false, classify(fmt.Errorf("checking the VM %s inserted in %s: %w", req.Name, pl.zone, err))
		}
		return spent, nil
	})
}

// replayedGone says whether an insert was answered with an earlier
// operation under the same requestId whose VM no longer exists: finished
// without error, and no VM of that name. A fresh insert answers with an
// operation still PENDING or RUNNING and is never checked.
func (p *Provider) replayedGone(ctx context.Context, op *computepb.Operation, zone, name string) (bool, error) {
	if op.GetStatus() != computepb.Operation_DONE {
		return false, nil
	}
	_, err := p.instances.Get(ctx, &computepb.GetInstanceRequest{Project: p.settings.Project, Zone: zone, Instance: name})
	switch {
	case err == nil:
		return false, nil
	case isNotFound(err):
		return true, nil
	default:
		return false, err
	}
}

// Delete deletes the VM's lease key secret and starts deleting the VM; a
// secret or VM already gone is fine.
func (p *Provider) Delete(ctx context.Context, inst *providers.Instance) error {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	if err := p.deleteLeaseKey(ctx, inst.Name); err != nil {
		return err
	}
	_, err := p.instances.Delete(ctx, &computepb.DeleteInstanceRequest{Project: p.settings.Project, Zone: inst.Location, Instance: inst.Name})
	if err != nil && !isNotFound(err) {
		return classify(fmt.Errorf("deleting VM %s in %s: %w", inst.Name, inst.Location, err))
	}
	return nil
}

// List returns every VM in the project, in any zone, labelled with owner
// and with this provider instance's name: one aggregated list (paged) serves
// the whole fleet.
func (p *Provider) List(ctx context.Context, owner providers.Owner) ([]providers.Instance, error) {
	return p.aggregatedList(ctx, fmt.Sprintf("(labels.%s = %q) AND (labels.%s = %q) AND (labels.%s = %q)",
		gceLabelKeys[crawlv1alpha1.LabelClusterID], owner.ClusterID,
		gceLabelKeys[crawlv1alpha1.LabelOperatorID], owner.OperatorID,
		gceLabelKeys[crawlv1alpha1.LabelProvider], p.name))
}

func (p *Provider) aggregatedList(ctx context.Context, filter string) ([]providers.Instance, error) {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	it := p.instances.AggregatedList(ctx, &computepb.AggregatedListInstancesRequest{
		Project: p.settings.Project, Filter: proto.String(filter), ReturnPartialSuccess: proto.Bool(true),
	})
	var out []providers.Instance
	for {
		pair, err := it.Next()
		if errors.Is(err, iterator.Done) {
			return out, nil
		}
		if err != nil {
			return nil, classify(fmt.Errorf("listing VMs (%s): %w", filter, err))
		}
		for _, vm := range pair.Value.GetInstances() {
			inst, err := instanceOf(vm)
			if err != nil {
				return nil, err
			}
			out = append(out, *inst)
		}
	}
}

// RequestID is the insert requestId for a Proxy's spec after the instance
// replaces (providers.IdempotencyKey), stable across retries. attempt
// numbers the VMs since that one while GCE still remembers earlier
// requestIds (see Create).
func RequestID(uid, specHash, replaces string, attempt int) string {
	return providers.IdempotencyKey(requestIDNamespace, uid, specHash, replaces, attempt)
}

var requestIDNamespace = uuid.MustParse("3b0f9a2e-6c1d-4d8e-9b7a-5f2c1e0d4a61")
