package controllers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/credentials"
)

// credentialsIndex indexes Managed Proxies by where their credentials come
// from ("secret/<name>" in their namespace, "provider/<name>" for the
// provider instance's generated ones), so a credentials Secret's change
// enqueues exactly the Proxies it rotates.
const credentialsIndex = "credentials.source"

func credentialsSource(obj client.Object) []string {
	p := obj.(*crawlv1alpha1.Proxy)
	switch {
	case p.Spec.Mode != crawlv1alpha1.ModeManaged:
		return nil
	case p.Spec.Credentials != nil:
		return []string{"secret/" + p.Spec.Credentials.SecretRef.Name}
	}
	return []string{"provider/" + p.Spec.Provider}
}

// managedByLabel marks what the operator made itself.
var managedByLabel = map[string]string{"app.kubernetes.io/managed-by": "egress-proxies-operator"}

// resolveCredentials returns the credentials a Managed Proxy's instance must
// require: from the Secret the Proxy names, or generated for its provider
// instance on first use. A Secret that is missing or holds bad credentials
// is the user's to fix (specErr); err is worth a retry.
func (r *ProxyReconciler) resolveCredentials(ctx context.Context, p *crawlv1alpha1.Proxy) (credentials.Credentials, *specError, error) {
	reader := credentials.Reader{Client: r.CredentialsCache}
	if ref := p.Spec.Credentials; ref != nil {
		c, err := reader.Lookup(ctx, credentials.Ref{Namespace: p.Namespace, Name: ref.SecretRef.Name})
		if errors.Is(err, credentials.ErrUnavailable) {
			return credentials.Credentials{}, nil, err
		}
		if err != nil {
			return credentials.Credentials{}, &specError{ReasonCredentialsError, fmt.Sprintf("spec.credentials.secretRef: %v", err)}, nil
		}
		return c, nil, nil
	}
	ref := credentials.Ref{Namespace: r.CredentialsNamespace, Name: credentials.ProviderSecretName(p.Spec.Provider)}
	c, err := reader.Lookup(ctx, ref)
	switch {
	case err == nil:
		return c, nil, nil
	case errors.Is(err, credentials.ErrUnavailable):
		return credentials.Credentials{}, nil, err
	case !errors.Is(err, credentials.ErrNotFound):
		return credentials.Credentials{}, &specError{ReasonCredentialsError, fmt.Sprintf("the credentials of provider %s: %v", p.Spec.Provider, err)}, nil
	}
	// First use of this provider instance (or its Secret was deleted to
	// rotate the credentials): generate them, once for every worker that
	// finds them missing before the cache shows the Secret.
	made, err := r.cache().writeOnce(lagKey(lagSecret, types.NamespacedName{Namespace: ref.Namespace, Name: ref.Name}), "", func() (any, error) {
		return r.generateCredentials(ctx, ref, p.Spec.Provider)
	})
	if err != nil {
		return credentials.Credentials{}, nil, err
	}
	return made.(credentials.Credentials), nil, nil
}

// generateCredentials generates a provider instance's credentials and
// creates their Secret.
func (r *ProxyReconciler) generateCredentials(ctx context.Context, ref credentials.Ref, provider string) (credentials.Credentials, error) {
	c := credentials.Generate()
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ref.Namespace, Name: ref.Name, Labels: mergeLabels(managedByLabel, map[string]string{
			crawlv1alpha1.LabelCredentials:     "true",
			crawlv1alpha1.LabelCredentialsRole: credentials.RoleProvider,
			crawlv1alpha1.LabelProvider:        provider,
		})},
		Type: corev1.SecretTypeBasicAuth,
		Data: c.Data(),
	}
	switch err := r.Client.Create(ctx, secret); {
	case err == nil:
		logf.FromContext(ctx).Info("generated proxy credentials", "provider", provider, "secret", ref.Namespace+"/"+ref.Name)
		return c, nil
	case apierrors.IsAlreadyExists(err):
		// Generated a moment ago by an earlier leader: the cache shows the
		// Secret soon.
		return credentials.Credentials{}, fmt.Errorf("waiting for the credentials Secret %s/%s to reach the cache", ref.Namespace, ref.Name)
	default:
		return credentials.Credentials{}, fmt.Errorf("creating the credentials Secret %s/%s of provider %s: %w", ref.Namespace, ref.Name, provider, err)
	}
}

