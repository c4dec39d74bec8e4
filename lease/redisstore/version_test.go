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
	info := func(v string) string {
		return "# Server\r\nredis_version:" + v + "\r\nredis_git_sha1:00000000\r\nredis_mode:standalone\r\n"
	}
	for _, v := range []string{"7.0.15", "7.2.4", "8.0.2", "10.1.0"} {
		assert.NoError(t, checkVersion(info(v)), v)
	}
	for _, v := range []string{"6.2.14", "5.0.7"} {
		err := checkVersion(info(v))
		require.Error(t, err, v)
		assert.Contains(t, err.Error(), "redis "+v+": the lease store needs Redis 7.0 or later")
	}
	assert.ErrorContains(t, checkVersion("# Server\r\nredis_mode:standalone\r\n"), "names no redis_version")
	assert.ErrorContains(t, checkVersion(info("x.y")), `redis_version "x.y"`)
}
