package controllers

import (
	"errors"
	"flag"
	"fmt"
	"time"
)

// Options are the Proxy controllers' flags: how many Proxies are
// reconciled at once, when and how fast sick proxies are replaced, and how
// orphans are collected. main hands them to the ProxyReconciler, the
// InstanceWatcher and the OrphanCollector.
type Options struct {
	MaxConcurrentReconciles int
	Replacement             ReplacementPolicy
	MaxReplacementsInFlight int
	MaxBurnedIPRerolls      int
	InstanceResyncInterval  time.Duration
	GCInterval              time.Duration
	GCGracePeriod           time.Duration
	GCDryRun                bool
}

// AddFlags registers the controllers' flags.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.IntVar(&o.MaxConcurrentReconciles, "max-concurrent-reconciles", DefaultMaxConcurrentReconciles,
		"Proxies reconciled at once (never the same Proxy twice); each reconcile makes at most one provider call.")
	fs.DurationVar(&o.Replacement.After, "unhealthy-replace-after", DefaultUnhealthyReplaceAfter,
		"How long a Managed proxy may stay Unhealthy without a break before its instance is replaced; 0 never replaces for failing probes. A Proxy's spec.healthCheck.replaceAfter overrides it.")
	fs.Float64Var(&o.Replacement.MaxUnhealthyShare, "max-unhealthy-share", DefaultMaxUnhealthyShare,
		"When more than this share (0-1] of the Managed proxies probed against one URL are Unhealthy at once (3 at least), the probe target is suspected and none of them is replaced.")
	fs.DurationVar(&o.Replacement.StartupTimeout, "startup-timeout", DefaultStartupTimeout,
		"How long a Managed proxy's instance may go without running (a VM stuck booting, a Squid container in CrashLoopBackOff, an unschedulable pod) before it is replaced; 0 never replaces for it.")
	fs.IntVar(&o.MaxReplacementsInFlight, "max-replacements-in-flight", DefaultMaxReplacementsInFlight,
		"Unhealthy proxies being replaced at once, per provider instance; more wait their turn.")
	fs.IntVar(&o.MaxBurnedIPRerolls, "max-burned-ip-rerolls", DefaultMaxBurnedIPRerolls,
		"New instances in a row replaced for coming up on an exit IP retired for bans (--burned-ip-retention) before one is served anyway; 0 serves the first at once (reason BurnedIPAccepted).")
	fs.DurationVar(&o.InstanceResyncInterval, "instance-resync-interval", DefaultInstanceResyncInterval,
		"How often the instances of Ready proxies that no watch covers (gcp VMs) are listed again, one List per provider instance, so a VM terminated or deleted behind the operator's back is replaced (jittered by 20%).")
	fs.DurationVar(&o.GCInterval, "gc-interval", DefaultGCInterval,
		"How often orphan GC lists every provider's instances.")
	fs.DurationVar(&o.GCGracePeriod, "gc-grace-period", DefaultGCGracePeriod,
		"Orphan GC spares instances younger than this (a Proxy may not have recorded its new instance yet).")
	fs.BoolVar(&o.GCDryRun, "gc-dry-run", false,
		"Orphan GC logs what it would delete and deletes nothing.")
}

// Validate checks the controllers' flags.
func (o *Options) Validate() error {
	var errs []error
	if o.MaxConcurrentReconciles < 1 {
		errs = append(errs, fmt.Errorf("--max-concurrent-reconciles must be at least 1, got %d", o.MaxConcurrentReconciles))
	}
	if o.Replacement.After < 0 {
		errs = append(errs, fmt.Errorf("--unhealthy-replace-after must not be negative (0 turns replacement off), got %s", o.Replacement.After))
	}
	if o.Replacement.StartupTimeout < 0 {
		errs = append(errs, fmt.Errorf("--startup-timeout must not be negative (0 turns it off), got %s", o.Replacement.StartupTimeout))
	}
	if !(o.Replacement.MaxUnhealthyShare > 0 && o.Replacement.MaxUnhealthyShare <= 1) {
		errs = append(errs, fmt.Errorf("--max-unhealthy-share must be a share in (0, 1], got %g", o.Replacement.MaxUnhealthyShare))
	}
	if o.MaxReplacementsInFlight < 1 {
		errs = append(errs, fmt.Errorf("--max-replacements-in-flight must be at least 1, got %d", o.MaxReplacementsInFlight))
	}
	if o.MaxBurnedIPRerolls < 0 {
		errs = append(errs, fmt.Errorf("--max-burned-ip-rerolls must not be negative, got %d", o.MaxBurnedIPRerolls))
	}
	if o.InstanceResyncInterval <= 0 {
		errs = append(errs, fmt.Errorf("--instance-resync-interval must be positive, got %s", o.InstanceResyncInterval))
	}
	if o.GCInterval <= 0 {
		errs = append(errs, fmt.Errorf("--gc-interval must be positive, got %s", o.GCInterval))
	}
	if o.GCGracePeriod < 0 {
		errs = append(errs, fmt.Errorf("--gc-grace-period must not be negative, got %s", o.GCGracePeriod))
	}
	return errors.Join(errs...)
}
