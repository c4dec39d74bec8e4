package broker

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"

	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/example/egress-proxies-operator/credentials"
	"github.com/example/egress-proxies-operator/lease"
	"github.com/example/egress-proxies-operator/operator"
)

// Why a proxy is shown without its credentials (ProxyInfo.CredentialsWithheld).
const (
	WithheldUnavailable = "the proxy's credentials cannot be read right now; lease another or retry"
	WithheldPerLease    = "this proxy takes credentials of a lease's own: lease it (POST /v1/leases) and use the lease's"
)

// NeedsCredentials says whether the proxy takes credentials at all.
func (p ProxyInfo) NeedsCredentials() bool { return p.hasCreds }

// credentialsFor are the credentials a client presents to proxy info on
// lease l: the lease's own, signed for it and expiring with it, where the
// proxy checks per-lease credentials (none without a lease:
// errPerLease); the proxy's own where it takes a shared password (a
// legacy record).
func (b *Broker) credentialsFor(ctx context.Context, info ProxyInfo, l *lease.Lease) (credentials.Credentials, error) {
	if b.opts.Credentials == nil {
		return credentials.Credentials{}, errors.New("its credentials cannot be read")
	}
	c, err := b.opts.Credentials.Lookup(ctx, info.creds)
	if err != nil {
		return credentials.Credentials{}, fmt.Errorf("reading its credentials: %w", err)
	}
	if c.Scheme != credentials.SchemeLease {
		return c, nil
	}
	if l == nil {
		return credentials.Credentials{}, errPerLease
	}
	if c, err = c.SignedFor(info.ID, l.ID, l.ExpiresAt); err != nil {
		return credentials.Credentials{}, fmt.Errorf("signing its credentials: %w", err)
	}
	return c, nil
}

var errPerLease = errors.New("the proxy takes credentials of a lease's own")

// WithCredentials fills in info's credentials for lease l (nil for a
// listing), or says why it does not (info.CredentialsWithheld).
func (b *Broker) WithCredentials(ctx context.Context, info *ProxyInfo, l *lease.Lease) {
	if !info.hasCreds {
		return
	}
	c, err := b.credentialsFor(ctx, *info, l)
	switch {
	case errors.Is(err, errPerLease):
		info.CredentialsWithheld = WithheldPerLease
		return
	case err != nil:
		operator.Warn(logf.FromContext(ctx), "proxy credentials unavailable", "proxy", info.ID, "error", err.Error())
		info.CredentialsWithheld = WithheldUnavailable
		return
	}
	info.Username, info.Password = c.Username, c.Password
	if info.URL != "" {
		u := url.URL{Scheme: "http", User: c.Userinfo(), Host: net.JoinHostPort(info.IP, strconv.Itoa(int(info.Port)))}
		info.URL = u.String()
	}
}
