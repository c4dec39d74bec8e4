package redisstore

import (
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/example/egress-proxies-operator/lease"
)

// Every operation is one Lua script: atomic on the server, and on the
// server's clock. Each script opens with the same preamble: ARGV[1] is the
// key prefix, ARGV[2] a test-only offset in milliseconds added to TIME (0 in
// production), and `now` is the store's time in milliseconds (`nows` as a
// string, `after` the score range's open bound just past it).
//
// Most of a script's time inside Redis is its calls and the numbers they
// carry, each formatted to a string on its way in: the scripts on the
// lease path format a time once and pass strings (ttl ms as it came in
// ARGV), and make no call whose answer they already know.
//
// Keys (P is the prefix):
//
//	P lease:<id>          hash proxy, target, created, expires, holder,
//	                      limit, excl, hl; expires by itself
//	P limit:<key>         zset of the lease ids under a Limit key by expiry;
//	                      expires with its last lease
//	P admit:<key>         the GCRA arrival time of a tenant's rate (Admit)
//	P usage:<key>         a count (AddUsage); expires ttl after its first use
//	P ledger              stream of ledger records ("e": the JSON) by the
//	                      store's ms; trimmed to the retention on append
//	P proxy:<proxy>       zset of the proxy's lease ids by expiry: its load is
//	                      the members not yet expired; expires with its last lease
//	P last:<proxy>        when the proxy was last leased (the ties of a set
//	                      weighed whole; a sample's go to its first), for an hour
//	P cool:<proxy>|<host> the end of the proxy's cooldown for host; expires by itself
//	P coolt:<host>        zset of the proxies cooling for host by the end
//	                      of their cooldown (an ended one may linger): an
//	                      acquire for a host nobody cools for reads no
//	                      candidate's cooldown
//	P leases, P cooldowns zsets of every lease and cooldown by end, for the
//	                      metrics only; each write that adds to one drops
//	                      what ended from it, so they never outgrow the
//	                      live leases and cooldowns, and a scrape only reads;
//	                      each expires with its last member
//	P hl:<bucket>|<host>  zset of the lease ids for host by expiry of a
//	                      pace bucket (lease.Pace.BucketOf: a sender, or
//	                      the proxy), the lease hash's field hl naming it:
//	                      its connections to host, for a concurrency limit
//	P tat:<proxy>|<host>  the GCRA arrival time of the proxy's next request
//	                      to host; expires once past
//	P fleet:<policy>|<host> the same across a policy's whole fleet
//	P learn:<host>        hash of host's learned pace: "i" interval ms,
//	                      "since", "n" push-backs
//	P refused:<ns>/<pool> when a lease request selecting the pool was last
//	                      refused; expires after lease.RefusedMemory
//	P asked               zset of the proxies a tunnel could not reach by
//	                      when (AskProbe), trimmed to lease.ProbeAskMemory
//	                      on each ask; expires with its last
//	P out:<proxy>         hash of the proxy's outcome records: host ->
//	                      "served|blocked|at|lastBlocked|by|voices" (weights
//	                      as of at; voices "who@ms;..." the latest block of
//	                      each reporter, latest first); expires
//	                      OutcomeRetention after its last write
//	P obh:<host>          hash of the proxies host blocked: proxy ->
//	                      "blocked|at", for the selection's tie-break; the
//	                      same expiry
//	P blocks              zset of "<proxy>|<host>" by its last block, trimmed
//	                      to OutcomeRetention on each block (Blocks)
//	P burned:<scope>      zset of the scope's burned IPs by the end of their
//	                      retention, trimmed on each burn
//	P coolhosts:<proxy>   set of the hosts the proxy has cooled for, so
//	                      ForgetProxy finds its cooldowns; expires with the
//	                      last
//	P session:<session>   hash of a gateway session's routes: "own" -> its
//	                      proxy, "since", "ip" and "hold" of its stint
//	                      there, "d:<host>" -> the host's detour, "r:<host>"
//	                      -> "<ms>|<proxy>" of its last rate_limited report,
//	                      "until" the end of its idle time; expires by itself
//	P hold:<proxy>        the id of the exclusive lease holding the proxy;
//	                      expires with it
//	P holds               zset of the exclusive leases by expiry, so an
//	                      acquire with none live looks up no hold
//
// A key is declared in no KEYS array, since the scripts compute them: the
// store needs a standalone Redis (or a primary), not Redis Cluster.
const preamble = `
local P = ARGV[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[2])
local nows = string.format('%d', now)
local after = '(' .. nows
local function load(proxy)
  return redis.call('ZCOUNT', P .. 'proxy:' .. proxy, after, '+inf')
end
local function live(id)
  local l = redis.call('HMGET', P .. 'lease:' .. id, 'proxy', 'target', 'created', 'expires', 'holder', 'limit', 'excl', 'hl')
  if not l[1] or tonumber(l[4]) <= now then return nil end
  return l
end
local function heldUntil(proxy, within)
  local h = redis.call('GET', P .. 'hold:' .. proxy)
  if not h or h == within then return 0 end
  local x = tonumber(redis.call('HGET', P .. 'lease:' .. h, 'expires') or '0')
  if x <= now then return 0 end
  return x
end
local function extend(key, ms, fresh)
  if fresh then
    redis.call('PEXPIRE', key, ms)
  elseif redis.call('PEXPIRE', key, ms, 'GT') == 0 and redis.call('PTTL', key) == -1 then
    redis.call('PEXPIRE', key, ms)
  end
end
local function add(key, id, ends, ms, fresh)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', nows)
  redis.call('ZADD', key, ends, id)
  extend(key, ms, fresh)
end
`

