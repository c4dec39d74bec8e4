package redisstore

import (
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/example/egress-proxies-operator/lease"
)

// The scripts of paces and quotas: a host's learned pace, a tenant's rate
// and counts.

// slotScript: ARGV[3] the proxy's bucket (lease.Pace.BucketOf), ARGV[4]
// target, ARGV[5] interval ms,
// ARGV[6] burst, ARGV[7] fleet key, ARGV[8] fleet interval ms, ARGV[9]
// fleet burst, ARGV[10] 1 to apply the target's learned pace, ARGV[11]
// the longest wait ms. Reserves the slot as the acquire script does, with
// no lease; returns {1, wait ms} or {0, wait ms} when it comes too late.
var slotScript = redis.NewScript(preamble + pacing + `
local bucket, target = ARGV[3], ARGV[4]
local p = {interval = tonumber(ARGV[5]), burst = tonumber(ARGV[6]), fkey = ARGV[7], finterval = tonumber(ARGV[8]), fburst = tonumber(ARGV[9])}
if ARGV[10] == '1' then
  local learned = learnedAt(target)
  if learned > p.interval then p.interval, p.burst = learned, math.max(p.burst, 1) end
end
local wait = slotWait(bucket, target, p)
if wait > tonumber(ARGV[11]) then return {0, wait} end
slotReserve(bucket, target, p)
return {1, wait}
`)

// pushBackScript: ARGV[3] host, ARGV[4] Retry-After ms (0: none). Moves
// the host's learned pace as lease.PushedBack does; returns {interval
// ms, since, push-backs}.
var pushBackScript = redis.NewScript(preamble + pacing + fmt.Sprintf(`
local host, ra = ARGV[3], math.min(tonumber(ARGV[4]), %[1]d)
local cur, since, n = learnedAt(host)
local next
if cur > 0 and now - since < cur then
  next = math.max(cur, ra)
else
  next = math.max(2 * cur, ra)
  if next <= 0 then next = %[2]d end
  next = math.min(math.max(next, %[3]d), %[1]d)
end
local key = P .. 'learn:' .. host
redis.call('HSET', key, 'i', next, 'since', now, 'n', n + 1)
redis.call('PEXPIRE', key, %[4]d)
return {next, now, n + 1}
`, lease.MaxLearnedInterval.Milliseconds(), lease.FirstLearnedInterval.Milliseconds(),
	lease.MinLearnedInterval.Milliseconds(), learnedTTL.Milliseconds()))

// learnedScript: ARGV[3] host. Returns {interval ms, since, push-backs},
// zeros for none.
var learnedScript = redis.NewScript(preamble + pacing + `
local i, since, n = learnedAt(ARGV[3])
return {i, since, n}
`)

// admitScript: ARGV[3] the key, ARGV[4] interval ms, ARGV[5] burst.
// Returns 0 when admitted (one taken), else the ms until one is allowed.
var admitScript = redis.NewScript(preamble + pacing + `
local key, interval, burst = P .. 'admit:' .. ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
local wait = gcraWait(key, interval, burst)
if wait > 0 then return wait end
gcraReserve(key, interval)
return 0
`)

// addUsageScript: ARGV[3] the key, ARGV[4] n, ARGV[5] ttl ms. Returns the
// count.
var addUsageScript = redis.NewScript(preamble + `
local key = P .. 'usage:' .. ARGV[3]
local n = tonumber(ARGV[4])
if n == 0 then return tonumber(redis.call('GET', key) or '0') end
local total = redis.call('INCRBY', key, n)
if redis.call('PTTL', key) < 0 then redis.call('PEXPIRE', key, tonumber(ARGV[5])) end
return total
`)
