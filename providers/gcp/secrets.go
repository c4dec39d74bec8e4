package gcp

import (
	"context"
	"fmt"

	"cloud.google.com/go/secretmanager/apiv1/secretmanagerpb"
)

// cloudPlatformScope is the OAuth scope Secret Manager needs on the VMs'
// service account: it takes no narrower one, and IAM does the narrowing.
const cloudPlatformScope = "https://www.googleapis.com/auth/cloud-platform"

// defaultSecretManagerURL is Secret Manager's public endpoint.
const defaultSecretManagerURL = "https://secretmanager.googleapis.com"

// SecretPrefix starts the id of every secret the provider keeps a VM's
// lease key in: the VMs' service account is granted access to these alone
// (an IAM condition on the resource name).
const SecretPrefix = "egress-proxy-"

// secretName is the secret holding the lease key of VM name: one per VM
// name, so a replaced VM (same name) gets the secret again.
func (p *Provider) secretName(name string) string {
	return fmt.Sprintf("projects/%s/secrets/%s%s", p.settings.Project, SecretPrefix, name)
}

// secretManagerURL is the endpoint the operator and the VMs call.
func (p *Provider) secretManagerURL() string {
	if p.settings.SecretManagerEndpoint != "" {
		return p.settings.SecretManagerEndpoint
	}
	return defaultSecretManagerURL
}

// putLeaseKey makes key the latest version of VM name's secret, labelled
// as the VM: created when missing, and given a version only when its
// latest differs, so a retried Create adds none.
func (p *Provider) putLeaseKey(ctx context.Context, name string, labels map[string]string, key string) error {
	secret := p.secretName(name)
	_, err := p.secrets.CreateSecret(ctx, &secretmanagerpb.CreateSecretRequest{
		Parent:   "projects/" + p.settings.Project,
		SecretId: SecretPrefix + name,
		Secret: &secretmanagerpb.Secret{Labels: labels, Replication: &secretmanagerpb.Replication{
			Replication: &secretmanagerpb.Replication_Automatic_{Automatic: &secretmanagerpb.Replication_Automatic{}}}},
	})
	switch {
	case err == nil:
	case isAlreadyExists(err):
		latest, err := p.secrets.AccessSecretVersion(ctx, &secretmanagerpb.AccessSecretVersionRequest{Name: secret + "/versions/latest"})
		if err == nil && string(latest.GetPayload().GetData()) == key {
			return nil
		}
		if err != nil && !isNotFound(err) {
			return classify(fmt.Errorf("reading the lease key secret %s: %w", secret, err))
		}
	default:
		return classify(fmt.Errorf("creating the lease key secret %s: %w", secret, err))
	}
	if _, err := p.secrets.AddSecretVersion(ctx, &secretmanagerpb.AddSecretVersionRequest{
		Parent: secret, Payload: &secretmanagerpb.SecretPayload{Data: []byte(key)},
	}); err != nil {
		return classify(fmt.Errorf("storing the lease key in secret %s: %w", secret, err))
	}
	return nil
}

// deleteLeaseKey deletes VM name's secret; one already gone is fine.
func (p *Provider) deleteLeaseKey(ctx context.Context, name string) error {
	secret := p.secretName(name)
	if err := p.secrets.DeleteSecret(ctx, &secretmanagerpb.DeleteSecretRequest{Name: secret}); err != nil && !isNotFound(err) {
		return classify(fmt.Errorf("deleting the lease key secret %s: %w", secret, err))
	}
	return nil
}
