package controllers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

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
	// rotate the credentials): generate them.
	c = credentials.Generate()
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ref.Namespace, Name: ref.Name, Labels: mergeLabels(managedByLabel, map[string]string{
			crawlv1alpha1.LabelCredentials:     "true",
			crawlv1alpha1.LabelCredentialsRole: credentials.RoleProvider,
			crawlv1alpha1.LabelProvider:        p.Spec.Provider,
		})},
		Type: corev1.SecretTypeBasicAuth,
		Data: c.Data(),
	}
	err = r.Client.Create(ctx, secret)
	switch {
	case err == nil:
		logf.FromContext(ctx).Info("generated proxy credentials", "provider", p.Spec.Provider, "secret", ref.Namespace+"/"+ref.Name)
		return c, nil, nil
	case apierrors.IsAlreadyExists(err):
		// Another worker generated them a moment ago; the cache shows them soon.
		return credentials.Credentials{}, nil, fmt.Errorf("waiting for the credentials Secret %s/%s to reach the cache", ref.Namespace, ref.Name)
	}
	return credentials.Credentials{}, nil, fmt.Errorf("creating the credentials Secret %s/%s of provider %s: %w", ref.Namespace, ref.Name, p.Spec.Provider, err)
}

// writeRecord records, in the operator's namespace, the credentials the
// instance about to be created is built with. Probes and discovery read
// this record, so during a rotation every instance is reached with the
// password it actually has. Written before the instance is created: an
// instance never runs without its record.
func (r *ProxyReconciler) writeRecord(ctx context.Context, p *crawlv1alpha1.Proxy, o observation) error {
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: r.CredentialsNamespace, Name: credentials.RecordName(o.instanceName),
			Labels: mergeLabels(managedByLabel, instanceLabels(r.Owner, p, o.desiredHash), map[string]string{
				crawlv1alpha1.LabelCredentials:     "true",
				crawlv1alpha1.LabelCredentialsRole: credentials.RoleInstance,
			}),
		},
		Type: corev1.SecretTypeBasicAuth,
		Data: o.credentials.Data(),
	}
	err := r.Client.Create(ctx, secret)
	if !apierrors.IsAlreadyExists(err) {
		return wrap(err, "creating the credentials record %s/%s", secret.Namespace, secret.Name)
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": secret.Labels}, "data": secret.Data})
	if err != nil {
		return fmt.Errorf("encoding the credentials record's patch: %w", err)
	}
	existing := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: secret.Namespace, Name: secret.Name}}
	return wrap(r.Client.Patch(ctx, existing, client.RawPatch(types.MergePatchType, patch)),
		"updating the credentials record %s/%s", secret.Namespace, secret.Name)
}

// recordCurrent says whether the record of the running instance is in the
// cache; a pass that finds it missing (deleted by hand, or an instance made
// before records existed whose spec has not changed) writes it again. A
// cache that cannot answer is an error, not a missing record: rewriting on
// every pass would be a write per pass for nothing.
func (r *ProxyReconciler) recordCurrent(ctx context.Context, o observation) (bool, error) {
	var secret corev1.Secret
	key := client.ObjectKey{Namespace: r.CredentialsNamespace, Name: credentials.RecordName(o.instanceName)}
	switch err := r.CredentialsCache.Get(ctx, key, &secret); {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("reading the credentials record %s: %w", key, err)
	}
	return secret.Labels[crawlv1alpha1.LabelSpecHash] == o.desiredHash, nil
}

// deleteRecord removes a deleted Proxy's record.
func (r *ProxyReconciler) deleteRecord(ctx context.Context, instanceName string) error {
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: r.CredentialsNamespace, Name: credentials.RecordName(instanceName)}}
	return wrap(client.IgnoreNotFound(r.Client.Delete(ctx, secret)), "deleting the credentials record %s/%s", secret.Namespace, secret.Name)
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
