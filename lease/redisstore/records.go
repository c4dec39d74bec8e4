package redisstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/example/egress-proxies-operator/lease"
)

// What the Redis store keeps besides leases: the ledger's stream, the
// pools' refused requests and the asks for probes.

// AppendLedger implements lease.Store.
func (s *Store) AppendLedger(ctx context.Context, e lease.LedgerEntry, retention time.Duration) error {
	e.At = time.Time{}
	raw, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("encoding a ledger record: %w", err)
	}
	cmd, durable := s.runDurable(ctx, appendLedgerScript, string(raw), retention.Milliseconds())
	if err := errors.Join(cmd.Err(), durable); err != nil {
		return fmt.Errorf("append-ledger script: %w", err)
	}
	return nil
}

// ledgerPage is how many records one XRANGE of ReadLedger reads: a long
// window is read a page at a time, never in one reply.
const ledgerPage = 1000

// ReadLedger implements lease.Store: XRANGE over the stream's ids,
// which are the records' times in ms, ledgerPage records at a time.
func (s *Store) ReadLedger(ctx context.Context, from, to time.Time) ([]lease.LedgerEntry, error) {
	var out []lease.LedgerEntry
	start := strconv.FormatInt(from.UnixMilli(), 10)
	for {
		msgs, err := s.client.XRangeN(ctx, s.prefix+"ledger", start, strconv.FormatInt(to.UnixMilli(), 10), ledgerPage).Result()
		if err != nil {
			return nil, fmt.Errorf("reading the ledger stream: %w", err)
		}
		for _, m := range msgs {
			raw, _ := m.Values["e"].(string)
			var e lease.LedgerEntry
			if err := json.Unmarshal([]byte(raw), &e); err != nil {
				return nil, fmt.Errorf("ledger record %s: %w", m.ID, err)
			}
			ms, _, _ := strings.Cut(m.ID, "-")
			at, err := strconv.ParseInt(ms, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("ledger record id %q: %w", m.ID, err)
			}
			e.At = time.UnixMilli(at).UTC()
			out = append(out, e)
		}
		if len(msgs) < ledgerPage {
			return out, nil
		}
		start = "(" + msgs[len(msgs)-1].ID // exclusive: the next page starts after it
	}
}

// NoteRefused implements lease.Store.
func (s *Store) NoteRefused(ctx context.Context, pool string) error {
	if err := s.run(ctx, noteRefusedScript, pool).Err(); err != nil {
		return fmt.Errorf("note-refused script: %w", err)
	}
	return nil
}

// LastRefused implements lease.Store.
func (s *Store) LastRefused(ctx context.Context, pool string) (time.Time, error) {
	ms, err := s.run(ctx, lastRefusedScript, pool).Int64()
	if err != nil {
		return time.Time{}, fmt.Errorf("reading when pool %s was last refused: %w", pool, err)
	}
	if ms == 0 {
		return time.Time{}, nil
	}
	return time.UnixMilli(ms).UTC(), nil
}

// AskProbe implements lease.Store.
func (s *Store) AskProbe(ctx context.Context, proxy string) error {
	if err := s.run(ctx, askProbeScript, proxy).Err(); err != nil {
		return fmt.Errorf("ask-probe script: %w", err)
	}
	return nil
}

// ProbesAsked implements lease.Store: the cursor is the store's time in
// ms.
func (s *Store) ProbesAsked(ctx context.Context, after int64) ([]string, int64, error) {
	reply, err := s.run(ctx, probesAskedScript, after).Slice()
	if err != nil {
		return nil, 0, fmt.Errorf("reading the proxies asked to be probed: %w", err)
	}
	next, ok := reply[0].(int64)
	if !ok {
		return nil, 0, fmt.Errorf("reading the proxies asked to be probed: a cursor of %T", reply[0])
	}
	proxies := make([]string, 0, len(reply)-1)
	for _, v := range reply[1:] {
		p, ok := v.(string)
		if !ok {
			return nil, 0, fmt.Errorf("reading the proxies asked to be probed: a proxy of %T", v)
		}
		proxies = append(proxies, p)
	}
	return proxies, next, nil
}
