package shard

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
)

// LabelGroup marks a replica's Lease with the group it is a member of.
const LabelGroup = "crawl.example.com/shard-group"

// Defaults: a replica that dies hands its share over within
// LeaseDuration and two RenewIntervals (its last renewal is listed up to
// one late, its expiry up to one late): 14 s, under the health engine's
// 30 s probe interval. The renew deadline is 7/10 of the
// duration and the renew interval 1/5, whatever the duration.
const (
	DefaultLeaseDuration = 10 * time.Second
	DefaultRenewDeadline = DefaultLeaseDuration / 10 * 7
	DefaultRenewInterval = DefaultLeaseDuration / 5
)

// Options configure a Member.
type Options struct {
	// Leases reaches the Leases in Namespace (client-go's typed client).
	Leases    coordinationv1client.LeasesGetter
	Namespace string
	// Group names the work being divided: the members of a group are the
	// Leases labelled LabelGroup=Group.
	Group string
	// Identity is this replica's, unique among the group's members
	// (NewIdentity).
	Identity string
	// LeaseDuration is how long after its last renewal (as this replica
	// saw it) another replica's Lease still makes it a member.
	// RenewDeadline is how long after its own last renewal this replica
	// still owns anything; it must leave LeaseDuration - RenewDeadline
	// longer than RenewInterval, so that a replica stops before the others
	// take its share. RenewInterval is how often the Lease is renewed and
	// the group listed. HandoverDelay is how long a change of members
	// stands before this replica takes up what it gains (default: two
	// RenewIntervals, so that every member has listed the change). Only
	// LeaseDuration set, the others keep the defaults' proportions to it:
	// a replica that dies hands its share over within 1.4 LeaseDurations.
	LeaseDuration, RenewDeadline, RenewInterval, HandoverDelay time.Duration
	Clock                                                      clock.WithTicker
	// WaitReady, if set, returns once this replica can do its share's
	// work (true), or ctx ended first (false): it joins only then. A
	// replica that joined before, while its caches still filled, would
	// take its share from the others and leave it undone meanwhile.
	WaitReady func(ctx context.Context) bool
}

// Member is one replica's membership of a group, and its answer to "is
// this key mine?". It is a manager Runnable that runs on every replica.
type Member struct {
	opts      Options
	leaseName string
	changes   chan struct{}

	mu sync.RWMutex
	// latest is the members as last listed, since latestSince; settled is
	// the last list that stood for HandoverDelay. Both sorted.
	latest, settled []string
	latestSince     time.Time
	// renewedAt is when this replica's Lease was last renewed (zero: never);
	// live is whether it stood at the last step.
	renewedAt time.Time
	live      bool
	// seen is each Lease listed: its renew time, and when this replica
	// first saw that renew time (clocks differ between nodes; the time a
	// renewal was seen does not depend on the other's clock).
	seen map[string]sighting
}

// sighting is one Lease as last listed.
type sighting struct {
	holder     string
	renewTime  time.Time
	duration   time.Duration
	observedAt time.Time
}

// NewIdentity is a replica identity unique across restarts: the host (a
// pod's name) and a random suffix.
func NewIdentity(host string) string {
	return host + "_" + randomSuffix()
}

// New checks opts and builds a Member; Start runs it.
func New(opts Options) (*Member, error) {
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.LeaseDuration <= 0 {
		opts.LeaseDuration = DefaultLeaseDuration
	}
	// Unset, the others keep the defaults' proportions to the duration.
	if opts.RenewDeadline <= 0 {
		opts.RenewDeadline = opts.LeaseDuration / 10 * 7
	}
	if opts.RenewInterval <= 0 {
		opts.RenewInterval = opts.LeaseDuration / 5
	}
	if opts.HandoverDelay <= 0 {
		opts.HandoverDelay = 2 * opts.RenewInterval
	}
	if err := opts.validate(); err != nil {
		return nil, err
	}
	sum := sha256.Sum256([]byte(opts.Identity))
	return &Member{
		opts: opts, leaseName: opts.Group + "-" + hex.EncodeToString(sum[:5]),
		changes: make(chan struct{}, 1), seen: map[string]sighting{},
	}, nil
}