// recordRefresh is how old a record's written-at may be before a Create
// writes it again: a record unused for longer than the orphan collector's
// recordGrace may be collected, so one about to serve a new instance is
// kept fresh, but not rewritten for every instance of a fleet.
const recordRefresh = 10 * time.Minute

// writeRecord makes sure the record of the credentials the instance about
// to be created is built with is in the operator's namespace. Probes and
// discovery read this record, so during a rotation every instance is
// reached with the password it actually has. It is checked before the
// instance is created: an instance never runs without its record. Every
// instance of one spec hash in one namespace shares the record
// (credentials.RecordName), so a fleet's bring-up writes it once, not once
// per proxy.
func (r *ProxyReconciler) writeRecord(ctx context.Context, p *crawlv1alpha1.Proxy, o observation) error {
	key := r.recordKey(p, o)
	var cached corev1.Secret
	switch err := r.CredentialsCache.Get(ctx, key, &cached); {
	case err == nil && recordFresh(&cached, o.desiredHash, r.clock().Now()):
		return nil
	case err != nil && !apierrors.IsNotFound(err):
		return fmt.Errorf("reading the credentials record %s: %w", key, err)
	}
	_, err := r.cache().writeOnce(lagKey(lagSecret, key), cached.ResourceVersion, func() (any, error) {
		return nil, r.putRecord(ctx, key, p, o)
	})
	return err
}

// putRecord creates the record, or brings an existing one up to date: its
// labels, its credentials and when it was written.
func (r *ProxyReconciler) putRecord(ctx context.Context, key client.ObjectKey, p *crawlv1alpha1.Proxy, o observation) error {
	now := r.clock().Now()
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: key.Namespace, Name: key.Name,
			Labels: mergeLabels(managedByLabel, r.Owner.Labels(), map[string]string{
				crawlv1alpha1.LabelCredentials:     "true",
				crawlv1alpha1.LabelCredentialsRole: credentials.RoleSpec,
				crawlv1alpha1.LabelOwnerNamespace:  p.Namespace,
				crawlv1alpha1.LabelSpecHash:        o.desiredHash,
				crawlv1alpha1.LabelProvider:        p.Spec.Provider,
			}),
			Annotations: map[string]string{credentials.AnnotationRecordWritten: now.UTC().Format(time.RFC3339)},
		},
		Type: corev1.SecretTypeBasicAuth,
		Data: o.credentials.Data(),
	}
	err := r.Client.Create(ctx, secret)
	if !apierrors.IsAlreadyExists(err) {
		return wrap(err, "creating the credentials record %s", key)
	}
	var cached corev1.Secret
	switch err := r.CredentialsCache.Get(ctx, key, &cached); {
	case apierrors.IsNotFound(err):
		// Made a moment ago (another replica's leader before this one, a
		// write the cache has not shown yet): fresh, and the same
		// credentials (the name has their hash).
		return nil
	case err == nil && recordFresh(&cached, o.desiredHash, now):
		return nil
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": secret.Labels, "annotations": secret.Annotations}, "data": secret.Data})
	if err != nil {
		return fmt.Errorf("encoding the credentials record's patch: %w", err)
	}
	existing := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
	return wrap(r.Client.Patch(ctx, existing, client.RawPatch(types.MergePatchType, patch)), "updating the credentials record %s", key)
}

// recordKey is where the record of the instances built from o's spec hash
// for Proxies in p's namespace lives.
func (r *ProxyReconciler) recordKey(p *crawlv1alpha1.Proxy, o observation) client.ObjectKey {
	return client.ObjectKey{Namespace: r.CredentialsNamespace, Name: credentials.RecordName(p.Namespace, o.desiredHash)}
}

// recordFresh says whether a cached record is for hash and was written
// within recordRefresh of now.
func recordFresh(secret *corev1.Secret, hash string, now time.Time) bool {
	if secret.Labels[crawlv1alpha1.LabelSpecHash] != hash {
		return false
	}
	written, ok := recordWritten(secret)
	return ok && now.Sub(written) < recordRefresh
}