// pacing is the preamble's addition for the scripts that pace hosts: a
// GCRA per key (its theoretical arrival time in ms, expiring once past), a
// request's slot in its bucket's and its fleet's (slotWait, slotReserve:
// a pace p of interval, burst, fkey, finterval, fburst), and the learned
// pace per host (lease.LearnedAt, in ms).
var pacing = fmt.Sprintf(`
local function gcraWait(key, interval, burst)
  if interval <= 0 then return 0 end
  local tat = tonumber(redis.call('GET', key) or '0')
  if tat == 0 then return 0 end
  return math.max(tat - (math.max(burst, 1) - 1) * interval - now, 0)
end
local function gcraReserve(key, interval)
  if interval <= 0 then return end
  local tat = math.max(tonumber(redis.call('GET', key) or '0'), now) + interval
  redis.call('SET', key, tat, 'PX', tat - now + 1000)
end
local function slotWait(bucket, target, p)
  local wait = gcraWait(P .. 'tat:' .. bucket .. '|' .. target, p.interval, p.burst)
  if p.finterval > 0 then wait = math.max(wait, gcraWait(P .. 'fleet:' .. p.fkey .. '|' .. target, p.finterval, p.fburst)) end
  return wait
end
local function slotReserve(bucket, target, p)
  gcraReserve(P .. 'tat:' .. bucket .. '|' .. target, p.interval)
  if p.finterval > 0 then gcraReserve(P .. 'fleet:' .. p.fkey .. '|' .. target, p.finterval) end
end
local function learnedAt(host)
  local l = redis.call('HMGET', P .. 'learn:' .. host, 'i', 'since', 'n')
  if not l[1] then return 0, 0, 0 end
  local el = math.max(now - tonumber(l[2]), 0)
  local eff = math.floor(tonumber(l[1]) * 2 ^ (-el / %d))
  if eff < %d then return 0, 0, 0 end
  return eff, tonumber(l[2]), tonumber(l[3])
end
`, lease.LearnedHalfLife.Milliseconds(), lease.MinLearnedInterval.Milliseconds())

