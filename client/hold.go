package client

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Held is a lease kept alive in the background: renewed at a third of its
// TTL until Release, the context's end, or the API saying it can no longer
// be renewed (its proxy stopped serving, or the lease is gone), which
// closes Lost.
type Held struct {
	c   *Client
	ttl time.Duration

	mu    sync.Mutex
	lease Lease
	err   error

	lost     chan struct{}
	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{}
}

// Hold leases a proxy and keeps the lease renewed until Release or ctx
// ends. req.TTL is the renewal period's basis (0: 60s, renewed every 20s).
func (c *Client) Hold(ctx context.Context, req LeaseRequest) (*Held, error) {
	if req.TTL <= 0 {
		req.TTL = time.Minute
	}
	l, err := c.Lease(ctx, req)
	if err != nil {
		return nil, err
	}
	h := &Held{c: c, ttl: req.TTL, lease: *l, lost: make(chan struct{}), stop: make(chan struct{}), done: make(chan struct{})}
	go h.renew(ctx)
	return h, nil
}

// Lease is the lease as last renewed.
func (h *Held) Lease() Lease {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lease
}

// Lost is closed once the lease can no longer be renewed; Err says why.
func (h *Held) Lost() <-chan struct{} { return h.lost }

// Err is why the lease was lost, or nil.
func (h *Held) Err() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

// Release stops renewing and releases the lease; calling it again is
// harmless.
func (h *Held) Release(ctx context.Context) error {
	h.stopOnce.Do(func() { close(h.stop) })
	<-h.done
	return h.c.Release(ctx, h.Lease().ID)
}

// renew renews every ttl/3. A renewal refused for good (the proxy went away,
// the lease is gone) ends it and closes lost; a failed call (the API or its
// store away) is tried again at the next tick, while the lease may still
// be alive.
func (h *Held) renew(ctx context.Context) {
	defer close(h.done)
	ticker := time.NewTicker(max(h.ttl/3, 100*time.Millisecond))
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.stop:
			return
		case <-ticker.C:
		}
		l, err := h.c.Renew(ctx, h.Lease().ID, h.ttl)
		var apiErr *APIError
		switch {
		case err == nil:
			h.mu.Lock()
			h.lease = *l
			h.mu.Unlock()
		case errors.As(err, &apiErr) && (apiErr.Code == CodeProxyUnavailable || apiErr.Code == CodeLeaseNotFound):
			h.mu.Lock()
			h.err = err
			h.mu.Unlock()
			close(h.lost)
			return
		}
	}
}
