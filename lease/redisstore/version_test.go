package redisstore

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestAnOldRedisIsNamed: the scripts need Redis 7.0; on an older one the
// store's Ping (the replica's readiness) says so instead of every lease
// failing with a script error.
func TestAnOldRedisIsNamed(t *testing.T) {
	for _, v := range []string{"7.0.15", "7.2.4", "8.0.2", "10.1.0"} {
		assert.NoError(t, checkVersion(v), v)
	}
	for _, v := range []string{"6.2.14", "5.0.7"} {
		err := checkVersion(v)
		require.Error(t, err, v)
		assert.Contains(t, err.Error(), "redis "+v+": the lease store needs Redis 7.0 or later")
	}
	assert.ErrorContains(t, checkVersion(""), "names no redis_version")
	assert.ErrorContains(t, checkVersion("x.y"), `redis_version "x.y"`)
}
