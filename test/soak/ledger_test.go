//go:build soak

package soak

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// heldLeases keeps, for every exit IP the load leased, its latest lease
// and a moment the load surely held it: after the 201 came back and
// before the release was sent (or, abandoned, before it expired).
type heldLeases struct {
	mu   sync.Mutex
	byIP map[string]heldLease
}

type heldLease struct {
	id string
	at time.Time
}

func (h *heldLeases) note(ip, id string, granted, ended time.Time) {
	if ip == "" || !ended.After(granted) {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.byIP == nil {
		h.byIP = map[string]heldLease{}
	}
	h.byIP[ip] = heldLease{id: id, at: granted.Add(ended.Sub(granted) / 2)}
}

// checkLedger asks every replica's GET /v1/attribution about every exit IP
// the load used, at a moment its latest lease was held: each must name the
// lease. It returns the IPs checked and what was wrong.
func (h *heldLeases) checkLedger(replicas []string) (int, []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var problems []string
	for ip, held := range h.byIP {
		for _, base := range replicas {
			q := url.Values{"ip": {ip}, "at": {held.at.UTC().Format(time.RFC3339Nano)}}
			req, err := http.NewRequest(http.MethodGet, base+"/v1/attribution?"+q.Encode(), nil)
			if err != nil {
				panic(err)
			}
			req.Header.Set("Authorization", "Bearer "+token)
			res, err := httpClient.Do(req)
			if err != nil {
				problems = append(problems, fmt.Sprintf("%s at %s from %s: %v", ip, held.at, base, err))
				continue
			}
			var body struct {
				Holdings []struct {
					LeaseID string `json:"leaseID"`
				} `json:"holdings"`
			}
			err = json.NewDecoder(res.Body).Decode(&body)
			_ = res.Body.Close()
			ids := []string{}
			for _, x := range body.Holdings {
				ids = append(ids, x.LeaseID)
			}
			if err != nil || res.StatusCode != http.StatusOK || !slices.Contains(ids, held.id) {
				problems = append(problems, fmt.Sprintf("%s at %s from %s: %d %v, want lease %s", ip, held.at.Format(time.RFC3339Nano), base, res.StatusCode, ids, held.id))
			}
		}
	}
	return len(h.byIP), problems
}

// redisMemory is Redis's used memory less the ledger stream's, which grows
// by design until --ledger-retention: what the lease store's own keys
// take.
func redisMemory(ctx context.Context, c *redis.Client) (float64, error) {
	info, err := c.Info(ctx, "memory").Result()
	if err != nil {
		return 0, err
	}
	var used float64
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			used, err = strconv.ParseFloat(v, 64)
			if err != nil {
				return 0, err
			}
		}
	}
	ledger, err := c.MemoryUsage(ctx, "egress-proxies-operator:ledger").Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return 0, err
	}
	return used - float64(ledger), nil
}
