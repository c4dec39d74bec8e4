package providers

import (
	"fmt"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
)

// TestAProxyIsReplacedAnyNumberOfTimes: on a cloud that never forgets a key
// and replays it once its instance is gone, a Proxy replaced 100 times
// (each after an instance its status recorded) gets a new instance every
// time; only instances lost before they were recorded use up the walk,
// and past its bound the create fails transiently, creating nothing twice.
func TestAProxyIsReplacedAnyNumberOfTimes(t *testing.T) {
	ns := uuid.MustParse("6f1c2f0e-9a4b-4b7e-8d21-3c5a0e9b7d11")
	used := map[string]bool{}
	created := 0
	create := func(key string) (bool, error) {
		if used[key] {
			return true, nil // replayed: that key's instance is gone
		}
		used[key] = true
		created++
		return false, nil
	}
	req := CreateRequest{Proxy: &crawlv1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{UID: "uid-1"}}, SpecHash: "h1"}
	for i := range 100 {
		require.NoError(t, CreateUnderKeys(ns, req, "creating", create))
		req.Replaces = fmt.Sprintf("px-1/h1@127.0.0.%d:3128", i)
	}
	assert.Equal(t, 100, created, "every replacement created one instance")

	lost := CreateRequest{Proxy: req.Proxy, SpecHash: "h2"}
	for range MaxIdempotencyAttempts {
		require.NoError(t, CreateUnderKeys(ns, lost, "creating", create), "instances lost before they were recorded walk the keys")
	}
	err := CreateUnderKeys(ns, lost, "creating", create)
	assert.ErrorIs(t, err, ErrTransient)
	assert.Equal(t, 100+MaxIdempotencyAttempts, created, "nothing created twice under one key")
}
