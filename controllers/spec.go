package controllers

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/credentials"
	"github.com/example/egress-proxies-operator/providers"
)

// specHash hashes exactly the fields whose change replaces the instance:
// provider, port, placement, the cloud-init content (resolved, so rotating
// a Secret's content counts as a change), the credentials' fingerprint
// (so does a new password) and their scheme (so an instance that checks
// the shared password is replaced by one that checks per-lease
// credentials). Attributes and health
// check overrides are left out: they never need a new instance. 16 hex
// characters fit every label-value limit with room to spare.
func specHash(spec *crawlv1alpha1.ProxySpec, cloudInit string, creds credentials.Credentials) string {
	// encoding/json writes map keys sorted, so equal specs hash equally.
	doc, err := json.Marshal(struct {
		Provider  string                   `json:"provider"`
		Port      int32                    `json:"port"`
		Placement *crawlv1alpha1.Placement `json:"placement,omitempty"`
		CloudInit string                   `json:"cloudInit,omitempty"`
		Auth      string                   `json:"auth,omitempty"`
		Scheme    string                   `json:"scheme,omitempty"`
	}{spec.Provider, spec.Port, spec.Placement, cloudInit, creds.Fingerprint(), creds.Scheme})
	if err != nil {
		// Marshalling strings, ints and string maps cannot fail.
		panic(fmt.Sprintf("hashing a Proxy spec: %v", err))
	}
	sum := sha256.Sum256(doc)
	return hex.EncodeToString(sum[:])[:16]
}

// resolveCloudInit returns the Proxy's cloud-init document: inline, or read
// from its Secret through the cache (which holds only Secrets labelled
// crawl.example.com/cloud-init=true).
func resolveCloudInit(ctx context.Context, c client.Reader, p *crawlv1alpha1.Proxy) (string, *specError) {
	ci := p.Spec.CloudInit
	switch {
	case ci == nil:
		return "", nil
	case ci.SecretRef == nil:
		return ci.Inline, nil
	}
	ref := ci.SecretRef
	var secret corev1.Secret
	err := c.Get(ctx, client.ObjectKey{Namespace: p.Namespace, Name: ref.Name}, &secret)
	switch {
	case apierrors.IsNotFound(err):
		return "", &specError{ReasonCloudInitError, fmt.Sprintf(
			"Secret %s/%s for spec.cloudInit.secretRef not found; it must exist and carry the label %s: \"true\" (the operator sees only labelled Secrets)",
			p.Namespace, ref.Name, crawlv1alpha1.LabelCloudInit)}
	case err != nil:
		return "", &specError{ReasonCloudInitError, fmt.Sprintf("reading Secret %s/%s: %v", p.Namespace, ref.Name, err)}
	}
	data, ok := secret.Data[ref.Key]
	if !ok {
		return "", &specError{ReasonCloudInitError, fmt.Sprintf(
			"Secret %s/%s has no key %q (spec.cloudInit.secretRef.key)", p.Namespace, ref.Name, ref.Key)}
	}
	return string(data), nil
}

// instanceLabels are the labels every instance carries: who made it (the
// cluster and operator ids, the provider instance), who owns it (namespace,
// name, UID) and from which spec.
func instanceLabels(owner providers.Owner, p *crawlv1alpha1.Proxy, hash string) map[string]string {
	return map[string]string{
		crawlv1alpha1.LabelClusterID:      owner.ClusterID,
		crawlv1alpha1.LabelOperatorID:     owner.OperatorID,
		crawlv1alpha1.LabelProvider:       p.Spec.Provider,
		crawlv1alpha1.LabelOwnerNamespace: p.Namespace,
		crawlv1alpha1.LabelOwnerName:      p.Name,
		crawlv1alpha1.LabelOwnerUID:       string(p.UID),
		crawlv1alpha1.LabelSpecHash:       hash,
	}
}