func (o Options) validate() error {
	var errs []error
	if bad := validation.IsValidLabelValue(o.Group); o.Group != "" && len(bad) > 0 {
		errs = append(errs, fmt.Errorf("the group %q names the members' Leases by a label: %s", o.Group, strings.Join(bad, "; ")))
	}
	if o.LeaseDuration%time.Second != 0 {
		errs = append(errs, fmt.Errorf("the lease duration (%s) must be whole seconds: a Lease records it so", o.LeaseDuration))
	}
	if o.Leases == nil || o.Namespace == "" || o.Group == "" || o.Identity == "" {
		errs = append(errs, errors.New("a shard member needs a Leases client, a namespace, a group and an identity"))
	}
	if o.LeaseDuration-o.RenewDeadline <= o.RenewInterval {
		errs = append(errs, fmt.Errorf("the lease duration (%s) must exceed the renew deadline (%s) by more than the renew interval (%s): a replica that cannot renew must stop before the others take its share",
			o.LeaseDuration, o.RenewDeadline, o.RenewInterval))
	}
	if o.HandoverDelay < o.RenewInterval {
		errs = append(errs, fmt.Errorf("the handover delay (%s) must be at least the renew interval (%s): every member lists a change before anyone takes up what it gains", o.HandoverDelay, o.RenewInterval))
	}
	return errors.Join(errs...)
}

// NeedLeaderElection is false: every replica is a member.
func (m *Member) NeedLeaderElection() bool { return false }

// Changes receives a value whenever what this replica owns may have
// changed: the members changed, a change settled, or this replica's Lease
// lapsed or came back.
func (m *Member) Changes() <-chan struct{} { return m.changes }

// Identity is this replica's identity in the group.
func (m *Member) Identity() string { return m.opts.Identity }

// Members are the group's live members as last listed.
func (m *Member) Members() []string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return slices.Clone(m.latest)
}

// Owns says whether key is this replica's now: its Lease is renewed, key
// is its by the latest members, and, until they have stood for the
// handover delay, it was its by the settled members too, or their owner of
// key is gone. A member that is gone stopped at its renew deadline, before
// its Lease expired here; a member that joined waits the handover delay
// itself, by when this one has seen it: so a key gone with its owner is
// taken at once, even while the members keep changing.
func (m *Member) Owns(key string) bool {
	now := m.opts.Clock.Now()
	m.mu.RLock()
	defer m.mu.RUnlock()
	if !m.liveLocked(now) || Owner(m.latest, key) != m.opts.Identity {
		return false
	}
	if now.Sub(m.latestSince) >= m.opts.HandoverDelay {
		return true
	}
	was := Owner(m.settled, key)
	return was == m.opts.Identity || was != "" && !slices.Contains(m.latest, was)
}

// liveLocked says whether this replica's Lease still stands by its renew
// deadline.
func (m *Member) liveLocked(now time.Time) bool {
	return !m.renewedAt.IsZero() && now.Sub(m.renewedAt) < m.opts.RenewDeadline
}

// Start renews this replica's Lease and lists the group every
// RenewInterval until ctx ends, then deletes its Lease so the others take
// its share without waiting for it to expire.
func (m *Member) Start(ctx context.Context) error {
	log := logf.FromContext(ctx).WithValues("group", m.opts.Group, "identity", m.opts.Identity)
	ctx = logf.IntoContext(ctx, log)
	if m.opts.WaitReady != nil && !m.opts.WaitReady(ctx) {
		return nil
	}
	ticker := m.opts.Clock.NewTicker(m.opts.RenewInterval)
	defer ticker.Stop()
	for {
		m.step(ctx)
		select {
		case <-ctx.Done():
			m.resign(log)
			return nil
		case <-ticker.C():
		}
	}
}

// step renews, lists, and works out what changed.
func (m *Member) step(ctx context.Context) {
	log := logf.FromContext(ctx)
	// A call that hangs must not hold the loop past the renew deadline,
	// which is judged at every step.
	ctx, cancel := context.WithTimeout(ctx, m.opts.RenewDeadline)
	defer cancel()
	renewed, err := m.renew(ctx)
	if err != nil {
		log.Error(err, "renewing this replica's shard Lease; it owns nothing once the renew deadline passes", "lease", m.leaseName)
	}
	leases, err := m.opts.Leases.Leases(m.opts.Namespace).List(ctx, metav1.ListOptions{LabelSelector: LabelGroup + "=" + m.opts.Group})
	if err != nil {
		log.Error(err, "listing the shard group's Leases; keeping the last members")
	}
	now := m.opts.Clock.Now()
	m.mu.Lock()
	if renewed {
		m.renewedAt = now
	}
	live := m.liveLocked(now)
	changed := live != m.live
	m.live = live
	var stale []coordinationv1.Lease
	if err == nil {
		var members []string
		members, stale = m.observeLocked(leases.Items, now)
		if !slices.Equal(members, m.latest) {
			log.Info("shard members changed", "members", members, "previous", m.latest)
			m.latest, m.latestSince, changed = members, now, true
			membersGauge.Set(float64(len(members)))
		}
	}
	if !slices.Equal(m.settled, m.latest) && now.Sub(m.latestSince) >= m.opts.HandoverDelay {
		m.settled, changed = m.latest, true
		handovers.Inc()
	}
	m.mu.Unlock()
	if changed {
		select {
		case m.changes <- struct{}{}:
		default:
		}
	}
	m.collect(ctx, stale)
}

