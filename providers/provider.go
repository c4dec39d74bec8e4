package providers

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/credentials"
)

// Provider runs the instances that back Managed proxies. Implementations
// start work and return: Create and Delete never wait for an instance to run
// or to go away, the reconciler reads progress with Get on its next pass.
type Provider interface {
	// Validate checks that a Proxy carries what this provider needs (for
	// example a zone), without I/O. Its error is terminal and names the
	// missing field.
	Validate(proxy *crawlv1alpha1.Proxy) error
	// Get returns the instance called name that backs proxy, wherever it is
	// (a placement change may have left it in another zone), or an error
	// matching ErrNotFound.
	Get(ctx context.Context, name string, proxy *crawlv1alpha1.Proxy) (*Instance, error)
	// Create starts creating the instance described by req. Creating an
	// instance that already exists under req.Name is not an error: a retry
	// after a lost reply must be a no-op.
	Create(ctx context.Context, req CreateRequest) error
	// Delete starts deleting inst, as returned by Get or List. An instance
	// already gone is not an error.
	Delete(ctx context.Context, inst *Instance) error
	// List returns the instances this provider instance made for owner:
	// labelled with owner's cluster and operator ids and with its own name
	// under LabelProvider. A second provider instance of the same type in
	// the same project or cluster has its own, so has a second operator,
	// and one made before those labels existed is listed by none: orphan GC
	// and re-observation must never act on an instance they cannot prove is
	// theirs.
	List(ctx context.Context, owner Owner) ([]Instance, error)
}

// ObjectBacked is implemented by providers whose instances are Kubernetes
// objects (the kubernetes provider's Pods). The reconciler watches that kind,
// mapping each object to its Proxy through the owner labels, so a pod turning
// Ready triggers a pass at once instead of at the next poll.
type ObjectBacked interface {
	// InstanceObject is an empty object of the watched kind.
	InstanceObject() client.Object
}

// OwnerCollected is implemented by providers whose instances carry their
// Proxy as controlling owner reference, in the Proxy's namespace, so that
// Kubernetes' garbage collector deletes them with it (the kubernetes
// provider's Pods). A Proxy served only by such providers needs no
// finalizer: the reconciler deletes its instance when it finds the Proxy
// gone, and the garbage collector does if the operator is not running. A
// provider whose instances live outside the cluster (a VM) must not
// implement it: only a finalizer keeps their Proxy until they are gone.
type OwnerCollected interface {
	// InstancesFollowTheirProxy is a marker: it says the above.
	InstancesFollowTheirProxy()
}

// State is where an instance is in its life, as the reconciler needs to know
// it: whatever the provider calls it.
type State string

const (
	// StatePending means the instance is being created and cannot serve yet.
	StatePending State = "Pending"
	// StateRunning means the instance serves and has an address.
	StateRunning State = "Running"
	// StateStopping means the instance is being deleted.
	StateStopping State = "Stopping"
	// StateFailed means the instance stopped for good (a terminated VM, a
	// failed pod) and must be replaced.
	StateFailed State = "Failed"
)

// Instance is a provider's view of one proxy instance.
type Instance struct {
	// Name is the provider's name for it (see InstanceName).
	Name string
	// Location is where the provider keeps it (a zone, a namespace); opaque
	// to everyone but the provider that returned it.
	Location string
	// State is its lifecycle state.
	State State
	// IP clients reach it at; set once Running.
	IP string
	// Port it listens on.
	Port int32
	// IPv6Prefix is the IPv6 range it leaves from ("" for IPv4 only), and
	// SessionAddresses how many of its addresses its Squid leaves from, one
	// per gateway session (squidconf.IPv6Egress).
	IPv6Prefix       string
	SessionAddresses int32
	// Labels are the ones the operator set at creation (cluster and
	// operator ids, owner, spec hash).
	Labels map[string]string
	// CreatedAt is when the provider created it; orphan GC spares young ones.
	CreatedAt time.Time
	// Message is the provider's account of a Failed or Pending state. For
	// an instance that is starting as expected it is empty: the Proxy's
	// status then keeps the record of its creation instead of a write per
	// routine step; a message says something holds it up.
	Message string
}

// SpecHash is the hash of the spec the instance was created from.
func (i *Instance) SpecHash() string { return i.Labels[crawlv1alpha1.LabelSpecHash] }

// OwnerUID is the UID of the Proxy the instance was created for.
func (i *Instance) OwnerUID() string { return i.Labels[crawlv1alpha1.LabelOwnerUID] }

// ProviderName is the provider instance that created it; empty for an
// instance made before the label existed.
func (i *Instance) ProviderName() string { return i.Labels[crawlv1alpha1.LabelProvider] }

