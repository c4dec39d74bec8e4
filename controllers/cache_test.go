package controllers

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"

	"github.com/example/egress-proxies-operator/credentials"
)

// TestWriteLag: a pass that reads the version its own write replaced waits;
// one that reads anything else acts, and the key is forgotten.
func TestWriteLag(t *testing.T) {
	var lag writeLag
	key := types.NamespacedName{Namespace: "crawl", Name: "eu-1"}
	assert.False(t, lag.behind(key, "10"), "nothing written: act")
	lag.wrote(key, "10")
	assert.True(t, lag.behind(key, "10"), "the cache still shows what the write replaced: wait")
	assert.False(t, lag.behind(key, "11"), "the cache caught up: act")
	assert.False(t, lag.behind(key, "10"), "forgotten once caught up")
	lag.wrote(key, "12")
	assert.False(t, lag.behind(key, "15"), "another writer moved it on: act")
	lag.wrote(key, "16")
	lag.forget(key)
	assert.False(t, lag.behind(key, "16"), "a deleted Proxy is forgotten")

	lag.wrote(key, "20")
	lag.superseded[key] = supersededVersion{version: "20", at: time.Now().Add(-maxCacheLag)}
	assert.False(t, lag.behind(key, "20"), "a cache that never catches up is not waited for forever")
}

// TestWriteLagForgetsWhatNoPassAsksAbout: a Proxy's last write (Ready,
// nothing to requeue) is never followed by a pass; its entry goes once it
// is past maxCacheLag, and the map itself once it is empty, so a fleet's
// bring-up does not stay in memory for the fleet's life.
func TestWriteLagForgetsWhatNoPassAsksAbout(t *testing.T) {
	var lag writeLag
	for i := range 1000 {
		lag.wrote(types.NamespacedName{Namespace: "crawl", Name: fmt.Sprintf("px-%d", i)}, "1")
	}
	fresh := types.NamespacedName{Namespace: "crawl", Name: "fresh"}
	lag.wrote(fresh, "7")
	lag.mu.Lock()
	for k, s := range lag.superseded {
		if k != fresh {
			s.at = s.at.Add(-maxCacheLag)
			lag.superseded[k] = s
		}
	}
	lag.mu.Unlock()
	assert.True(t, lag.pruning, "a prune is due")
	lag.prune()
	assert.Len(t, lag.superseded, 1, "only the fresh write is kept")
	assert.True(t, lag.behind(fresh, "7"))
	assert.True(t, lag.pruning, "a prune is due while entries are left")

	lag.superseded[fresh] = supersededVersion{version: "7", at: time.Now().Add(-maxCacheLag)}
	lag.prune()
	assert.Nil(t, lag.superseded, "an empty map is let go")
	assert.False(t, lag.pruning)
	lag.wrote(fresh, "8")
	assert.True(t, lag.behind(fresh, "8"), "and made again by the next write")
}

// TestRecentRecords: workers bringing up instances of one spec at once
// write its record once, and do not write it again while the cache may
// not show it yet; a failed write is not remembered.
func TestRecentRecords(t *testing.T) {
	var r recentRecords
	key, other := types.NamespacedName{Namespace: "ops", Name: "proxy-record-crawl-h1"}, types.NamespacedName{Namespace: "ops", Name: "proxy-record-crawl-h2"}
	var writes atomic.Int32
	release := make(chan struct{})
	// write counts a write that ends when release is closed, with err.
	write := func(err error) func() error { return func() error { writes.Add(1); <-release; return err } }
	slowWrite := write(nil)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { assert.NoError(t, r.ensure(key, slowWrite)) })
	}
	time.Sleep(50 * time.Millisecond) // the eight are in or waiting on the one flight
	close(release)
	wg.Wait()
	assert.EqualValues(t, 1, writes.Load(), "eight workers, one write")

	require.NoError(t, r.ensure(key, slowWrite))
	assert.EqualValues(t, 1, writes.Load(), "written a moment ago: not again")
	require.NoError(t, r.ensure(other, slowWrite))
	assert.EqualValues(t, 2, writes.Load(), "another spec's record is written")

	failing := types.NamespacedName{Namespace: "ops", Name: "proxy-record-crawl-h3"}
	require.Error(t, r.ensure(failing, write(errors.New("conflict"))))
	require.NoError(t, r.ensure(failing, slowWrite))
	assert.EqualValues(t, 4, writes.Load(), "a failed write is tried again")
}

// TestGeneratedCredentials: the workers that find a provider instance's
// credentials missing at once share one generation (one create), which is
// handed out until the cache has had maxCacheLag to show it; a failed
// generation is not remembered.
func TestGeneratedCredentials(t *testing.T) {
	var g generatedCredentials
	ref := credentials.Ref{Namespace: "egress-proxies-system", Name: "provider-kind-local"}
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	var generations atomic.Int32
	var createErr error // a create that fails, from the third generation on
	generate := func() (credentials.Credentials, error) {
		if generations.Add(1) > 2 && createErr != nil {
			return credentials.Credentials{}, createErr
		}
		time.Sleep(10 * time.Millisecond) // a create's round trip: the others arrive meanwhile
		return credentials.Generate(), nil
	}
	got := make([]credentials.Credentials, 8)
	var wg sync.WaitGroup
	for i := range got {
		wg.Go(func() {
			c, err := g.ensure(ref, now, generate)
			assert.NoError(t, err)
			got[i] = c
		})
	}
	wg.Wait()
	assert.Equal(t, int32(1), generations.Load(), "one create for every worker")
	for _, c := range got {
		assert.Equal(t, got[0], c, "every worker builds with the same credentials")
	}
	assert.False(t, got[0].IsZero())

	again, err := g.ensure(ref, now.Add(maxCacheLag), generate)
	require.NoError(t, err)
	assert.Equal(t, int32(2), generations.Load(), "after maxCacheLag the cache is the source: missing there means generate")
	assert.NotEqual(t, got[0], again)

	other := credentials.Ref{Namespace: ref.Namespace, Name: "provider-gcp-eu"}
	createErr = errors.New("forbidden")
	_, err = g.ensure(other, now, generate)
	require.ErrorIs(t, err, createErr)
	createErr = nil
	c, err := g.ensure(other, now, generate)
	require.NoError(t, err)
	assert.False(t, c.IsZero(), "a failed generation is tried again, not handed out")
	assert.Equal(t, int32(4), generations.Load())
}