// outcomes is the preamble's addition for the scripts that record or read
// outcomes (lease.HostRecord.Recorded, lease.Decayed, in ms).
var outcomes = fmt.Sprintf(`
local OH, OR, OMAX, OMIN, VMAX = %d, %d, %d, %g, %d
local function decayed(w, at)
  local el = now - at
  if el <= 0 or w == 0 then return w end
  return w * 2 ^ (-el / OH)
end
local function splitRecord(raw)
  local f, i = {}, 1
  while true do
    local j = string.find(raw, '|', i, true)
    if not j then
      f[#f + 1] = string.sub(raw, i)
      return f
    end
    f[#f + 1] = string.sub(raw, i, j - 1)
    i = j + 1
  end
end
local function withVoice(voices, who, client)
  local out, n = who .. '@' .. now, 1
  if client ~= '' then out = out .. '!' .. client end
  for v in string.gmatch(voices or '', '[^;]+') do
    local at = string.find(v, '@[^@]*$')
    if n < VMAX and string.sub(v, 1, at - 1) ~= who then
      out, n = out .. ';' .. v, n + 1
    end
  end
  return out
end
local function withPass(passes, client, who)
  local out, n = client .. '@' .. now .. '~' .. who, 1
  for v in string.gmatch(passes or '', '[^;]+') do
    local at = string.find(v, '@', 1, true)
    if n < VMAX and string.sub(v, 1, at - 1) ~= client then
      out, n = out .. ';' .. v, n + 1
    end
  end
  return out
end
local function recordOutcome(proxy, host, blocked, by, limited, who, client)
  local key = P .. 'out:' .. proxy
  local raw = redis.call('HGET', key, host)
  local served, bl, lb, lby, voices, passes = 0, 0, 0, '', '', ''
  if raw then
    local f = splitRecord(raw)
    served, bl = decayed(tonumber(f[1]), tonumber(f[3])), decayed(tonumber(f[2]), tonumber(f[3]))
    lb, lby, voices, passes = tonumber(f[4]), f[5], f[6] or '', f[7] or ''
  elseif redis.call('HLEN', key) >= OMAX then
    local all, oldest, oldestAt = redis.call('HGETALL', key), nil, nil
    for i = 1, #all, 2 do
      local at = tonumber(splitRecord(all[i + 1])[3])
      if not oldestAt or at < oldestAt then oldest, oldestAt = all[i], at end
    end
    redis.call('HDEL', key, oldest)
  end
  if blocked and limited then
    bl = bl + 1
  elseif blocked then
    bl, lb, lby, voices = bl + 1, now, by, withVoice(voices, who, client)
    redis.call('ZREMRANGEBYSCORE', P .. 'blocks', '-inf', now - OR)
    redis.call('ZADD', P .. 'blocks', now, proxy .. '|' .. host)
    redis.call('PEXPIRE', P .. 'blocks', OR)
  else
    served = served + 1
    if client ~= '' then passes = withPass(passes, client, who) end
  end
  if bl > 0 then
    redis.call('HSET', P .. 'obh:' .. host, proxy, bl .. '|' .. now)
    redis.call('PEXPIRE', P .. 'obh:' .. host, OR)
  end
  redis.call('HSET', key, host, served .. '|' .. bl .. '|' .. now .. '|' .. lb .. '|' .. lby .. '|' .. voices .. '|' .. passes)
  redis.call('PEXPIRE', key, OR)
end
local function blockedWeight(proxy, host)
  local raw = redis.call('HGET', P .. 'obh:' .. host, proxy)
  if not raw then return 0 end
  local sep = string.find(raw, '|', 1, true)
  local at = tonumber(string.sub(raw, sep + 1))
  if now - at >= OR then return 0 end
  local w = decayed(tonumber(string.sub(raw, 1, sep - 1)), at)
  if w < OMIN then return 0 end
  return w
end
`, lease.OutcomeHalfLife.Milliseconds(), lease.OutcomeRetention.Milliseconds(), lease.MaxHostRecords, minBlockedWeight, lease.MaxVoices)

// minBlockedWeight is the lease package's: a decayed blocked weight under it no
// longer counts against a proxy.
const minBlockedWeight = 0.01

