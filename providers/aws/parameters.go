package aws

import (
	"context"
	"errors"
	"fmt"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ssm"
	ssmtypes "github.com/aws/aws-sdk-go-v2/service/ssm/types"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/providers"
)

// ParameterPrefix starts the name of every SSM parameter the provider
// keeps an instance's lease key in: the instances' role is granted
// ssm:GetParameter on these alone.
const ParameterPrefix = "/egress-proxy/"

// The static key the provider signs with under
// settings.withoutAuthentication (an emulator).
const (
	fakeAccessKey = "AKIDFAKE"
	fakeSecretKey = "fake-secret"
)

// ParameterName is the SecureString parameter holding the lease key of the
// instance called name: one per instance name, so a replaced instance
// (same name) gets it again.
func ParameterName(name string) string { return ParameterPrefix + name }

// ssmURL is the SSM endpoint the instances call.
func (p *Provider) ssmURL() string {
	if p.settings.SSMEndpoint != "" {
		return p.settings.SSMEndpoint
	}
	return "https://ssm." + p.settings.Region + ".amazonaws.com"
}

// putLeaseKey stores req's lease key as a SecureString (the account's
// aws/ssm KMS key), tagged as the instance: created with its tags, or
// overwritten when it exists (SSM takes tags on a create only).
func (p *Provider) putLeaseKey(ctx context.Context, req providers.CreateRequest, key string) error {
	name := ParameterName(req.Name)
	tags := []ssmtypes.Tag{{Key: awssdk.String(tagName), Value: awssdk.String(req.Name)},
		{Key: awssdk.String(crawlv1alpha1.LabelProvider), Value: awssdk.String(p.name)}}
	for _, k := range sortedKeys(req.Labels) {
		tags = append(tags, ssmtypes.Tag{Key: awssdk.String(k), Value: awssdk.String(req.Labels[k])})
	}
	in := &ssm.PutParameterInput{Name: awssdk.String(name), Value: awssdk.String(key), Type: ssmtypes.ParameterTypeSecureString,
		Description: awssdk.String("Lease key of egress proxy " + req.Owner() + ": read by the instance at boot"), Tags: tags}
	_, err := p.ssm.PutParameter(ctx, in)
	var exists *ssmtypes.ParameterAlreadyExists
	if errors.As(err, &exists) {
		in.Tags, in.Overwrite = nil, awssdk.Bool(true)
		_, err = p.ssm.PutParameter(ctx, in)
	}
	if err != nil {
		return classify(fmt.Errorf("storing the lease key in parameter %s: %w", name, err))
	}
	return nil
}

// deleteLeaseKey deletes the parameter of the instance called name; one
// already gone is fine.
func (p *Provider) deleteLeaseKey(ctx context.Context, name string) error {
	_, err := p.ssm.DeleteParameter(ctx, &ssm.DeleteParameterInput{Name: awssdk.String(ParameterName(name))})
	var gone *ssmtypes.ParameterNotFound
	if err != nil && !errors.As(err, &gone) {
		return classify(fmt.Errorf("deleting the lease key parameter %s: %w", ParameterName(name), err))
	}
	return nil
}
