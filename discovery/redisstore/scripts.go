package redisstore

import "github.com/redis/go-redis/v9"

// Every operation is one Lua script: atomic on the server, and on the
// server's clock. Each script opens with the same preamble: ARGV[1] is the
// key prefix, ARGV[2] a test-only offset in milliseconds added to TIME (0 in
// production), and `now` is the store's time in milliseconds.
//
// Keys (P is the prefix):
//
//	P lease:<id>          hash proxy, target, created, expires; expires by itself
//	P proxy:<proxy>       zset of the proxy's lease ids by expiry: its load is
//	                      the members not yet expired; expires with its last lease
//	P last:<proxy>        when the proxy was last leased (ties), for an hour
//	P cool:<proxy>|<host> the end of the proxy's cooldown for host; expires by itself
//	P leases, P cooldowns zsets of every lease and cooldown by end, for the
//	                      metrics only
//	P refused             hash pool -> last refused lease request
//	P session:<session>   hash of a gateway session's routes: "own" -> its
//	                      proxy, "d:<host>" -> the host's detour, "r:<host>"
//	                      -> "<ms>|<proxy>" of its last rate_limited report,
//	                      "until" the end of its idle time; expires by itself
//
// A key is declared in no KEYS array, since the scripts compute them: the
// store needs a standalone Redis (or a primary), not Redis Cluster.
const preamble = `
local P = ARGV[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[2])
local function load(proxy)
  return redis.call('ZCOUNT', P .. 'proxy:' .. proxy, '(' .. now, '+inf')
end
local function live(id)
  local l = redis.call('HMGET', P .. 'lease:' .. id, 'proxy', 'target', 'created', 'expires')
  if not l[1] or tonumber(l[4]) <= now then return nil end
  return l
end
local function extend(key, ms)
  if redis.call('PTTL', key) < ms then redis.call('PEXPIRE', key, ms) end
end
`

// acquireScript: ARGV[3] ttl ms, ARGV[4] target, ARGV[5] the new lease's
// id, ARGV[6..] the candidates. Returns {1, proxy, created, expires, load}
// or {0, ms until the first candidate's cooldown ends (0: none cooling)}.
var acquireScript = redis.NewScript(preamble + `
local ttl, target, id = tonumber(ARGV[3]), ARGV[4], ARGV[5]
local best, bestLoad, bestLast, soonest
for i = 6, #ARGV do
  local proxy = ARGV[i]
  local cooling = false
  if target ~= '' then
    local untilv = tonumber(redis.call('GET', P .. 'cool:' .. proxy .. '|' .. target) or '0')
    if untilv > now then
      cooling = true
      if not soonest or untilv < soonest then soonest = untilv end
    end
  end
  if not cooling then
    local l = load(proxy)
    local last = tonumber(redis.call('GET', P .. 'last:' .. proxy) or '0')
    if not best or l < bestLoad or (l == bestLoad and (last < bestLast or (last == bestLast and proxy < best))) then
      best, bestLoad, bestLast = proxy, l, last
    end
  end
end
if not best then
  if soonest then return {0, soonest - now} end
  return {0, 0}
end
local expires = now + ttl
local key = P .. 'lease:' .. id
redis.call('HSET', key, 'proxy', best, 'target', target, 'created', now, 'expires', expires)
redis.call('PEXPIRE', key, ttl)
local zkey = P .. 'proxy:' .. best
redis.call('ZREMRANGEBYSCORE', zkey, '-inf', now)
redis.call('ZADD', zkey, expires, id)
extend(zkey, ttl)
redis.call('SET', P .. 'last:' .. best, now, 'PX', 3600000)
redis.call('ZADD', P .. 'leases', expires, id)
return {1, best, now, expires, bestLoad + 1}
`)

// getScript: ARGV[3] the lease id. Returns {proxy, target, created,
// expires, load} or nil.
var getScript = redis.NewScript(preamble + `
local l = live(ARGV[3])
if not l then return nil end
return {l[1], l[2], tonumber(l[3]), tonumber(l[4]), load(l[1])}
`)

// renewScript: ARGV[3] the lease id, ARGV[4] ttl ms. Returns what get does.
var renewScript = redis.NewScript(preamble + `
local id, ttl = ARGV[3], tonumber(ARGV[4])
local l = live(id)
if not l then return nil end
local expires = now + ttl
local key = P .. 'lease:' .. id
redis.call('HSET', key, 'expires', expires)
redis.call('PEXPIRE', key, ttl)
local zkey = P .. 'proxy:' .. l[1]
redis.call('ZADD', zkey, expires, id)
extend(zkey, ttl)
redis.call('ZADD', P .. 'leases', expires, id)
return {l[1], l[2], tonumber(l[3]), expires, load(l[1])}
`)

