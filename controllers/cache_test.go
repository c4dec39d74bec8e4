package controllers

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"
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
// is past maxCacheLag, with the next write of any Proxy, so a fleet's
// entries do not stay for the fleet's life.
func TestWriteLagForgetsWhatNoPassAsksAbout(t *testing.T) {
	var lag writeLag
	for i := range 1000 {
		lag.wrote(types.NamespacedName{Namespace: "crawl", Name: fmt.Sprintf("px-%d", i)}, "1")
	}
	require.Len(t, lag.superseded, 1000)
	for k, s := range lag.superseded {
		s.at = s.at.Add(-maxCacheLag)
		lag.superseded[k] = s
	}
	lag.pruned = lag.pruned.Add(-maxCacheLag)
	fresh := types.NamespacedName{Namespace: "crawl", Name: "fresh"}
	lag.wrote(fresh, "7")
	assert.Len(t, lag.superseded, 1, "only the fresh write is kept")
	assert.True(t, lag.behind(fresh, "7"))
}