// acquireScript: ARGV[3] ttl ms, ARGV[4] target, ARGV[5] the new lease's
// id, ARGV[6] 1 to apply the target's learned pace, ARGV[7] the longest
// wait ms for a paced slot, ARGV[8] k, the number of declared paces,
// ARGV[9] who holds the lease (lease.Lease.Holder), ARGV[10] and
// ARGV[11] its Limit's key ("" for none) and max, ARGV[12] 1 for an
// exclusive lease, ARGV[13] the exclusive lease it is within ("" none),
// ARGV[14] 1 when the candidates are a random sample (their order breaks
// ties, in place of when each was last leased), then
// k paces of six values each (interval ms, burst, max concurrent, fleet
// key, fleet interval ms, fleet burst), then the candidates as triples
// (id, index of its pace, 0 for none, and its pace's bucket, "" for its
// own: lease.Pace.Bucket, a sender's, which would make every candidate's
// pace distinct if it were sent with the pace). Returns {1, proxy, created, expires,
// load, wait ms, 1 if a pace applied} or {0, ms until the first candidate may take the target
// again (0: none will by itself), cause}; cause "quota" when the Limit is
// reached (the ms until the first of its leases ends).
var acquireScript = redis.NewScript(preamble + pacing + outcomes + `
local ttl, target, id = tonumber(ARGV[3]), ARGV[4], ARGV[5]
local maxWait, k, holder = tonumber(ARGV[7]), tonumber(ARGV[8]), ARGV[9]
local lkey, lmax = ARGV[10], tonumber(ARGV[11])
local exclusive, within, sampled = ARGV[12] == '1', ARGV[13], ARGV[14] == '1'
local anyHeld = redis.call('ZCOUNT', P .. 'holds', after, '+inf') > 0
if lkey ~= '' then
  local z = P .. 'limit:' .. lkey
  redis.call('ZREMRANGEBYSCORE', z, '-inf', now)
  if redis.call('ZCARD', z) >= lmax then
    local first = redis.call('ZRANGE', z, 0, 0, 'WITHSCORES')
    local wait = 0
    if first[2] then wait = tonumber(first[2]) - now end
    return {0, wait, 'quota'}
  end
end
local paces, j = {}, 15
for i = 1, k do
  paces[i] = {interval = tonumber(ARGV[j]), burst = tonumber(ARGV[j + 1]), conc = tonumber(ARGV[j + 2]),
    fkey = ARGV[j + 3], finterval = tonumber(ARGV[j + 4]), fburst = tonumber(ARGV[j + 5])}
  j = j + 6
end
local learned = 0
if ARGV[6] == '1' and target ~= '' then learned = learnedAt(target) end
local paced = target ~= '' and (k > 0 or learned > 0)
local none = {interval = 0, burst = 0, conc = 0, fkey = '', finterval = 0, fburst = 0}
local causes = {paced = 0, concurrency = 0, cooling = 0, exclusive = 0}
local best, bestWait, bestLoad, bestLast, bestPace, bestBucket, soonest, bestBlocked, plain, plainLoad, plainLast
local records = target ~= '' and redis.call('EXISTS', P .. 'obh:' .. target) == 1
-- Only a target some proxy cools for needs each candidate's cooldown read.
local cooling = target ~= '' and redis.call('ZCOUNT', P .. 'coolt:' .. target, after, '+inf') > 0
for i = j, #ARGV, 3 do
  local proxy, p, bucket = ARGV[i], paces[tonumber(ARGV[i + 1])] or none, ARGV[i + 2]
  if bucket == '' then bucket = proxy end
  local ok, wait = true, 0
  if anyHeld then
    local x = heldUntil(proxy, within)
    if x > 0 then
      ok = false
      causes.exclusive = causes.exclusive + 1
      if not soonest or x - now < soonest then soonest = x - now end
    end
  end
  if ok and exclusive and load(proxy) > 0 then
    ok = false
    causes.exclusive = causes.exclusive + 1
  end
  if ok and cooling then
    local untilv = tonumber(redis.call('GET', P .. 'cool:' .. proxy .. '|' .. target) or '0')
    if untilv > now then
      ok = false
      causes.cooling = causes.cooling + 1
      if not soonest or untilv - now < soonest then soonest = untilv - now end
    end
  end
  if ok and paced then
    if learned > p.interval then
      p = {interval = learned, burst = math.max(p.burst, 1), conc = p.conc, fkey = p.fkey, finterval = p.finterval, fburst = p.fburst}
    end
    if p.conc > 0 and redis.call('ZCOUNT', P .. 'hl:' .. bucket .. '|' .. target, after, '+inf') >= p.conc then
      ok = false
      causes.concurrency = causes.concurrency + 1
    else
      wait = slotWait(bucket, target, p)
      if wait > maxWait then
        ok = false
        causes.paced = causes.paced + 1
        if not soonest or wait < soonest then soonest = wait end
      end
    end
  end
  if ok then
    local l = load(proxy)
    local last = i
    if not sampled then last = tonumber(redis.call('GET', P .. 'last:' .. proxy) or '0') end
    local b = 0
    if records then b = blockedWeight(proxy, target) end
    local better = best and b < bestBlocked - 1e-9
    local worse = best and bestBlocked < b - 1e-9
    if not best or wait < bestWait or (wait == bestWait and (l < bestLoad or (l == bestLoad and (better or (not worse and (last < bestLast or (last == bestLast and proxy < best))))))) then
      best, bestWait, bestLoad, bestLast, bestPace, bestBucket, bestBlocked = proxy, wait, l, last, p, bucket, b
    end
    if not plain or l < plainLoad or (l == plainLoad and (last < plainLast or (last == plainLast and proxy < plain))) then
      plain, plainLoad, plainLast = proxy, l, last
    end
  end
end
if not best then
  local cause = ''
  for _, c in ipairs({'paced', 'concurrency', 'cooling', 'exclusive'}) do
    if causes[c] > 0 and (cause == '' or causes[c] > causes[cause]) then cause = c end
  end
  return {0, soonest or 0, cause}
end
local expires = now + ttl
local ends = string.format('%d', expires)
local key = P .. 'lease:' .. id
local hl = ''
if target ~= '' then hl = bestBucket .. '|' .. target end
local excl = '0'
if exclusive then excl = '1' end
redis.call('HSET', key, 'proxy', best, 'target', target, 'created', nows, 'expires', ends, 'holder', holder, 'limit', lkey, 'excl', excl, 'hl', hl)
redis.call('PEXPIRE', key, ARGV[3])
if exclusive then
  redis.call('SET', P .. 'hold:' .. best, id, 'PX', ARGV[3])
  add(P .. 'holds', id, ends, ARGV[3])
end
if lkey ~= '' then
  local z = P .. 'limit:' .. lkey
  redis.call('ZADD', z, ends, id)
  extend(z, ARGV[3])
end
-- A proxy with no live lease, or a bucket that is the proxy, had every
-- member dropped as ended: the key is new and has no TTL yet.
add(P .. 'proxy:' .. best, id, ends, ARGV[3], bestLoad == 0)
if hl ~= '' then
  add(P .. 'hl:' .. hl, id, ends, ARGV[3], bestLoad == 0 and bestBucket == best)
end
if bestPace then
  slotReserve(bestBucket, target, bestPace)
end
redis.call('SET', P .. 'last:' .. best, nows, 'PX', '3600000')
add(P .. 'leases', id, ends, ARGV[3])
local wasPaced = 0
if bestPace and (bestPace.interval > 0 or bestPace.conc > 0 or bestPace.finterval > 0) then wasPaced = 1 end
local why = 0
if paced then why = 2 elseif best ~= plain then why = 1 end
return {1, best, now, expires, bestLoad + 1, bestWait, wasPaced, why}
`)

