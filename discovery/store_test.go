package discovery

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var t0 = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

// TestStoreAgainstAModel runs random operations one at a time and checks
// every Acquire against a simple model: the chosen proxy is not cooling for
// the target, and has the fewest active leases among those that are not.
func TestStoreAgainstAModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	s := NewMemoryStore()
	proxies := []string{"a", "b", "c", "d"}
	targets := []string{"", "x.com", "y.com"}
	active := map[string]int{}
	cooling := map[[2]string]time.Time{}
	leases := map[string]Lease{}
	now := t0
	for step := range 5000 {
		now = now.Add(time.Duration(rng.IntN(3)) * time.Second)
		switch op := rng.IntN(10); {
		case op < 5:
			target := targets[rng.IntN(len(targets))]
			got, err := s.Acquire(proxies, target, 24*time.Hour, now) // outlives the run: expiry has its own test
			fewest := -1
			for _, p := range proxies {
				if target != "" && now.Before(cooling[[2]string{p, target}]) {
					continue
				}
				if fewest == -1 || active[p] < fewest {
					fewest = active[p]
				}
			}
			if fewest == -1 {
				require.ErrorIs(t, err, ErrNoProxyAvailable, "step %d", step)
				continue
			}
			require.NoError(t, err, "step %d", step)
			assert.False(t, target != "" && now.Before(cooling[[2]string{got.ProxyID, target}]), "step %d: leased a cooling proxy", step)
			assert.Equal(t, fewest, active[got.ProxyID], "step %d: not the least-loaded proxy", step)
			active[got.ProxyID]++
			leases[got.ID] = got
		case op < 8 && len(leases) > 0:
			for id, l := range leases {
				s.Release(id)
				active[l.ProxyID]--
				delete(leases, id)
				break
			}
		case len(leases) > 0:
			for id, l := range leases {
				target := targets[1+rng.IntN(2)]
				require.NoError(t, s.Report(id, ResultRateLimited, target, time.Minute, now))
				key := [2]string{l.ProxyID, target}
				if until := now.Add(time.Minute); until.After(cooling[key]) {
					cooling[key] = until
				}
				break
			}
		}
		snap := s.Snapshot(now)
		require.Equal(t, len(leases), snap.ActiveLeases, "step %d", step)
	}
}

// TestStoreConcurrently hammers the store from many goroutines (run with
// -race): a proxy a goroutine reported rate-limited is never leased to it
// again for that target, and the counts return to zero.
func TestStoreConcurrently(t *testing.T) {
	s := NewMemoryStore()
	var proxies []string
	for i := range 16 {
		proxies = append(proxies, fmt.Sprintf("crawl/px-%d", i))
	}
	var wg sync.WaitGroup
	for g := range 64 {
		wg.Go(func() {
			target := fmt.Sprintf("site-%d.example", g)
			banned := map[string]bool{}
			for i := range 300 {
				l, err := s.Acquire(proxies, target, time.Hour, t0)
				if err != nil {
					assert.Len(t, banned, len(proxies), "503 only once every proxy is cooling for the target")
					continue
				}
				assert.False(t, banned[l.ProxyID], "leased %s for %s after reporting it rate-limited", l.ProxyID, target)
				if i%7 == 0 {
					assert.NoError(t, s.Report(l.ID, ResultRateLimited, target, time.Hour, t0))
					banned[l.ProxyID] = true
				}
				if _, err := s.Renew(l.ID, time.Hour, t0); err != nil {
					t.Errorf("renewing a live lease: %v", err)
				}
				s.Release(l.ID)
				s.Release(l.ID) // idempotent
			}
		})
	}
	wg.Wait()
	snap := s.Snapshot(t0)
	assert.Zero(t, snap.ActiveLeases, "every lease was released")
	assert.Empty(t, snap.Leases)
	assert.Positive(t, snap.ActiveCooldowns)
}

func TestStoreExpiry(t *testing.T) {
	s := NewMemoryStore()
	short, err := s.Acquire([]string{"a"}, "", time.Minute, t0)
	require.NoError(t, err)
	long, err := s.Acquire([]string{"a"}, "", time.Hour, t0)
	require.NoError(t, err)
	require.NoError(t, s.Report(long.ID, ResultRateLimited, "x.com", 10*time.Minute, t0))

	later := t0.Add(2 * time.Minute)
	_, err = s.Get(short.ID, later)
	assert.ErrorIs(t, err, ErrLeaseNotFound, "expired lazily on access")
	assert.Equal(t, 1, s.Snapshot(later).ActiveLeases)

	much := t0.Add(2 * time.Hour)
	s.Expire(much)
	snap := s.Snapshot(much)
	assert.Zero(t, snap.ActiveLeases, "no lease outlives its TTL")
	assert.Zero(t, snap.ActiveCooldowns, "cooldowns end too")
	_, err = s.Renew(long.ID, time.Hour, much)
	assert.ErrorIs(t, err, ErrLeaseNotFound)
	l, err := s.Acquire([]string{"a"}, "x.com", time.Hour, much)
	require.NoError(t, err)
	assert.Equal(t, "a", l.ProxyID)
}
