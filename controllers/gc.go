package controllers

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/credentials"
	"github.com/example/egress-proxies-operator/operator"
	"github.com/example/egress-proxies-operator/providers"
)

var (
	orphansFound = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: operator.MetricsNamespace, Name: "orphans_found_total",
		Help: "Provider instances labelled with this operator's cluster id whose owning Proxy is gone, by provider.",
	}, []string{"provider"})
	orphansDeleted = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: operator.MetricsNamespace, Name: "orphans_deleted_total",
		Help: "Orphaned provider instances deleted (not counted in dry-run), by provider.",
	}, []string{"provider"})
)

func init() {
	ctrlmetrics.Registry.MustRegister(orphansFound, orphansDeleted)
}

// Defaults for the orphan collector's flags.
const (
	DefaultGCInterval    = 10 * time.Minute
	DefaultGCGracePeriod = 3 * time.Minute
)

// OrphanCollector is the safety net behind the finalizer, the owner
// references and the reconciler's pass for a Proxy found gone: every
// interval it lists each provider instance's own instances (labelled with
// this operator's cluster and operator ids and that provider instance's
// name) and deletes those whose owning Proxy no longer exists (or exists
// with another UID, or no longer points at that provider instance). It never touches
// another cluster's or another operator's instances, nor those of Proxies
// outside its scope, nor another provider instance's in the same project or
// cluster, nor an instance whose owner labels are missing (made before the
// label existed: it cannot prove the instance is its own); it spares
// instances younger than the grace period (the window in which a Proxy may
// not yet have recorded its instance) and ones already being deleted, and
// keeps going past per-instance errors.
type OrphanCollector struct {
	// Client reads Proxies (through the manager's cache).
	Client client.Reader
	// Providers are swept one after another.
	Providers providers.Set
	// Owner selects this operator's instances.
	Owner providers.Owner
	// Scope is the namespaces the operator watches. An instance or record
	// whose Proxy lives outside them (left from a wider scope) is not this
	// operator's to judge, and is left alone.
	Scope operator.Scope
	// Interval between sweeps.
	Interval time.Duration
	// GracePeriod spares instances younger than this.
	GracePeriod time.Duration
	// DryRun logs what would be deleted and deletes nothing.
	DryRun bool
	// Clock tells instance ages; tests inject a fake one.
	Clock clock.PassiveClock
	// Credentials reads the credentials Secrets (the credentials cache) and
	// Deleter deletes the records no instance uses any more, in
	// CredentialsNamespace. A nil Credentials skips records.
	Credentials          client.Reader
	Deleter              client.Writer
	CredentialsNamespace string
}

// NeedLeaderElection makes the collector run on the leader only.
func (c *OrphanCollector) NeedLeaderElection() bool { return true }

// Start sweeps every Interval until ctx ends. A failed sweep is logged and
// retried at the next interval.
func (c *OrphanCollector) Start(ctx context.Context) error {
	log := logf.FromContext(ctx).WithName("orphan-gc")
	wait.JitterUntilWithContext(ctx, func(ctx context.Context) {
		if err := c.Sweep(ctx); err != nil {
			log.Error(err, "orphan sweep incomplete")
		}
	}, c.Interval, 0.1, true)
	return nil
}

// Sweep runs one pass over every provider and returns the joined errors of
// whatever it could not list or delete.
func (c *OrphanCollector) Sweep(ctx context.Context) error {
	log := logf.FromContext(ctx).WithName("orphan-gc")
	now := c.Clock.Now()
	var errs []error
	for _, name := range c.Providers.Names() {
		prov := c.Providers[name]
		instances, err := prov.List(ctx, c.Owner)
		if err != nil {
			errs = append(errs, fmt.Errorf("listing instances of provider %s: %w", name, err))
			continue
		}
		for i := range instances {
			inst := &instances[i]
			// List filters by both labels already; checking again here keeps
			// a provider that filtered wrongly from costing live instances.
			if !c.Owner.Owns(inst.Labels) || inst.ProviderName() != name ||
				inst.State == providers.StateStopping ||
				now.Sub(inst.CreatedAt) < c.GracePeriod {
				continue
			}
			why, err := c.orphaned(ctx, name, inst)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if why == "" {
				continue
			}
			orphansFound.WithLabelValues(name).Inc()
			log.Info("orphaned instance", "provider", name, "instance", inst.Name, "location", inst.Location, "ownerUID", inst.OwnerUID(),
				"reason", why, "age", now.Sub(inst.CreatedAt).Round(time.Second), "dryRun", c.DryRun)
			if c.DryRun {
				continue
			}
			if err := prov.Delete(ctx, inst); err != nil {
				errs = append(errs, fmt.Errorf("deleting orphaned instance %s of provider %s: %w", inst.Name, name, err))
				continue
			}
			orphansDeleted.WithLabelValues(name).Inc()
		}
	}
	errs = append(errs, c.sweepRecords(ctx, now), c.sweepFirewalls(ctx))
	return errors.Join(errs...)
}