// getScript: ARGV[3] the lease id. Returns {proxy, target, created,
// expires, load, holder, 1 if exclusive} or nil.
var getScript = redis.NewScript(preamble + `
local l = live(ARGV[3])
if not l then return nil end
return {l[1], l[2], tonumber(l[3]), tonumber(l[4]), load(l[1]), l[5] or '', tonumber(l[7] or '0')}
`)

// renewScript: ARGV[3] the lease id, ARGV[4] ttl ms. Returns what get does.
var renewScript = redis.NewScript(preamble + `
local id, ms = ARGV[3], ARGV[4]
local l = live(id)
if not l then return nil end
local expires = now + tonumber(ms)
local ends = string.format('%d', expires)
local key = P .. 'lease:' .. id
redis.call('HSET', key, 'expires', ends)
redis.call('PEXPIRE', key, ms)
local zkey = P .. 'proxy:' .. l[1]
redis.call('ZADD', zkey, ends, id)
extend(zkey, ms)
add(P .. 'leases', id, ends, ms)
if l[6] and l[6] ~= '' then
  redis.call('ZADD', P .. 'limit:' .. l[6], ends, id)
  extend(P .. 'limit:' .. l[6], ms)
end
if l[8] and l[8] ~= '' then
  redis.call('ZADD', P .. 'hl:' .. l[8], ends, id)
  extend(P .. 'hl:' .. l[8], ms)
end
if l[7] == '1' and redis.call('GET', P .. 'hold:' .. l[1]) == id then
  redis.call('PEXPIRE', P .. 'hold:' .. l[1], ms)
  redis.call('ZADD', P .. 'holds', ends, id)
  extend(P .. 'holds', ms)
end
return {l[1], l[2], tonumber(l[3]), expires, load(l[1]), l[5] or '', tonumber(l[7] or '0')}
`)

