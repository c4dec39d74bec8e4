package fakeec2

import (
	"context"
	"net/http/httptest"
	"testing"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ssm"
	ssmtypes "github.com/aws/aws-sdk-go-v2/service/ssm/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSSMChecksSignatures: the SDK's own Signature Version 4 passes the
// fake's check, a wrong secret key fails it, and the static key may store
// a parameter but not decrypt it (only the instance role may).
func TestSSMChecksSignatures(t *testing.T) {
	fake := New()
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	client := func(secret string) *ssm.Client {
		return ssm.New(ssm.Options{Region: "eu-west-1", BaseEndpoint: awssdk.String(srv.URL),
			Credentials: credentials.NewStaticCredentialsProvider(SDKAccessKey, secret, "")})
	}
	ctx := context.Background()
	_, err := client(SDKSecretKey).PutParameter(ctx, &ssm.PutParameterInput{Name: awssdk.String("/egress-proxy/a"),
		Value: awssdk.String("k"), Type: ssmtypes.ParameterTypeSecureString})
	require.NoError(t, err)
	v, ok := fake.Parameter("/egress-proxy/a")
	assert.True(t, ok)
	assert.Equal(t, "k", v)

	_, err = client("wrong").DeleteParameter(ctx, &ssm.DeleteParameterInput{Name: awssdk.String("/egress-proxy/a")})
	assert.ErrorContains(t, err, "InvalidSignatureException")
	_, err = client(SDKSecretKey).GetParameter(ctx, &ssm.GetParameterInput{Name: awssdk.String("/egress-proxy/a"), WithDecryption: awssdk.Bool(true)})
	assert.ErrorContains(t, err, "AccessDeniedException")
	_, ok = fake.Parameter("/egress-proxy/a")
	assert.True(t, ok, "a refused call changes nothing")
}
