package redisstore

import (
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/example/egress-proxies-operator/lease"
)

// The scripts of what the store remembers besides leases: gateway
// sessions' routes, refused requests, the ledger, the outcome memory and
// burned IPs.

// setRouteScript: ARGV[3] the session, ARGV[4] host, ARGV[5] proxy,
// ARGV[6] 1 for the session's own proxy, 0 for host's detour, ARGV[7] idle
// ms, ARGV[8] 1 for a fresh stint, ARGV[9] and ARGV[10] the stint's IP
// and hold. A tunnel through the own proxy counts one use of the stint.
var setRouteScript = redis.NewScript(preamble + `
local key = P .. 'session:' .. ARGV[3]
if ARGV[6] == '1' then
  local cur = redis.call('HGET', key, 'own')
  if cur ~= ARGV[5] or ARGV[8] == '1' then
    redis.call('HSET', key, 'since', now, 'ip', ARGV[9], 'hold', ARGV[10], 'score', 0, 'uses', 0)
  end
  redis.call('HSET', key, 'own', ARGV[5])
  redis.call('HINCRBY', key, 'uses', 1)
  redis.call('HDEL', key, 'd:' .. ARGV[4])
else
  redis.call('HSET', key, 'd:' .. ARGV[4], ARGV[5])
end
redis.call('HSET', key, 'until', now + tonumber(ARGV[7]))
redis.call('PEXPIRE', key, tonumber(ARGV[7]))
return 1
`)

// routeScript: ARGV[3] the session, ARGV[4] host. Returns {own, detour,
// since, ip, hold, score, uses}, empty for none.
var routeScript = redis.NewScript(preamble + `
local r = redis.call('HMGET', P .. 'session:' .. ARGV[3], 'until', 'own', 'd:' .. ARGV[4], 'since', 'ip', 'hold', 'score', 'uses')
if not r[1] or tonumber(r[1]) <= now then return {'', '', '', '', '', '', ''} end
return {r[2] or '', r[3] or '', r[4] or '', r[5] or '', r[6] or '', r[7] or '', r[8] or ''}
`)

// markSession is the Lua that adds ARGV[delta] to the error score of the
// stint in session hash key when proxy is its own (never below 0), and
// returns the score as a string.
const markSession = `
local function markSession(key, own, proxy, delta)
  if own ~= proxy or delta == 0 then
    return redis.call('HGET', key, 'score') or '0'
  end
  local score = tonumber(redis.call('HINCRBYFLOAT', key, 'score', delta))
  if score < 0 then
    redis.call('HSET', key, 'score', 0)
    return '0'
  end
  return tostring(score)
end
`

// markSessionScript: ARGV[3] the session, ARGV[4] the proxy, ARGV[5] the
// delta. Returns the score, or false for an unknown session.
var markSessionScript = redis.NewScript(preamble + markSession + `
local key = P .. 'session:' .. ARGV[3]
local r = redis.call('HMGET', key, 'until', 'own')
if not r[1] or tonumber(r[1]) <= now then return false end
return markSession(key, r[2], ARGV[4], tonumber(ARGV[5]))
`)

// reportSessionScript: ARGV[3] the session, ARGV[4] result, ARGV[5]
// target, ARGV[6] cooldown ms, ARGV[7] the same-burst window ms, ARGV[8]
// the reporter (the session's tenant), ARGV[9] the client's fingerprint,
// ARGV[10] what the report adds to the stint's error score. Returns the
// proxy the session's requests to target went through, or an empty
// string for an unknown session.
var reportSessionScript = redis.NewScript(preamble + cool + outcomes + markSession + `
local key = P .. 'session:' .. ARGV[3]
local r = redis.call('HMGET', key, 'until', 'own', 'd:' .. ARGV[5], 'r:' .. ARGV[5])
if not r[1] or tonumber(r[1]) <= now then return '' end
local proxy = r[3] or r[2]
if not proxy then return '' end
if ARGV[4] ~= 'rate_limited' and ARGV[4] ~= 'blocked' then
  if ARGV[4] == 'ok' then recordOutcome(proxy, ARGV[5], false, 'report', false, ARGV[8], ARGV[9]) end
  markSession(key, r[2], proxy, tonumber(ARGV[10]))
  return proxy
end
if r[4] then
  local sep = string.find(r[4], '|', 1, true)
  if now - tonumber(string.sub(r[4], 1, sep - 1)) < tonumber(ARGV[7]) then
    return string.sub(r[4], sep + 1)
  end
end
markSession(key, r[2], proxy, tonumber(ARGV[10]))
redis.call('HSET', key, 'r:' .. ARGV[5], now .. '|' .. proxy)
if tonumber(ARGV[6]) > 0 then cool(proxy, ARGV[5], tonumber(ARGV[6])) end
recordOutcome(proxy, ARGV[5], true, 'report', ARGV[4] == 'rate_limited', ARGV[8], ARGV[9])
return proxy
`)