// releaseScript: ARGV[3] the lease id. Idempotent.
var releaseScript = redis.NewScript(preamble + `
local id = ARGV[3]
local key = P .. 'lease:' .. id
local l = redis.call('HMGET', key, 'proxy', 'target', 'limit', 'excl', 'hl')
if l[1] then redis.call('ZREM', P .. 'proxy:' .. l[1], id) end
if l[4] == '1' then
  if redis.call('GET', P .. 'hold:' .. l[1]) == id then redis.call('DEL', P .. 'hold:' .. l[1]) end
  redis.call('ZREM', P .. 'holds', id)
end
if l[3] and l[3] ~= '' then redis.call('ZREM', P .. 'limit:' .. l[3], id) end
if l[5] and l[5] ~= '' then redis.call('ZREM', P .. 'hl:' .. l[5], id) end
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
    redis.call('ZREMRANGEBYSCORE', P .. 'cooldowns', '-inf', now)
    redis.call('ZADD', P .. 'cooldowns', untilv, member)
    extend(P .. 'cooldowns', untilv - now)
    redis.call('SADD', P .. 'coolhosts:' .. proxy, target)
    extend(P .. 'coolhosts:' .. proxy, untilv - now)
    local byTarget = P .. 'coolt:' .. target
    redis.call('ZREMRANGEBYSCORE', byTarget, '-inf', now)
    redis.call('ZADD', byTarget, untilv, proxy)
    extend(byTarget, untilv - now)
  end
end
`

// reportScript: ARGV[3] the lease id, ARGV[4] result, ARGV[5] target,
// ARGV[6] cooldown ms. Returns 0 when the lease is not live, 1 otherwise.
var reportScript = redis.NewScript(preamble + cool + outcomes + `
local l = live(ARGV[3])
if not l then return 0 end
local blocked = ARGV[4] == 'rate_limited' or ARGV[4] == 'blocked'
if blocked then cool(l[1], ARGV[5], tonumber(ARGV[6])) end
if ARGV[5] ~= '' and (blocked or ARGV[4] == 'ok') then recordOutcome(l[1], ARGV[5], blocked, 'report', ARGV[4] == 'rate_limited', l[5] or '', '') end
return 1
`)

// heldScript: ARGV[3..] proxies. Returns 1 for each one an exclusive lease
// holds, 0 otherwise.
var heldScript = redis.NewScript(preamble + `
local out = {}
for i = 3, #ARGV do
  if heldUntil(ARGV[i], '') > 0 then out[#out + 1] = 1 else out[#out + 1] = 0 end
end
return out
`)

// loadsScript: ARGV[3..] proxies. Returns each one's live leases.
var loadsScript = redis.NewScript(preamble + `
local out = {}
for i = 3, #ARGV do out[#out + 1] = load(ARGV[i]) end
return out
`)

// countsScript counts what has not ended in the metrics' zsets: {leases,
// cooldowns}. It only reads (O(log n)): the writes that add to them drop
// what ended, so a scrape, or none for weeks, changes nothing.
var countsScript = redis.NewScript(preamble + `
return {redis.call('ZCOUNT', P .. 'leases', after, '+inf'), redis.call('ZCOUNT', P .. 'cooldowns', after, '+inf')}
`)
