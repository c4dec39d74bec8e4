package credentials

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/intern"
)

// Roles of the operator's own credentials Secrets (LabelCredentialsRole).
const (
	// RoleProvider marks the Secret generated for a provider instance.
	RoleProvider = "provider"
	// RoleSpec marks the record of the credentials the instances built
	// from one spec hash, in one namespace, were made with: one record for
	// every such instance (a pool's members share it). During a rotation
	// old instances still take the old password and new ones the new (the
	// hash covers the credentials): probes and discovery read this record,
	// never the Secret the credentials came from.
	RoleSpec = "spec"
	// RoleInstance marks the record of one instance, as versions before
	// RoleSpec kept them: read only while its spec's record is missing
	// (Ref.Legacy), deleted with its Proxy.
	RoleInstance = "instance"
)

// AnnotationRecordWritten is when a record was last written for an
// instance about to be created (RFC 3339): the orphan collector spares a
// record whose instances may not have recorded its hash yet.
const AnnotationRecordWritten = "crawl.example.com/record-written"

// ProviderSecretName is the Secret, in the operator's namespace, holding the
// credentials generated for a provider instance.
func ProviderSecretName(provider string) string { return "proxy-credentials-" + provider }

// RecordName is the record Secret, in the operator's namespace, of the
// instances built from specHash for Proxies in namespace. Namespaces are
// never shared between operators, so neither is a record.
func RecordName(namespace, specHash string) string {
	return "proxy-record-" + namespace + "-" + specHash
}

// LegacyRecordName is the record an earlier version kept for the instance
// called instanceName (RoleInstance).
func LegacyRecordName(instanceName string) string { return instanceName }

// Ref says where one proxy's credentials are now.
type Ref struct {
	Namespace, Name string
	// SpecHash, when set, is the spec hash the Secret must carry: the
	// record of a Managed proxy, valid for the instances built from it only.
	SpecHash string
	// Legacy, when set, is read when Name is missing: the record an
	// earlier version kept for the instance, until the reconciler has
	// written its spec's (the first passes after an upgrade).
	Legacy string
}

// RefFor is where the credentials of p's current instance are: a Managed
// proxy's record in namespace (the operator's), an External proxy's
// spec.external.credentials. ok is false when there are none.
func RefFor(p *crawlv1alpha1.Proxy, namespace string) (Ref, bool) {
	switch {
	case p.Spec.Mode == crawlv1alpha1.ModeManaged && p.Status.SpecHash != "":
		// Interned: the health engine and discovery keep a Ref per proxy,
		// and a fleet's proxies share a handful of records.
		name := intern.String(RecordName(p.Namespace, p.Status.SpecHash))
		ref := Ref{Namespace: namespace, Name: name, SpecHash: p.Status.SpecHash}
		if p.Status.InstanceName != "" {
			ref.Legacy = LegacyRecordName(p.Status.InstanceName)
		}
		return ref, true
	case p.Spec.Mode == crawlv1alpha1.ModeExternal && p.Spec.External != nil && p.Spec.External.Credentials != nil:
		return Ref{Namespace: p.Namespace, Name: p.Spec.External.Credentials.SecretRef.Name}, true
	}
	return Ref{}, false
}

// ErrNotFound means a proxy's credentials are not (or no longer) where its
// Ref points.
var ErrNotFound = errors.New("proxy credentials not found")

// ErrUnavailable says the Secret could not be read now (a cache not started
// yet, a cancelled context): worth a retry, and no fault of the user's.
var ErrUnavailable = errors.New("proxy credentials cannot be read now")

// Reader looks credentials up through a cache of credentials Secrets (see
// CacheOptions), never the API server.
type Reader struct {
	Client client.Reader
}

// Lookup reads the credentials ref points at, or at ref.Legacy when that
// is missing. It fails with ErrNotFound when the Secret is missing or
// records another spec, and with ErrUnavailable when it cannot be read at
// all.
func (r Reader) Lookup(ctx context.Context, ref Ref) (Credentials, error) {
	c, err := r.lookup(ctx, ref)
	if errors.Is(err, ErrNotFound) && ref.Legacy != "" {
		legacy := ref
		legacy.Name, legacy.Legacy = ref.Legacy, ""
		if c, legacyErr := r.lookup(ctx, legacy); legacyErr == nil {
			return c, nil
		}
	}
	return c, err
}

func (r Reader) lookup(ctx context.Context, ref Ref) (Credentials, error) {
	var secret corev1.Secret
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: ref.Namespace, Name: ref.Name}, &secret)
	switch {
	case apierrors.IsNotFound(err):
		return Credentials{}, fmt.Errorf("%w: Secret %s/%s (it must carry the label %s: \"true\")", ErrNotFound, ref.Namespace, ref.Name, crawlv1alpha1.LabelCredentials)
	case err != nil:
		return Credentials{}, fmt.Errorf("%w: reading Secret %s/%s: %w", ErrUnavailable, ref.Namespace, ref.Name, err)
	case ref.SpecHash != "" && secret.Labels[crawlv1alpha1.LabelSpecHash] != ref.SpecHash:
		return Credentials{}, fmt.Errorf("%w: Secret %s/%s records spec %s, the instance is %s", ErrNotFound, ref.Namespace, ref.Name,
			secret.Labels[crawlv1alpha1.LabelSpecHash], ref.SpecHash)
	}
	return FromSecret(&secret)
}

// CacheOptions make a cache that holds credentials Secrets only (labelled
// crawl.example.com/proxy-credentials=true), without managedFields. The
// manager's own cache keeps to cloud-init Secrets; a Secret the operator may
// read carries one label or the other, never needs both.
func CacheOptions(base cache.Options) cache.Options {
	base.ByObject = map[client.Object]cache.ByObject{
		&corev1.Secret{}: {Label: labels.SelectorFromSet(labels.Set{crawlv1alpha1.LabelCredentials: "true"})},
	}
	base.DefaultTransform = cache.TransformStripManagedFields()
	return base
}
