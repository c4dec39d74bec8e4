package redisstore

import (
	"context"
	"errors"
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
	if err := s.run(ctx, recordOutcomeScript, proxy, host, blocked, o.Source, o.Cooldown.Milliseconds(), limited, o.Reporter, o.Client).Err(); err != nil {
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
	out := make([]lease.HostRecord, 0, len(res)/8)
	for i := 0; i+7 < len(res); i += 8 {
		host, _ := res[i].(string)
		served, _ := strconv.ParseFloat(fmt.Sprint(res[i+1]), 64)
		blocked, _ := strconv.ParseFloat(fmt.Sprint(res[i+2]), 64)
		at, _ := res[i+3].(int64)
		last, _ := res[i+4].(int64)
		by, _ := res[i+5].(string)
		raw, _ := res[i+6].(string)
		passes, _ := res[i+7].(string)
		r := lease.HostRecord{Host: host, Served: served, Blocked: blocked, At: time.UnixMilli(at), LastBlockedBy: by, Voices: parseVoices(raw),
			Passes: parsePasses(passes)}
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
	out := make([]lease.Block, 0, len(res)/5)
	for i := 0; i+4 < len(res); i += 5 {
		member, _ := res[i].(string)
		at, _ := res[i+1].(int64)
		by, _ := res[i+2].(string)
		voices, _ := res[i+3].(string)
		passes, _ := res[i+4].(string)
		proxy, host, ok := strings.Cut(member, "|")
		if !ok {
			continue
		}
		out = append(out, lease.Block{Proxy: proxy, Host: host, At: time.UnixMilli(at), By: by, Voices: parseVoices(voices), Passes: parsePasses(passes)})
	}
	return out, nil
}

// parseVoices reads a record's voices ("who@ms!client;who@ms", latest
// first, "!client" when the client is known). Tenant names hold no ';',
// '@' or '!' (ServiceAccount user names, the platform's), nor do JA4
// fingerprints; a name is split at its last '@' all the same.
func parseVoices(raw string) []lease.Voice {
	var out []lease.Voice
	for v := range strings.SplitSeq(raw, ";") {
		v, client, _ := strings.Cut(v, "!")
		at := strings.LastIndexByte(v, '@')
		if at < 0 {
			continue
		}
		ms, err := strconv.ParseInt(v[at+1:], 10, 64)
		if err != nil {
			continue
		}
		out = append(out, lease.Voice{Who: v[:at], At: time.UnixMilli(ms), Client: client})
	}
	return out
}

// parsePasses reads a record's passes ("client@ms~who;client@ms~who",
// latest first).
func parsePasses(raw string) []lease.Pass {
	var out []lease.Pass
	for v := range strings.SplitSeq(raw, ";") {
		client, rest, ok := strings.Cut(v, "@")
		at, who, _ := strings.Cut(rest, "~")
		ms, err := strconv.ParseInt(at, 10, 64)
		if !ok || err != nil {
			continue
		}
		out = append(out, lease.Pass{Client: client, At: time.UnixMilli(ms), Who: who})
	}
	return out
}

// MarkClientBan implements lease.Store.
func (s *Store) MarkClientBan(ctx context.Context, host, client string, retention time.Duration) error {
	cmd, durable := s.runDurable(ctx, markClientBanScript, host+"|"+client, retention.Milliseconds())
	if err := errors.Join(cmd.Err(), durable); err != nil {
		return fmt.Errorf("mark-client-ban script: %w", err)
	}
	return nil
}

// ClientBans implements lease.Store.
func (s *Store) ClientBans(ctx context.Context) ([]lease.ClientBan, error) {
	res, err := s.run(ctx, clientBansScript).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("client-bans script: %w", err)
	}
	out := make([]lease.ClientBan, 0, len(res)/2)
	for i := 0; i+1 < len(res); i += 2 {
		host, client, ok := strings.Cut(res[i], "|")
		ms, err := strconv.ParseInt(res[i+1], 10, 64)
		if !ok || err != nil {
			continue
		}
		out = append(out, lease.ClientBan{Host: host, Client: client, Until: time.UnixMilli(ms)})
	}
	return out, nil
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
	cmd, durable := s.runDurable(ctx, burnIPScript, scope, ip, retention.Milliseconds())
	if err := errors.Join(cmd.Err(), durable); err != nil {
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