// recordGrace spares a shared credentials record written this recently,
// though no Proxy's status names its hash: an instance may be starting
// from it, unrecorded (decision 59). A Create rewrites a record older than
// recordRefresh, so a record in use is never this old.
const recordGrace = time.Hour

// sweepRecords deletes the credentials records no instance uses: a shared
// record whose spec hash no Proxy in its namespace records, once it is
// older than recordGrace; a record an earlier version kept for one
// instance, once its Proxy is gone (the finalizer deletes it, this catches
// a Proxy removed without it). Young records are spared, as young instances
// are.
func (c *OrphanCollector) sweepRecords(ctx context.Context, now time.Time) error {
	if c.Credentials == nil {
		return nil
	}
	var secrets corev1.SecretList
	if err := c.Credentials.List(ctx, &secrets, client.InNamespace(c.CredentialsNamespace), client.MatchingLabels(c.Owner.Labels())); err != nil {
		return fmt.Errorf("listing credentials records: %w", err)
	}
	var errs []error
	hashesIn := map[string]map[string]bool{} // namespace → spec hashes its Proxies record
	for i := range secrets.Items {
		secret := &secrets.Items[i]
		if now.Sub(secret.CreationTimestamp.Time) < c.GracePeriod || !secret.DeletionTimestamp.IsZero() {
			continue
		}
		ns := secret.Labels[crawlv1alpha1.LabelOwnerNamespace]
		if !c.Scope.Contains(ns) {
			continue
		}
		var why string
		var err error
		switch secret.Labels[crawlv1alpha1.LabelCredentialsRole] {
		case credentials.RoleSpec:
			why, err = c.unusedRecord(ctx, secret, now, hashesIn)
		case credentials.RoleInstance:
			why, err = c.orphanedLegacyRecord(ctx, secret)
		default:
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if why != "" {
			errs = append(errs, c.deleteRecord(ctx, secret, why))
		}
	}
	return errors.Join(errs...)
}

// unusedRecord says why a shared record is no longer needed, or "" when it
// is: some Proxy in its namespace records its hash, or it was written
// within recordGrace.
func (c *OrphanCollector) unusedRecord(ctx context.Context, secret *corev1.Secret, now time.Time, hashesIn map[string]map[string]bool) (string, error) {
	if written, ok := recordWritten(secret); ok && now.Sub(written) < recordGrace {
		return "", nil
	}
	ns, hash := secret.Labels[crawlv1alpha1.LabelOwnerNamespace], secret.Labels[crawlv1alpha1.LabelSpecHash]
	hashes, listed := hashesIn[ns]
	if !listed {
		var proxies crawlv1alpha1.ProxyList
		if err := c.Client.List(ctx, &proxies, client.InNamespace(ns)); err != nil {
			return "", fmt.Errorf("listing Proxies in %s, users of credentials record %s: %w", ns, secret.Name, err)
		}
		hashes = map[string]bool{}
		for i := range proxies.Items {
			hashes[proxies.Items[i].Status.SpecHash] = true
		}
		hashesIn[ns] = hashes
	}
	if hashes[hash] {
		return "", nil
	}
	return fmt.Sprintf("no Proxy in %s records spec %s", ns, hash), nil
}

// orphanedLegacyRecord says why a record kept for one instance by an
// earlier version is orphaned, or "" while its Proxy exists.
func (c *OrphanCollector) orphanedLegacyRecord(ctx context.Context, secret *corev1.Secret) (string, error) {
	ns, name := secret.Labels[crawlv1alpha1.LabelOwnerNamespace], secret.Labels[crawlv1alpha1.LabelOwnerName]
	var owner crawlv1alpha1.Proxy
	err := c.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &owner)
	switch {
	case err != nil && !apierrors.IsNotFound(err):
		return "", fmt.Errorf("reading Proxy %s/%s, owner of credentials record %s: %w", ns, name, secret.Name, err)
	case err == nil && string(owner.UID) == secret.Labels[crawlv1alpha1.LabelOwnerUID]:
		return "", nil
	}
	return fmt.Sprintf("Proxy %s/%s is gone", ns, name), nil
}