// observeLocked takes a listing of the group's Leases: the live members
// (this replica among them while its Lease stands), and the Leases expired
// so long ago that their replicas are surely gone.
func (m *Member) observeLocked(leases []coordinationv1.Lease, now time.Time) (members []string, stale []coordinationv1.Lease) {
	seen := make(map[string]sighting, len(leases))
	for _, l := range leases {
		s := sighting{holder: ptr.Deref(l.Spec.HolderIdentity, ""), duration: time.Duration(ptr.Deref(l.Spec.LeaseDurationSeconds, 0)) * time.Second, observedAt: now}
		if l.Spec.RenewTime != nil {
			s.renewTime = l.Spec.RenewTime.Time
		}
		if before, ok := m.seen[l.Name]; ok && before.renewTime.Equal(s.renewTime) {
			s.observedAt = before.observedAt
		}
		seen[l.Name] = s
		switch {
		case s.holder == "":
		case s.holder == m.opts.Identity:
			if m.liveLocked(now) {
				members = append(members, s.holder)
			}
		case now.Sub(s.observedAt) < s.duration:
			members = append(members, s.holder)
		case now.Sub(s.observedAt) > staleAfter*max(s.duration, m.opts.LeaseDuration):
			stale = append(stale, l)
		}
	}
	m.seen = seen
	slices.Sort(members)
	return slices.Compact(members), stale
}

// staleAfter is how many lease durations past its last renewal a member's
// Lease is deleted: a replica that died without resigning leaves one.
const staleAfter = 10

// renew creates or renews this replica's Lease; renewed says it stands.
func (m *Member) renew(ctx context.Context) (renewed bool, err error) {
	leases := m.opts.Leases.Leases(m.opts.Namespace)
	now := metav1.NewMicroTime(m.opts.Clock.Now())
	spec := coordinationv1.LeaseSpec{
		HolderIdentity: ptr.To(m.opts.Identity), LeaseDurationSeconds: ptr.To(int32(m.opts.LeaseDuration.Seconds())),
		RenewTime: &now,
	}
	current, err := leases.Get(ctx, m.leaseName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		spec.AcquireTime = &now
		lease := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: m.leaseName, Namespace: m.opts.Namespace, Labels: map[string]string{LabelGroup: m.opts.Group}},
			Spec:       spec,
		}
		if _, err := leases.Create(ctx, lease, metav1.CreateOptions{}); err != nil {
			return false, fmt.Errorf("creating Lease %s/%s: %w", m.opts.Namespace, m.leaseName, err)
		}
		return true, nil
	case err != nil:
		return false, fmt.Errorf("reading Lease %s/%s: %w", m.opts.Namespace, m.leaseName, err)
	}
	spec.AcquireTime = current.Spec.AcquireTime
	if ptr.Deref(current.Spec.HolderIdentity, "") != m.opts.Identity {
		spec.AcquireTime = &now
	}
	current.Spec = spec
	if _, err := leases.Update(ctx, current, metav1.UpdateOptions{}); err != nil {
		return false, fmt.Errorf("renewing Lease %s/%s: %w", m.opts.Namespace, m.leaseName, err)
	}
	return true, nil
}

// collect deletes Leases of replicas long gone, unless renewed meanwhile.
func (m *Member) collect(ctx context.Context, stale []coordinationv1.Lease) {
	for _, l := range stale {
		err := m.opts.Leases.Leases(l.Namespace).Delete(ctx, l.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &l.ResourceVersion}})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			logf.FromContext(ctx).Error(err, "deleting the Lease of a replica long gone", "lease", l.Name, "holder", ptr.Deref(l.Spec.HolderIdentity, ""))
		}
	}
}

// resign deletes this replica's Lease as it stops.
func (m *Member) resign(log logr.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), m.opts.RenewInterval)
	defer cancel()
	m.mu.Lock()
	m.renewedAt = time.Time{}
	m.mu.Unlock()
	if err := m.opts.Leases.Leases(m.opts.Namespace).Delete(ctx, m.leaseName, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		log.Error(err, "deleting this replica's shard Lease as it stops; the others take its share once it expires", "lease", m.leaseName)
	}
}