// CreateRequest is everything a provider needs to create one instance.
type CreateRequest struct {
	// Proxy is the owner; providers read spec.port and spec.placement.
	Proxy *crawlv1alpha1.Proxy
	// Name is the instance name (InstanceName of the Proxy).
	Name string
	// CloudInit is the resolved user-data (inline, or the Secret's content).
	CloudInit string
	// Labels go on the instance verbatim: cluster and operator ids,
	// provider instance, owner, spec hash.
	Labels map[string]string
	// SpecHash is the hash of the replacement-forcing spec fields; GCE's
	// requestId is derived from it and the Proxy's UID.
	SpecHash string
	// Credentials are what every client must present, in addition to
	// coming from an allowed source range. Never empty: a provider must
	// refuse to build an instance without them.
	Credentials credentials.Credentials
	// Replaces is the instance this create follows, as the Proxy's status
	// last recorded it ("" for a first): it salts the create's
	// IdempotencyKey.
	Replaces string
}

// Owner is the request's Proxy as namespace/name: what its instance's
// squid.conf names, and what its lease key is derived for.
func (r CreateRequest) Owner() string { return r.Proxy.Namespace + "/" + r.Proxy.Name }

// LeaseKeyFile is the file of the lease key the request's instance checks
// per-lease credentials with: this proxy's own, never the password.
func (r CreateRequest) LeaseKeyFile() string { return r.Credentials.LeaseKeyFile(r.Owner()) }

// ErrNoCredentials is a provider's answer to a CreateRequest without
// credentials: it never builds an open proxy.
var ErrNoCredentials = Terminal("no proxy credentials in the create request: the operator never builds a proxy without them")

// Errors a provider returns, so the reconciler can tell "gone" from "try
// again" from "stop and tell the user". Wrap them with context; match them
// with errors.Is.
var (
	// ErrNotFound means the instance does not exist.
	ErrNotFound = errors.New("instance not found")
	// ErrTransient means the call may succeed if retried (rate limits,
	// unavailable endpoints): back off and retry.
	ErrTransient = errors.New("transient provider error")
	// ErrTerminal means retrying cannot help until the spec or the provider
	// config changes (bad placement, permission denied, quota).
	ErrTerminal = errors.New("terminal provider error")
	// ErrCapacity marks a terminal create refused for want of capacity
	// where it asked (a full zone, no Spot capacity), and ErrQuota one
	// refused by an account or project limit: retrying the same placement
	// cannot help, another zone or a standard instance may.
	ErrCapacity = errors.New("no capacity")
	ErrQuota    = errors.New("quota exceeded")
)

// Capacity wraps a terminal error as a capacity refusal.
func Capacity(format string, args ...any) error {
	return fmt.Errorf("%w: %w", ErrCapacity, Terminal(format, args...))
}

// Quota wraps a terminal error as a quota refusal.
func Quota(format string, args ...any) error {
	return fmt.Errorf("%w: %w", ErrQuota, Terminal(format, args...))
}

// Terminal wraps a message as a terminal error; the message reaches the
// Proxy's status, so it should tell the user what to change.
func Terminal(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrTerminal, fmt.Sprintf(format, args...))
}

// Transient wraps err as a transient error.
func Transient(err error) error {
	return fmt.Errorf("%w: %w", ErrTransient, err)
}

// TerminalMessage is err's message without the error kinds' prefixes, for
// conditions.
func TerminalMessage(err error) string {
	msg := err.Error()
	for _, prefix := range []error{ErrCapacity, ErrQuota, ErrTerminal} {
		msg = strings.TrimPrefix(msg, prefix.Error()+": ")
	}
	return msg
}

// maxInstanceName is the shortest name limit among providers: GCE's 63.
const maxInstanceName = 63

// InstanceName is the deterministic name of the instance backing a Proxy.
// Deterministic so a crash between "create" and "record" finds the instance
// instead of creating a second one; the same under replacement, so a
// replaced proxy keeps its name. It is a valid GCE instance name and Pod
// name: lowercase letters, digits and '-', starting with a letter, at most 63
// characters. The hash suffix covers cluster id, namespace and name, so no
// two Proxies (in one cluster or two sharing a cloud project) share a name,
// however their names were shortened.
func InstanceName(clusterID, namespace, name string) string {
	sum := sha256.Sum256([]byte(clusterID + "/" + namespace + "/" + name))
	suffix := "-" + hex.EncodeToString(sum[:])[:10]
	readable := sanitize("px-" + namespace + "-" + name)
	if room := maxInstanceName - len(suffix); len(readable) > room {
		readable = strings.TrimRight(readable[:room], "-")
	}
	return readable + suffix
}