// releaseScript: ARGV[3] the lease id. Idempotent.
var releaseScript = redis.NewScript(preamble + `
local id = ARGV[3]
local key = P .. 'lease:' .. id
local proxy = redis.call('HGET', key, 'proxy')
if proxy then redis.call('ZREM', P .. 'proxy:' .. proxy, id) end
redis.call('ZREM', P .. 'leases', id)
redis.call('DEL', key)
return 1
`)

// cool is the preamble's addition for the scripts that start cooldowns.
const cool = `
local function cool(proxy, target, ms)
  local member = proxy .. '|' .. target
  local key = P .. 'cool:' .. member
  local untilv = now + ms
  local old = tonumber(redis.call('GET', key) or '0')
  if untilv > old then
    redis.call('SET', key, untilv, 'PX', untilv - now)
    redis.call('ZADD', P .. 'cooldowns', untilv, member)
  end
end
`

// reportScript: ARGV[3] the lease id, ARGV[4] result, ARGV[5] target,
// ARGV[6] cooldown ms. Returns 0 when the lease is not live, 1 otherwise.
var reportScript = redis.NewScript(preamble + cool + `
local l = live(ARGV[3])
if not l then return 0 end
if ARGV[4] == 'rate_limited' then cool(l[1], ARGV[5], tonumber(ARGV[6])) end
return 1
`)

// setRouteScript: ARGV[3] the session, ARGV[4] host, ARGV[5] proxy,
// ARGV[6] 1 for the session's own proxy, 0 for host's detour, ARGV[7] idle
// ms.
var setRouteScript = redis.NewScript(preamble + `
local key = P .. 'session:' .. ARGV[3]
if ARGV[6] == '1' then
  redis.call('HSET', key, 'own', ARGV[5])
  redis.call('HDEL', key, 'd:' .. ARGV[4])
else
  redis.call('HSET', key, 'd:' .. ARGV[4], ARGV[5])
end
redis.call('HSET', key, 'until', now + tonumber(ARGV[7]))
redis.call('PEXPIRE', key, tonumber(ARGV[7]))
return 1
`)

// routeScript: ARGV[3] the session, ARGV[4] host. Returns {own, detour},
// empty for none.
var routeScript = redis.NewScript(preamble + `
local r = redis.call('HMGET', P .. 'session:' .. ARGV[3], 'until', 'own', 'd:' .. ARGV[4])
if not r[1] or tonumber(r[1]) <= now then return {'', ''} end
return {r[2] or '', r[3] or ''}
`)

// reportSessionScript: ARGV[3] the session, ARGV[4] result, ARGV[5]
// target, ARGV[6] cooldown ms, ARGV[7] the same-burst window ms. Returns
// the proxy the session's requests to target went through, or an empty
// string for an unknown session.
var reportSessionScript = redis.NewScript(preamble + cool + `
local key = P .. 'session:' .. ARGV[3]
local r = redis.call('HMGET', key, 'until', 'own', 'd:' .. ARGV[5], 'r:' .. ARGV[5])
if not r[1] or tonumber(r[1]) <= now then return '' end
local proxy = r[3] or r[2]
if not proxy then return '' end
if ARGV[4] ~= 'rate_limited' then return proxy end
if r[4] then
  local sep = string.find(r[4], '|', 1, true)
  if now - tonumber(string.sub(r[4], 1, sep - 1)) < tonumber(ARGV[7]) then
    return string.sub(r[4], sep + 1)
  end
end
redis.call('HSET', key, 'r:' .. ARGV[5], now .. '|' .. proxy)
cool(proxy, ARGV[5], tonumber(ARGV[6]))
return proxy
`)

// loadsScript: ARGV[3..] proxies. Returns each one's live leases.
var loadsScript = redis.NewScript(preamble + `
local out = {}
for i = 3, #ARGV do out[#out + 1] = load(ARGV[i]) end
return out
`)

// countsScript drops what ended from the metrics' zsets and counts the
// rest: {leases, cooldowns}.
var countsScript = redis.NewScript(preamble + `
redis.call('ZREMRANGEBYSCORE', P .. 'leases', '-inf', now)
redis.call('ZREMRANGEBYSCORE', P .. 'cooldowns', '-inf', now)
return {redis.call('ZCARD', P .. 'leases'), redis.call('ZCARD', P .. 'cooldowns')}
`)

// noteRefusedScript: ARGV[3] the pool.
var noteRefusedScript = redis.NewScript(preamble + `
redis.call('HSET', P .. 'refused', ARGV[3], now)
return 1
`)