func (c *OrphanCollector) deleteRecord(ctx context.Context, secret *corev1.Secret, why string) error {
	logf.FromContext(ctx).WithName("orphan-gc").Info("unused credentials record", "secret", client.ObjectKeyFromObject(secret), "why", why, "dryRun", c.DryRun)
	if c.DryRun {
		return nil
	}
	if err := c.Deleter.Delete(ctx, secret); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("deleting unused credentials record %s: %w", secret.Name, err)
	}
	return nil
}

// sweepFirewalls deletes the firewall rules this operator made for provider
// instances no longer in its config, as each configured provider instance
// can see them (a rule in a project no configured provider instance reaches
// any more stays: docs/security.md).
func (c *OrphanCollector) sweepFirewalls(ctx context.Context) error {
	log := logf.FromContext(ctx).WithName("orphan-gc")
	configured := func(name string) bool { _, ok := c.Providers[name]; return ok }
	var errs []error
	seen := map[string]bool{}
	for _, name := range c.Providers.Names() {
		guard, ok := c.Providers[name].(providers.Firewalled)
		if !ok {
			continue
		}
		stray, err := guard.StrayFirewalls(ctx, c.Owner, configured)
		if err != nil {
			errs = append(errs, fmt.Errorf("listing stray firewalls through provider %s: %w", name, err))
			continue
		}
		for _, rule := range stray {
			if seen[rule.Location+"/"+rule.Name] {
				continue // two provider instances share the project
			}
			seen[rule.Location+"/"+rule.Name] = true
			log.Info("stray firewall rule", "rule", rule.Name, "location", rule.Location, "provider", rule.Provider, "dryRun", c.DryRun)
			if c.DryRun {
				continue
			}
			if err := guard.DeleteFirewall(ctx, rule); err != nil {
				errs = append(errs, fmt.Errorf("deleting stray firewall %s: %w", rule.Name, err))
			}
		}
	}
	return errors.Join(errs...)
}

// orphaned says why inst has no owner, or "" when it has one.
func (c *OrphanCollector) orphaned(ctx context.Context, provider string, inst *providers.Instance) (string, error) {
	ns, name := inst.Labels[crawlv1alpha1.LabelOwnerNamespace], inst.Labels[crawlv1alpha1.LabelOwnerName]
	if ns == "" || name == "" {
		return "the instance has no owner labels", nil
	}
	if !c.Scope.Contains(ns) {
		return "", nil
	}
	var owner crawlv1alpha1.Proxy
	err := c.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &owner)
	switch {
	case apierrors.IsNotFound(err):
		return fmt.Sprintf("Proxy %s/%s does not exist", ns, name), nil
	case err != nil:
		return "", fmt.Errorf("reading Proxy %s/%s, owner of instance %s: %w", ns, name, inst.Name, err)
	case string(owner.UID) != inst.OwnerUID():
		return fmt.Sprintf("Proxy %s/%s has uid %s, the instance was made for %s", ns, name, owner.UID, inst.OwnerUID()), nil
	case owner.Spec.Mode != crawlv1alpha1.ModeManaged ||
		owner.Spec.Provider != provider && owner.Status.Provider != provider:
		return fmt.Sprintf("Proxy %s/%s no longer uses provider %s", ns, name, provider), nil
	}
	return "", nil
}