// sanitize maps a Kubernetes name to GCE's alphabet: '.' and anything else
// outside [a-z0-9-] become '-'.
func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' {
			return r
		}
		return '-'
	}, strings.ToLower(s))
}

// Firewalled is implemented by providers whose instances are reachable from
// outside the cluster, behind a firewall rule the operator keeps: one per
// provider instance, kept in line with its config and removed when the
// provider instance leaves the config.
type Firewalled interface {
	// EnsureFirewall creates or updates this provider instance's rule,
	// which is owner's: another operator's provider instance of the same
	// name keeps a rule of its own.
	EnsureFirewall(ctx context.Context, owner Owner) error
	// StrayFirewalls lists rules owner made, in the places this provider
	// instance reaches, for provider instances keep rejects.
	StrayFirewalls(ctx context.Context, owner Owner, keep func(provider string) bool) ([]FirewallRule, error)
	// DeleteFirewall deletes a rule StrayFirewalls returned.
	DeleteFirewall(ctx context.Context, rule FirewallRule) error
}

// FirewallRule is one rule a Firewalled provider made.
type FirewallRule struct {
	// Name of the rule, Provider the provider instance it was made for,
	// Location where it lives (a project), for logs.
	Name, Provider, Location string
}

// Placed is a Proxy's placement with a provider instance's defaults
// applied: where and on what its instance runs.
type Placed struct {
	Zone, MachineType, Image string
	// Parameters are the Proxy's spec.placement.parameters, for the
	// provider to read.
	Parameters map[string]string
}

// ResolvePlacement applies defaults (a provider instance's settings) to
// proxy's spec.placement; a zone, machine type or image still missing is
// a terminal error naming the field, for provider (its type and name).
func ResolvePlacement(provider string, defaults Placed, proxy *crawlv1alpha1.Proxy) (Placed, error) {
	pl := defaults
	pl.Parameters = map[string]string{}
	if sp := proxy.Spec.Placement; sp != nil {
		pl.Zone = cmp.Or(sp.Zone, pl.Zone)
		pl.MachineType = cmp.Or(sp.MachineType, pl.MachineType)
		pl.Image = cmp.Or(sp.Image, pl.Image)
		if sp.Parameters != nil {
			pl.Parameters = sp.Parameters
		}
	}
	for _, f := range []struct{ field, value string }{{"zone", pl.Zone}, {"machineType", pl.MachineType}, {"image", pl.Image}} {
		if f.value == "" {
			return pl, Terminal("placement.%s is required for %s: set spec.placement.%s or a default in the providers config", f.field, provider, f.field)
		}
	}
	return pl, nil
}

// MaxIdempotencyAttempts bounds the keys CreateUnderKeys walks through:
// one for each instance of the same spec, since the recorded one it
// replaces, that was lost within the cloud's memory of keys.
const MaxIdempotencyAttempts = 32

// CreateUnderKeys calls create with req's idempotency keys in turn
// (IdempotencyKey in namespace, attempts 0, 1, ...) while it answers
// spent: the cloud replayed an earlier create under that key whose
// instance is gone. Past MaxIdempotencyAttempts it gives up, transiently;
// what names the create in that error.
func CreateUnderKeys(namespace uuid.UUID, req CreateRequest, what string, create func(key string) (spent bool, err error)) error {
	for attempt := range MaxIdempotencyAttempts {
		spent, err := create(IdempotencyKey(namespace, string(req.Proxy.UID), req.SpecHash, req.Replaces, attempt))
		if err != nil || !spent {
			return err
		}
	}
	return Transient(fmt.Errorf("%s: the first %d idempotency keys since the last recorded instance each replayed a create whose instance is gone; the cloud forgets them within hours",
		what, MaxIdempotencyAttempts))
}

// IdempotencyKey is a create's key for a Proxy's spec (a GCE requestId, an
// EC2 ClientToken): a name-based UUID, in the cloud's own namespace, of the
// Proxy's UID and spec hash, salted with the instance the create replaces
// (CreateRequest.Replaces), so a create retried after a lost reply is a
// no-op and each replacement of a recorded instance starts from a key the
// cloud has never seen. attempt numbers the creates since that instance
// while the cloud still remembers their keys (instances lost before they
// were recorded); attempt 0 is the UID, hash and salt alone.
func IdempotencyKey(namespace uuid.UUID, uid, specHash, replaces string, attempt int) string {
	key := uid + "/" + specHash
	if replaces != "" {
		key += "/after/" + replaces
	}
	if attempt > 0 {
		key += "/" + strconv.Itoa(attempt)
	}
	return uuid.NewSHA1(namespace, []byte(key)).String()
}
