package redisstore

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Connection says how to reach Redis; it comes from the operator's flags.
type Connection struct {
	// Address is host:port of a standalone Redis or a primary; with
	// Sentinels, empty.
	Address string
	// SentinelAddresses (host:port each) are the Sentinels that know the
	// primary called SentinelMaster, and fail it over to a replica when it
	// is lost: the client asks them where the primary is, and again after
	// a failover. SentinelPasswordFile holds the Sentinels' password, when
	// they have one of their own.
	SentinelAddresses    []string
	SentinelMaster       string
	SentinelPasswordFile string
	// Username for Redis ACLs; empty: the default user.
	Username string
	// PasswordFile holds the password (a mounted Secret key). It is read
	// again for every new connection, so a rotated Secret takes effect
	// without a restart. Empty: no password.
	PasswordFile string
	// TLS turns TLS on; CAFile adds CAs to the system roots, and
	// ServerName overrides the name checked in the server's certificate.
	TLS        bool
	CAFile     string
	ServerName string
	// DB is the database number.
	DB int
	// Timeout bounds dialing, each read and write, and the wait for a
	// pooled connection: a Redis that is down or hung costs at most this.
	Timeout time.Duration
}

// Check reports what is wrong with c, naming the flag at fault.
func (c Connection) Check() error {
	var errs []error
	switch {
	case len(c.SentinelAddresses) > 0:
		if c.Address != "" {
			errs = append(errs, errors.New("--redis-address and --redis-sentinel-addresses exclude each other: the Sentinels say where the primary is"))
		}
		if c.SentinelMaster == "" {
			errs = append(errs, errors.New("--redis-sentinel-addresses needs --redis-sentinel-master, the primary's name in the Sentinels' configuration"))
		}
		for _, a := range c.SentinelAddresses {
			if _, port, err := net.SplitHostPort(a); err != nil || port == "" {
				errs = append(errs, fmt.Errorf("--redis-sentinel-addresses: %q must be host:port", a))
			}
		}
	default:
		if _, port, err := net.SplitHostPort(c.Address); err != nil || port == "" {
			errs = append(errs, fmt.Errorf("--redis-address %q must be host:port", c.Address))
		}
		if c.SentinelMaster != "" || c.SentinelPasswordFile != "" {
			errs = append(errs, errors.New("--redis-sentinel-master and --redis-sentinel-password-file need --redis-sentinel-addresses"))
		}
	}
	if c.SentinelPasswordFile != "" {
		if _, err := readPassword(c.SentinelPasswordFile); err != nil {
			errs = append(errs, fmt.Errorf("--redis-sentinel-password-file: %w", err))
		}
	}
	if c.Timeout <= 0 {
		errs = append(errs, fmt.Errorf("--lease-store-timeout must be positive, got %s", c.Timeout))
	}
	if c.DB < 0 {
		errs = append(errs, fmt.Errorf("--redis-db must not be negative, got %d", c.DB))
	}
	if (c.CAFile != "" || c.ServerName != "") && !c.TLS {
		errs = append(errs, errors.New("--redis-tls-ca-file and --redis-tls-server-name need --redis-tls"))
	}
	if c.PasswordFile != "" {
		if _, err := readPassword(c.PasswordFile); err != nil {
			errs = append(errs, fmt.Errorf("--redis-password-file: %w", err))
		}
	}
	return errors.Join(errs...)
}

// NewClient builds a go-redis client for c: a plain one, or with
// Sentinels, go-redis's failover client, which follows the primary the
// Sentinels name. It does not connect: the store's calls do, each bounded
// by its context, so the operator starts (and reports not ready) while
// Redis is away.
func NewClient(c Connection) (redis.UniversalClient, error) {
	if err := c.Check(); err != nil {
		return nil, err
	}
	var credentials func(context.Context) (string, string, error)
	if c.PasswordFile != "" || c.Username != "" {
		credentials = func(context.Context) (string, string, error) {
			if c.PasswordFile == "" {
				return c.Username, "", nil
			}
			password, err := readPassword(c.PasswordFile)
			return c.Username, password, err
		}
	}
	var tlsConfig *tls.Config
	if c.TLS {
		tlsConfig = &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.ServerName}
		if c.CAFile != "" {
			pem, err := os.ReadFile(c.CAFile)
			if err != nil {
				return nil, fmt.Errorf("--redis-tls-ca-file: %w", err)
			}
			roots, err := x509.SystemCertPool()
			if err != nil {
				roots = x509.NewCertPool()
			}
			if !roots.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("--redis-tls-ca-file %s: no PEM certificate in it", c.CAFile)
			}
			tlsConfig.RootCAs = roots
		}
	}
	if len(c.SentinelAddresses) > 0 {
		opts := &redis.FailoverOptions{
			MasterName: c.SentinelMaster, SentinelAddrs: c.SentinelAddresses,
			DB: c.DB, DialTimeout: c.Timeout, ReadTimeout: c.Timeout, WriteTimeout: c.Timeout, PoolTimeout: c.Timeout,
			ContextTimeoutEnabled: true, MaxRetries: 1, CredentialsProviderContext: credentials, TLSConfig: tlsConfig,
		}
		if c.SentinelPasswordFile != "" {
			// go-redis reads the Sentinels' password once; a rotated one
			// needs a restart (the primary's is read per connection).
			password, err := readPassword(c.SentinelPasswordFile)
			if err != nil {
				return nil, fmt.Errorf("--redis-sentinel-password-file: %w", err)
			}
			opts.SentinelPassword = password
		}
		return redis.NewFailoverClient(opts), nil
	}
	opts := &redis.Options{
		Addr:                  c.Address,
		DB:                    c.DB,
		DialTimeout:           c.Timeout,
		ReadTimeout:           c.Timeout,
		WriteTimeout:          c.Timeout,
		PoolTimeout:           c.Timeout,
		ContextTimeoutEnabled: true,
		// One retry at most: a call is bounded anyway, and a Redis that is
		// down must answer 503 fast, not after a backoff schedule.
		MaxRetries:                 1,
		CredentialsProviderContext: credentials,
		TLSConfig:                  tlsConfig,
	}
	return redis.NewClient(opts), nil
}

func readPassword(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("reading the Redis password: %w", err)
	}
	// A Secret created with --from-file often ends in a newline.
	password := strings.TrimRight(string(data), "\r\n")
	if password == "" {
		return "", fmt.Errorf("the Redis password file %s is empty", path)
	}
	return password, nil
}
