package redisstore

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/example/egress-proxies-operator/lease"
)

// RecordOutcome implements lease.Store.
func (s *Store) RecordOutcome(ctx context.Context, proxy, host string, o lease.Outcome) error {
	blocked, limited := 0, 0
	if o.Blocked {
		blocked = 1
	}
	if o.Limited {
		limited = 1
	}
	if err := s.run(ctx, recordOutcomeScript, proxy, host, blocked, o.Source, o.Cooldown.Milliseconds(), limited, o.Reporter).Err(); err != nil {
		return fmt.Errorf("record-outcome script: %w", err)
	}
	return nil
}

// Outcomes implements lease.Store.
func (s *Store) Outcomes(ctx context.Context, proxy string) ([]lease.HostRecord, error) {
	res, err := s.run(ctx, outcomesScript, proxy).Slice()
	if err != nil {
		return nil, fmt.Errorf("outcomes script: %w", err)
	}
	out := make([]lease.HostRecord, 0, len(res)/7)
	for i := 0; i+6 < len(res); i += 7 {
		host, _ := res[i].(string)
		served, _ := strconv.ParseFloat(fmt.Sprint(res[i+1]), 64)
		blocked, _ := strconv.ParseFloat(fmt.Sprint(res[i+2]), 64)
		at, _ := res[i+3].(int64)
		last, _ := res[i+4].(int64)
		by, _ := res[i+5].(string)
		raw, _ := res[i+6].(string)
		r := lease.HostRecord{Host: host, Served: served, Blocked: blocked, At: time.UnixMilli(at), LastBlockedBy: by, Voices: parseVoices(raw)}
		if last > 0 {
			r.LastBlocked = time.UnixMilli(last)
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b lease.HostRecord) int { return strings.Compare(a.Host, b.Host) })
	return out, nil
}

// Blocks implements lease.Store.
func (s *Store) Blocks(ctx context.Context, since time.Time) ([]lease.Block, error) {
	res, err := s.run(ctx, blocksScript, since.UnixMilli()).Slice()
	if err != nil {
		return nil, fmt.Errorf("blocks script: %w", err)
	}
	out := make([]lease.Block, 0, len(res)/4)
	for i := 0; i+3 < len(res); i += 4 {
		member, _ := res[i].(string)
		at, _ := res[i+1].(int64)
		by, _ := res[i+2].(string)
		voices, _ := res[i+3].(string)
		proxy, host, ok := strings.Cut(member, "|")
		if !ok {
			continue
		}
		out = append(out, lease.Block{Proxy: proxy, Host: host, At: time.UnixMilli(at), By: by, Voices: parseVoices(voices)})
	}
	return out, nil
}

// parseVoices reads a record's voices ("who@ms;who@ms", latest first).
// Tenant names hold no ';' and no '@' (ServiceAccount user names, the
// platform's); a name is split at its last '@' all the same.
func parseVoices(raw string) []lease.Voice {
	var out []lease.Voice
	for v := range strings.SplitSeq(raw, ";") {
		at := strings.LastIndexByte(v, '@')
		if at < 0 {
			continue
		}
		ms, err := strconv.ParseInt(v[at+1:], 10, 64)
		if err != nil {
			continue
		}
		out = append(out, lease.Voice{Who: v[:at], At: time.UnixMilli(ms)})
	}
	return out
}

// ForgetProxy implements lease.Store.
func (s *Store) ForgetProxy(ctx context.Context, proxy string) error {
	if err := s.run(ctx, forgetProxyScript, proxy).Err(); err != nil {
		return fmt.Errorf("forget-proxy script: %w", err)
	}
	return nil
}

// EndCooldown implements lease.Store.
func (s *Store) EndCooldown(ctx context.Context, proxy, host string, notAfter time.Time) error {
	if err := s.run(ctx, endCooldownScript, proxy, host, notAfter.UnixMilli()).Err(); err != nil {
		return fmt.Errorf("end-cooldown script: %w", err)
	}
	return nil
}

// BurnIP implements lease.Store.
func (s *Store) BurnIP(ctx context.Context, scope, ip string, retention time.Duration) error {
	if err := s.run(ctx, burnIPScript, scope, ip, retention.Milliseconds()).Err(); err != nil {
		return fmt.Errorf("burn-ip script: %w", err)
	}
	return nil
}

// BurnedUntil implements lease.Store.
func (s *Store) BurnedUntil(ctx context.Context, scope, ip string) (time.Time, error) {
	until, err := s.run(ctx, burnedUntilScript, scope, ip).Int64()
	if err != nil {
		return time.Time{}, fmt.Errorf("burned-until script: %w", err)
	}
	if until == 0 {
		return time.Time{}, nil
	}
	return time.UnixMilli(until), nil
}