// noteRefusedScript: ARGV[3] the pool (namespace/name).
var noteRefusedScript = redis.NewScript(preamble + fmt.Sprintf(`
redis.call('SET', P .. 'refused:' .. ARGV[3], now, 'PX', %d)
return 1
`, lease.RefusedMemory.Milliseconds()))

// lastRefusedScript: ARGV[3] the pool. Returns when it was last refused,
// 0 for not within lease.RefusedMemory on the store's clock.
var lastRefusedScript = redis.NewScript(preamble + fmt.Sprintf(`
local at = tonumber(redis.call('GET', P .. 'refused:' .. ARGV[3]) or '0')
if now - at >= %d then return 0 end
return at
`, lease.RefusedMemory.Milliseconds()))

// askProbeScript: ARGV[3] the proxy (namespace/name). Adds it to the asks
// by the store's time in ms, forgetting those past lease.ProbeAskMemory.
var askProbeScript = redis.NewScript(preamble + fmt.Sprintf(`
redis.call('ZADD', P .. 'asked', now, ARGV[3])
redis.call('ZREMRANGEBYSCORE', P .. 'asked', '-inf', now - %[1]d)
redis.call('PEXPIRE', P .. 'asked', %[1]d)
return 1
`, lease.ProbeAskMemory.Milliseconds()))

// probesAskedScript: ARGV[3] the cursor (0: within lease.ProbeAskMemory).
// Returns the cursor for the next read (one ms back from now, so an ask
// in this ms is read again rather than missed), then the proxies asked
// for after the cursor given.
var probesAskedScript = redis.NewScript(preamble + fmt.Sprintf(`
local cursor = math.max(tonumber(ARGV[3]), now - %d)
local out = redis.call('ZRANGEBYSCORE', P .. 'asked', '(' .. cursor, '+inf')
table.insert(out, 1, now - 1)
return out
`, lease.ProbeAskMemory.Milliseconds()))

// appendLedgerScript: ARGV[3] the record (JSON), ARGV[4] retention ms.
// Adds it to the ledger stream under the store's time in ms (never before
// the last record's, so the stream stays ordered if TIME steps back), and
// trims what is older than the retention. Returns the record's ms.
var appendLedgerScript = redis.NewScript(preamble + `
local key = P .. 'ledger'
local ms = now
local last = redis.call('XREVRANGE', key, '+', '-', 'COUNT', 1)
if last[1] then
  local lastms = tonumber(string.match(last[1][1], '^(%d+)'))
  if lastms > ms then ms = lastms end
end
redis.call('XADD', key, 'MINID', tostring(now - tonumber(ARGV[4])), ms .. '-*', 'e', ARGV[3])
return ms
`)

// recordOutcomeScript: ARGV[3] proxy, ARGV[4] host, ARGV[5] 1 for blocked,
// ARGV[6] its source, ARGV[7] the cooldown ms a blocked outcome sets (0:
// none), ARGV[8] 1 for a push-back, ARGV[9] its reporter, ARGV[10] its
// client's fingerprint.
var recordOutcomeScript = redis.NewScript(preamble + cool + outcomes + `
recordOutcome(ARGV[3], ARGV[4], ARGV[5] == '1', ARGV[6], ARGV[8] == '1', ARGV[9], ARGV[10])
if ARGV[5] == '1' and tonumber(ARGV[7]) > 0 then cool(ARGV[3], ARGV[4], tonumber(ARGV[7])) end
return 1
`)

// outcomesScript: ARGV[3] proxy. Returns host, served, blocked (as
// strings, decayed to now), at, last blocked, by, voices, passes, for
// each record.
var outcomesScript = redis.NewScript(preamble + outcomes + `
local all, out = redis.call('HGETALL', P .. 'out:' .. ARGV[3]), {}
for i = 1, #all, 2 do
  local f = splitRecord(all[i + 1])
  local at = tonumber(f[3])
  if now - at < OR then
    out[#out + 1] = all[i]
    out[#out + 1] = tostring(decayed(tonumber(f[1]), at))
    out[#out + 1] = tostring(decayed(tonumber(f[2]), at))
    out[#out + 1] = at
    out[#out + 1] = tonumber(f[4])
    out[#out + 1] = f[5]
    out[#out + 1] = f[6] or ''
    out[#out + 1] = f[7] or ''
  end
end
return out
`)

