// Package leasestore is the choice of the lease store and its flags:
// memory (one replica) or Redis (shared by every replica). It is a package
// of its own because it is the one place that knows both backends; lease
// must not import its Redis backend, which imports lease.
//
// It must never import the controllers, the providers or health.
package leasestore

import (
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"github.com/example/egress-proxies-operator/lease"
	"github.com/example/egress-proxies-operator/lease/redisstore"
)

// Backends.
const (
	Memory = "memory"
	Redis  = "redis"
)

// Options are the lease store's flags.
type Options struct {
	Backend   string
	Timeout   time.Duration
	Redis     redisstore.Connection
	KeyPrefix string
	// WaitReplicas is --redis-wait-replicas: how many replicas the writes
	// a failover must not lose wait for.
	WaitReplicas int

	// fs is where the flags were registered, so Validate can tell a Redis
	// flag given with the memory store.
	fs *flag.FlagSet
}

// AddFlags registers the lease store's flags.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	o.fs = fs
	fs.StringVar(&o.Backend, "lease-store", Memory,
		"Where discovery keeps leases, cooldowns and refused requests: memory (this process only; lost on restart; one replica) or redis (shared by every replica, survives restarts).")
	fs.DurationVar(&o.Timeout, "lease-store-timeout", lease.DefaultStoreTimeout,
		"Bound on each lease store call: with the store away, discovery answers 503 store_unavailable within it. Reads of a span of records (an attribution query's ledger, the ban judge's blocks) get ten times as long, 5s at least.")
	fs.StringVar(&o.Redis.Address, "redis-address", "",
		"host:port of the Redis server (standalone or primary; not Redis Cluster), with --lease-store=redis; or --redis-sentinel-addresses.")
	fs.Func("redis-sentinel-addresses", "Comma-separated host:port of the Redis Sentinels that watch the primary (instead of --redis-address): the operator follows the primary they name, through a failover.",
		func(v string) error {
			o.Redis.SentinelAddresses = nil
			for a := range strings.SplitSeq(v, ",") {
				if a = strings.TrimSpace(a); a != "" {
					o.Redis.SentinelAddresses = append(o.Redis.SentinelAddresses, a)
				}
			}
			return nil
		})
	fs.StringVar(&o.Redis.SentinelMaster, "redis-sentinel-master", "", "The primary's name in the Sentinels' configuration (sentinel monitor <name> ...), with --redis-sentinel-addresses.")
	fs.StringVar(&o.Redis.SentinelPasswordFile, "redis-sentinel-password-file", "",
		"File holding the Sentinels' own password, when they have one (read at startup).")
	fs.IntVar(&o.WaitReplicas, "redis-wait-replicas", 0,
		"Replicas that must have each write a failover must not lose (exclusive holds, burned IPs, client bans, ledger records) before it counts (WAIT, within half of --lease-store-timeout); 0 waits for none. With Sentinel and one replica: 1.")
	fs.StringVar(&o.Redis.Username, "redis-username", "", "Redis ACL user; empty: the default user.")
	fs.StringVar(&o.Redis.PasswordFile, "redis-password-file", "",
		"File holding the Redis password (a mounted Secret key), read again for every new connection so a rotated Secret needs no restart.")
	fs.BoolVar(&o.Redis.TLS, "redis-tls", false, "Connect to Redis over TLS.")
	fs.StringVar(&o.Redis.CAFile, "redis-tls-ca-file", "", "PEM file of CAs trusted for Redis's certificate, added to the system roots.")
	fs.StringVar(&o.Redis.ServerName, "redis-tls-server-name", "", "Name checked in Redis's certificate; default: the host of --redis-address.")
	fs.IntVar(&o.Redis.DB, "redis-db", 0, "Redis database number.")
	fs.StringVar(&o.KeyPrefix, "redis-key-prefix", redisstore.DefaultKeyPrefix,
		"Prefix of every key the operator writes in Redis; operators sharing one Redis need prefixes of their own.")
}

// Validate checks the store's flags together: a Redis flag given with the
// memory store is a mistake worth naming, not a setting to ignore.
func (o *Options) Validate() error {
	o.Redis.Timeout = o.Timeout // Redis's dial, reads and writes share the bound
	switch o.Backend {
	case Memory:
		var set []string
		if o.fs != nil {
			o.fs.Visit(func(f *flag.Flag) {
				if strings.HasPrefix(f.Name, "redis-") {
					set = append(set, "--"+f.Name)
				}
			})
		}
		if len(set) > 0 {
			return fmt.Errorf("%s given with --lease-store=memory: add --lease-store=redis", strings.Join(set, ", "))
		}
		if o.Timeout <= 0 {
			return fmt.Errorf("--lease-store-timeout must be positive, got %s", o.Timeout)
		}
	case Redis:
		var errs []error
		if o.Redis.Address == "" && len(o.Redis.SentinelAddresses) == 0 {
			errs = append(errs, errors.New("--lease-store=redis needs --redis-address host:port, or --redis-sentinel-addresses and --redis-sentinel-master"))
		}
		if o.WaitReplicas < 0 {
			errs = append(errs, fmt.Errorf("--redis-wait-replicas must not be negative, got %d", o.WaitReplicas))
		}
		if o.KeyPrefix == "" {
			errs = append(errs, errors.New("--redis-key-prefix must not be empty"))
		}
		if len(errs) > 0 {
			return errors.Join(errs...)
		}
		return o.Redis.Check()
	default:
		return fmt.Errorf("--lease-store must be %s or %s, got %q", Memory, Redis, o.Backend)
	}
	return nil
}

// Open builds the store the flags name, with the metrics that read it.
func (o *Options) Open() (lease.Store, []prometheus.Collector, error) {
	if o.Backend != Redis {
		store := lease.NewMemoryStore(clock.RealClock{})
		return store, store.Collectors(), nil
	}
	client, err := redisstore.NewClient(o.Redis)
	if err != nil {
		return nil, nil, err
	}
	store := redisstore.New(redisstore.Options{Client: client, KeyPrefix: o.KeyPrefix, DurableReplicas: o.WaitReplicas, DurableTimeout: o.Timeout / 2})
	return store, store.Collectors(o.Timeout), nil
}
