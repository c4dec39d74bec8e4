package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/example/egress-proxies-operator/lease"
)

// The usage rows of a day are one hash, usage:<day>, with a field per row
// and counter (<tenant>\t<host>\t<provider>\t<counter>); the hosts each
// tenant's day keeps apart are a set, usagehosts:<day>:<tenant>. Both
// expire their retention after the day ends.

// countUsageScript: ARGV[3] the day, ARGV[4] tenant, ARGV[5] host, ARGV[6]
// provider, ARGV[7] when the day's rows expire (ms on the store's clock),
// ARGV[8] lease.MaxUsageHosts, ARGV[9] lease.UsageOtherHost, then counter
// and amount pairs.
var countUsageScript = redis.NewScript(preamble + `
local ttl = tonumber(ARGV[7]) - now
if ttl <= 0 then return 0 end
local hostsKey = P .. 'usagehosts:' .. ARGV[3] .. ':' .. ARGV[4]
local host = ARGV[5]
if redis.call('SISMEMBER', hostsKey, host) == 0 then
  if redis.call('SCARD', hostsKey) >= tonumber(ARGV[8]) then
    host = ARGV[9]
  else
    redis.call('SADD', hostsKey, host)
  end
end
redis.call('PEXPIRE', hostsKey, ttl)
local key = P .. 'usage:' .. ARGV[3]
local row = ARGV[4] .. '\t' .. host .. '\t' .. ARGV[6] .. '\t'
for i = 10, #ARGV, 2 do
  redis.call('HINCRBY', key, row .. ARGV[i], ARGV[i + 1])
end
redis.call('PEXPIRE', key, ttl)
return 1
`)

// CountUsage implements lease.Store.
func (s *Store) CountUsage(ctx context.Context, k lease.UsageKey, c lease.UsageCounts, retention time.Duration) error {
	day, err := time.Parse(time.DateOnly, k.Day)
	if err != nil {
		return fmt.Errorf("usage day %q: %w", k.Day, err)
	}
	args := []any{k.Day, k.Tenant, k.Host, k.Provider, day.Add(24*time.Hour + retention).UnixMilli(), lease.MaxUsageHosts, lease.UsageOtherHost}
	for name, n := range lease.UsageFields(&c) {
		if *n != 0 {
			args = append(args, name, *n)
		}
	}
	if err := s.run(ctx, countUsageScript, args...).Err(); err != nil {
		return fmt.Errorf("count usage script: %w", err)
	}
	return nil
}

// ReadUsage implements lease.Store.
func (s *Store) ReadUsage(ctx context.Context, fromDay, toDay string) (map[lease.UsageKey]lease.UsageCounts, error) {
	from, err := time.Parse(time.DateOnly, fromDay)
	if err != nil {
		return nil, fmt.Errorf("usage day %q: %w", fromDay, err)
	}
	to, err := time.Parse(time.DateOnly, toDay)
	if err != nil {
		return nil, fmt.Errorf("usage day %q: %w", toDay, err)
	}
	// Every day's hash in one round trip.
	days := map[string]*redis.MapStringStringCmd{}
	if _, err := s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for d := from; !d.After(to); d = d.Add(24 * time.Hour) {
			day := lease.Day(d)
			days[day] = p.HGetAll(ctx, s.prefix+"usage:"+day)
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("reading the usage of %s to %s: %w", fromDay, toDay, err)
	}
	out := map[lease.UsageKey]lease.UsageCounts{}
	for day, cmd := range days {
		for field, value := range cmd.Val() {
			parts := strings.Split(field, "\t")
			n, err := strconv.ParseInt(value, 10, 64)
			if len(parts) != 4 || err != nil {
				continue // not a row this store wrote
			}
			k := lease.UsageKey{Day: day, Tenant: parts[0], Host: parts[1], Provider: parts[2]}
			c := out[k]
			if counter, ok := lease.UsageFields(&c)[parts[3]]; ok {
				*counter += n
			}
			out[k] = c
		}
	}
	return out, nil
}