// blocksScript: ARGV[3] since ms. Returns "<proxy>|<host>", its last block
// ms, what saw it, its voices and its passes, for each block since.
var blocksScript = redis.NewScript(preamble + outcomes + `
local since = math.max(tonumber(ARGV[3]), now - OR)
local z, out = redis.call('ZRANGEBYSCORE', P .. 'blocks', since, '+inf', 'WITHSCORES'), {}
for i = 1, #z, 2 do
  local m = z[i]
  local sep = string.find(m, '|', 1, true)
  local raw = redis.call('HGET', P .. 'out:' .. string.sub(m, 1, sep - 1), string.sub(m, sep + 1))
  local by, voices, passes = '', '', ''
  if raw then
    local f = splitRecord(raw)
    by, voices, passes = f[5], f[6] or '', f[7] or ''
  end
  out[#out + 1] = m
  out[#out + 1] = tonumber(z[i + 1])
  out[#out + 1] = by
  out[#out + 1] = voices
  out[#out + 1] = passes
end
return out
`)

// burnIPScript: ARGV[3] scope, ARGV[4] ip, ARGV[5] retention ms.
var burnIPScript = redis.NewScript(preamble + `
local key = P .. 'burned:' .. ARGV[3]
local untilv = now + tonumber(ARGV[5])
redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
local old = tonumber(redis.call('ZSCORE', key, ARGV[4]) or '0')
if untilv > old then redis.call('ZADD', key, untilv, ARGV[4]) end
extend(key, tonumber(ARGV[5]))
return 1
`)

// burnedUntilScript: ARGV[3] scope, ARGV[4] ip. Returns the end of its
// retention in ms, 0 when it is not burned.
var burnedUntilScript = redis.NewScript(preamble + `
local untilv = tonumber(redis.call('ZSCORE', P .. 'burned:' .. ARGV[3], ARGV[4]) or '0')
if untilv <= now then return 0 end
return untilv
`)

// endCooldownScript: ARGV[3] proxy, ARGV[4] host, ARGV[5] the latest end
// (ms) of a cooldown it ends (lease.OutcomeMemory.EndCooldown).
var endCooldownScript = redis.NewScript(preamble + `
local member = ARGV[3] .. '|' .. ARGV[4]
local untilv = tonumber(redis.call('GET', P .. 'cool:' .. member) or '0')
if untilv > 0 and untilv <= tonumber(ARGV[5]) then
  redis.call('DEL', P .. 'cool:' .. member)
  redis.call('ZREM', P .. 'cooldowns', member)
end
return 1
`)

// forgetProxyScript: ARGV[3] proxy. Drops its cooldowns and outcome
// records (lease.OutcomeMemory.ForgetProxy).
var forgetProxyScript = redis.NewScript(preamble + `
local proxy = ARGV[3]
for _, h in ipairs(redis.call('SMEMBERS', P .. 'coolhosts:' .. proxy)) do
  redis.call('DEL', P .. 'cool:' .. proxy .. '|' .. h)
  redis.call('ZREM', P .. 'cooldowns', proxy .. '|' .. h)
end
redis.call('DEL', P .. 'coolhosts:' .. proxy)
for _, h in ipairs(redis.call('HKEYS', P .. 'out:' .. proxy)) do
  redis.call('HDEL', P .. 'obh:' .. h, proxy)
  redis.call('ZREM', P .. 'blocks', proxy .. '|' .. h)
end
redis.call('DEL', P .. 'out:' .. proxy)
return 1
`)

// markClientBanScript: ARGV[3] "<host>|<client>", ARGV[4] its retention
// (ms).
// Ended marks go; past lease.MaxClientBans the one that ends first goes.
var markClientBanScript = redis.NewScript(preamble + fmt.Sprintf(`
local key = P .. 'clientbans'
redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
redis.call('ZADD', key, 'GT', now + tonumber(ARGV[4]), ARGV[3])
local extra = redis.call('ZCARD', key) - %d
if extra > 0 then redis.call('ZPOPMIN', key, extra) end
redis.call('PEXPIREAT', key, redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2])
return 1
`, lease.MaxClientBans))

// clientBansScript: returns "<host>|<client>" and its end (ms) for each
// mark not yet ended.
var clientBansScript = redis.NewScript(preamble + `
return redis.call('ZRANGEBYSCORE', P .. 'clientbans', after, '+inf', 'WITHSCORES')
`)
