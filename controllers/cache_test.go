package controllers

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/example/egress-proxies-operator/controllers/cachelag"
	"github.com/example/egress-proxies-operator/credentials"
)

// TestWriteOnce: workers that find one Secret missing at once (a spec's
// record, a provider instance's generated credentials) share one write and
// its payload, and do not write it again while the cache does not show
// it; once the cache shows it, or a write fails, the next is written.
func TestWriteOnce(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Now())
	l := &cacheLag{tracker: cachelag.New("test", clk, time.Second)}
	key := lagKey(lagSecret, types.NamespacedName{Namespace: "ops", Name: "provider-kind-local"})
	var writes atomic.Int32
	release := make(chan struct{})
	var generateErr error // a create that fails, when set
	generate := func() (any, error) {
		writes.Add(1)
		<-release
		return credentials.Generate(), generateErr
	}
	got := make([]any, 8)
	var wg sync.WaitGroup
	for i := range got {
		wg.Go(func() {
			c, err := l.writeOnce(key, "", generate)
			assert.NoError(t, err)
			got[i] = c
		})
	}
	time.Sleep(50 * time.Millisecond) // the eight are in or waiting on the one flight
	close(release)
	wg.Wait()
	assert.EqualValues(t, 1, writes.Load(), "eight workers, one create")
	for _, c := range got {
		assert.Equal(t, got[0], c, "every worker builds with the same credentials")
	}

	c, err := l.writeOnce(key, "", generate)
	require.NoError(t, err)
	assert.Equal(t, got[0], c, "the cache does not show it yet: the write made is the answer")
	assert.EqualValues(t, 1, writes.Load())

	_, err = l.writeOnce(key, "42", generate)
	require.NoError(t, err)
	assert.EqualValues(t, 2, writes.Load(), "the cache shows the Secret: a write it asks for is made")
	generateErr = errors.New("conflict")
	_, err = l.writeOnce(key, "43", generate)
	require.ErrorIs(t, err, generateErr, "a failed create hands out nothing")
	assert.EqualValues(t, 3, writes.Load())
	generateErr = nil

	failing := lagKey(lagSecret, types.NamespacedName{Namespace: "ops", Name: "proxy-record-crawl-h3"})
	_, err = l.writeOnce(failing, "", func() (any, error) { writes.Add(1); return nil, errors.New("forbidden") })
	require.Error(t, err)
	_, err = l.writeOnce(failing, "", func() (any, error) { writes.Add(1); return nil, nil })
	require.NoError(t, err)
	assert.EqualValues(t, 5, writes.Load(), "a failed write is tried again")

	clk.SetTime(clk.Now().Add(time.Second))
	_, err = l.writeOnce(failing, "", func() (any, error) { writes.Add(1); return nil, nil })
	require.NoError(t, err)
	assert.EqualValues(t, 6, writes.Load(), "past the bound the cache is the source: missing there means write")
}
