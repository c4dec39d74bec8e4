package testenv

import (
	"context"

	"github.com/example/egress-proxies-operator/credentials"
)

// Records are instance credential records by Secret (namespace/name): a
// credentials lookup for tests of what hands credentials out.
type Records map[string]credentials.Credentials

// Lookup answers a record by its Secret, or credentials.ErrNotFound.
func (r Records) Lookup(_ context.Context, ref credentials.Ref) (credentials.Credentials, error) {
	c, ok := r[ref.Namespace+"/"+ref.Name]
	if !ok {
		return credentials.Credentials{}, credentials.ErrNotFound
	}
	return c, nil
}