// recordWritten is when a record was last written for an instance about
// to be created (credentials.AnnotationRecordWritten); ok is false when it
// does not say, or not legibly.
func recordWritten(secret *corev1.Secret) (written time.Time, ok bool) {
	written, err := time.Parse(time.RFC3339, secret.Annotations[credentials.AnnotationRecordWritten])
	return written, err == nil
}

// recordCurrent says whether the record of the running instance is in the
// cache; a pass that finds it missing (deleted by hand, or an instance made
// before shared records existed whose spec has not changed) writes it
// again. A cache that cannot answer is an error, not a missing record:
// rewriting on every pass would be a write per pass for nothing.
func (r *ProxyReconciler) recordCurrent(ctx context.Context, p *crawlv1alpha1.Proxy, o observation) (bool, error) {
	var secret corev1.Secret
	key := r.recordKey(p, o)
	switch err := r.CredentialsCache.Get(ctx, key, &secret); {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("reading the credentials record %s: %w", key, err)
	}
	return secret.Labels[crawlv1alpha1.LabelSpecHash] == o.desiredHash, nil
}

// deleteLegacyRecord removes the record an earlier version kept for a
// deleted Proxy's instance, if the cache shows one: a shared record stays
// for the Proxy's siblings, and the orphan collector takes it once none
// uses it.
func (r *ProxyReconciler) deleteLegacyRecord(ctx context.Context, instanceName string) error {
	key := client.ObjectKey{Namespace: r.CredentialsNamespace, Name: credentials.LegacyRecordName(instanceName)}
	var secret corev1.Secret
	switch err := r.CredentialsCache.Get(ctx, key, &secret); {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("reading the credentials record %s: %w", key, err)
	case secret.Labels[crawlv1alpha1.LabelCredentialsRole] != credentials.RoleInstance:
		return nil
	}
	return wrap(client.IgnoreNotFound(r.Client.Delete(ctx, &secret)), "deleting the credentials record %s", key)
}

// proxiesUsingCredentials maps a credentials Secret to the Proxies it
// concerns: a provider instance's to every Proxy using its generated
// credentials, a user's to the Proxies naming it, a record to its owner.
func (r *ProxyReconciler) proxiesUsingCredentials(ctx context.Context, secret client.Object) []reconcile.Request {
	labels := secret.GetLabels()
	var opts []client.ListOption
	switch labels[crawlv1alpha1.LabelCredentialsRole] {
	case credentials.RoleInstance:
		return ownerFromLabels(ctx, secret)
	case credentials.RoleSpec:
		// The Proxies whose instances were built from the record's spec
		// hash: a record deleted by hand is written again by their passes.
		if secret.GetNamespace() != r.CredentialsNamespace {
			return nil
		}
		var list crawlv1alpha1.ProxyList
		if err := r.Client.List(ctx, &list, client.InNamespace(labels[crawlv1alpha1.LabelOwnerNamespace])); err != nil {
			logf.FromContext(ctx).Error(err, "listing Proxies for a credentials record", "secret", client.ObjectKeyFromObject(secret))
			return nil
		}
		var out []reconcile.Request
		for i := range list.Items {
			if list.Items[i].Status.SpecHash == labels[crawlv1alpha1.LabelSpecHash] {
				out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
			}
		}
		return out
	case credentials.RoleProvider:
		if secret.GetNamespace() != r.CredentialsNamespace {
			return nil
		}
		opts = []client.ListOption{client.MatchingFields{credentialsIndex: "provider/" + labels[crawlv1alpha1.LabelProvider]}}
	default:
		opts = []client.ListOption{client.InNamespace(secret.GetNamespace()), client.MatchingFields{credentialsIndex: "secret/" + secret.GetName()}}
	}
	var list crawlv1alpha1.ProxyList
	if err := r.Client.List(ctx, &list, opts...); err != nil {
		logf.FromContext(ctx).Error(err, "listing Proxies for a credentials Secret", "secret", client.ObjectKeyFromObject(secret))
		return nil
	}
	return requestsFor(&list)
}

func mergeLabels(sets ...map[string]string) map[string]string {
	out := map[string]string{}
	for _, s := range sets {
		for k, v := range s {
			out[k] = v
		}
	}
	return out
}

func wrap(err error, format string, args ...any) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf(format+": %w", append(args, err)...)
}
