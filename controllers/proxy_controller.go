package controllers

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/controllers/cachelag"
	"github.com/example/egress-proxies-operator/credentials"
	"github.com/example/egress-proxies-operator/netid"
	"github.com/example/egress-proxies-operator/providers"
	"github.com/example/egress-proxies-operator/tracing"
)

// +kubebuilder:rbac:groups=crawl.example.com,resources=proxies,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=crawl.example.com,resources=proxies/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=crawl.example.com,resources=proxies/finalizers,verbs=update
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// DefaultPollInterval is how soon a pass that waits on an instance looks
// again when no watch event arrives first (GCE operations have none).
const DefaultPollInterval = 5 * time.Second

// secretRefIndex indexes Proxies by the cloud-init Secret they reference, so
// a Secret change enqueues exactly the Proxies that use it.
const secretRefIndex = "spec.cloudInit.secretRef.name"

// ProxyReconciler drives each Proxy towards its spec. Every pass observes
// (the Proxy, its cloud-init, the provider's Get), lets plan pick one
// action, performs it and records it. Being stateless between passes is
// what makes it crash-safe: the next pass starts from what the provider
// reports, not from memory.
type ProxyReconciler struct {
	// Client reads through the manager's cache and writes to the API server.
	Client client.Client
	// Providers are the configured provider instances by name.
	Providers providers.Set
	// Owner labels every instance this operator creates.
	Owner providers.Owner
	// Recorder emits the Events `kubectl describe px` shows.
	Recorder events.EventRecorder
	// PollInterval is how soon a waiting pass looks again; zero means
	// DefaultPollInterval.
	PollInterval time.Duration
	// Workers is how many Proxies are reconciled at once; zero means
	// DefaultMaxConcurrentReconciles. controller-runtime never hands two
	// workers the same Proxy.
	Workers int

	// Health is the health engine's in-memory view, which replacement of
	// Unhealthy proxies reads; nil turns that replacement off.
	Health HealthSignals
	// Replacement is the default policy for Unhealthy proxies; a Proxy's
	// spec.healthCheck.replaceAfter overrides After.
	Replacement ReplacementPolicy
	// MaxReplacementsInFlight bounds, per provider instance, the Unhealthy
	// proxies being replaced at once; zero means
	// DefaultMaxReplacementsInFlight.
	MaxReplacementsInFlight int
	// Triggers are Proxies to look at now, with no change of their own: a
	// verdict change from the health engine, an instance found lost by the
	// InstanceWatcher. Nil: none.
	Triggers <-chan event.GenericEvent
	// Clock reads the time for plan; nil means the real clock.
	Clock clock.PassiveClock
	// CredentialsCache holds the credentials Secrets (see
	// credentials.CacheOptions); the reconciler reads credentials from it
	// and watches it for rotations.
	CredentialsCache cache.Cache
	// CredentialsNamespace is the operator's namespace, where it keeps the
	// credentials it generates and the record of each instance's.
	CredentialsNamespace string
	// Burned is the memory of exit IPs retired for bans: an instance that
	// comes up on one is replaced before it serves, at most
	// MaxBurnedIPRerolls times in a row (0: served at once, and the status
	// says so). Nil: no such memory (no discovery API).
	Burned             BurnedIPs
	MaxBurnedIPRerolls int

	lagOnce sync.Once
	lag     *cacheLag
	// budgetMu makes counting the replacements in flight and admitting one
	// a single step.
	budgetMu sync.Mutex
}

// cache is the reconciler's memory of its writes the cache does not show
// yet (made on first use: the reconciler is a struct literal).
func (r *ProxyReconciler) cache() *cacheLag {
	r.lagOnce.Do(func() { r.lag = &cacheLag{tracker: cachelag.New("proxy", r.Clock, 0)} })
	return r.lag
}

// BurnedIPs is what the reconciler reads of the burned-IP memory (the lease
// store's, which main hands in): when an IP of a provider instance (scope)
// stops being burned, zero when it is not.
type BurnedIPs interface {
	BurnedUntil(ctx context.Context, scope, ip string) (time.Time, error)
}

// DefaultMaxBurnedIPRerolls bounds the instances in a row replaced for
// coming up on a burned IP: a provider whose every address is burned still
// gets a proxy, after that many tries.
const DefaultMaxBurnedIPRerolls = 3

// HealthSignals is what the reconciler reads of the health engine: its
// verdicts in memory, which are fresher than the status it writes.
type HealthSignals interface {
	// Health is what the engine knows of one proxy; ok is false for a
	// proxy it does not probe.
	Health(key types.NamespacedName) (h ProxyHealth, ok bool)
}

// Defaults for replacing Unhealthy proxies.
const (
	DefaultUnhealthyReplaceAfter   = 10 * time.Minute
	DefaultMaxUnhealthyShare       = 0.3
	DefaultStartupTimeout          = 10 * time.Minute
	DefaultMaxReplacementsInFlight = 5
)

// DefaultMaxConcurrentReconciles lets a slow provider call (a GCE insert
// takes a round trip to Google) hold up one Proxy, not the fleet.
const DefaultMaxConcurrentReconciles = 8

// Reconcile performs one step for one Proxy.
func (r *ProxyReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	log := logf.FromContext(ctx)
	var proxy crawlv1alpha1.Proxy
	if err := r.Client.Get(ctx, req.NamespacedName, &proxy); err != nil {
		if !apierrors.IsNotFound(err) {
			return reconcile.Result{}, err
		}
		r.cache().tracker.Forget(lagKey(lagProxy, req.NamespacedName))
		r.releaseReplacement(req.NamespacedName)
		return reconcile.Result{}, r.deleteInstancesOfGone(ctx, req.NamespacedName)
	}
	if _, behind := r.cache().tracker.Behind(lagKey(lagProxy, req.NamespacedName), proxy.ResourceVersion); behind {
		return reconcile.Result{RequeueAfter: cachelag.Recheck}, nil
	}
	// A span per reconcile, with the action it took: a trace shows how
	// long each step of a proxy's bring-up took.
	ctx, span := tracing.Tracer("github.com/example/egress-proxies-operator/controllers").Start(ctx, "reconcile Proxy",
		trace.WithAttributes(tracing.KeyProxy.String(req.String()), attribute.String("egress.provider", proxy.Spec.Provider)))
	defer span.End()
	obs, provider := r.observe(ctx, &proxy)
	action := plan(obs)
	span.SetAttributes(tracing.KeyOutcome.String(string(action.Type)), attribute.String("egress.reason", action.Reason))
	log.V(1).Info("planned", "action", action.Type, "reason", action.Reason, "message", action.Message)
	result, err := r.execute(ctx, &proxy, obs, provider, action)
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	return result, err
}

// observe gathers plan's inputs. It returns the provider holding the
// instance (nil if none could be reached), which execute needs for Create
// and Delete.
func (r *ProxyReconciler) observe(ctx context.Context, p *crawlv1alpha1.Proxy) (observation, providers.Provider) {
	o, prov := r.observeInstance(ctx, p)
	r.checkBurned(ctx, &o)
	return o, prov
}

// observeInstance is observe up to the instance: the spec resolved, and
// the instance found where the status or the spec says.
func (r *ProxyReconciler) observeInstance(ctx context.Context, p *crawlv1alpha1.Proxy) (observation, providers.Provider) {
	o := observation{proxy: p, now: r.clock().Now(), replacement: r.Replacement, pool: p.PoolName(), ban: p.CurrentBan(),
		maxRerolls: r.MaxBurnedIPRerolls}
	if p.Spec.Mode == crawlv1alpha1.ModeExternal {
		return o, nil
	}
	if hc := p.Spec.HealthCheck; hc != nil && hc.ReplaceAfter != nil {
		o.replacement.After = hc.ReplaceAfter.Duration
	}
	if r.Health != nil {
		if h, ok := r.Health.Health(client.ObjectKeyFromObject(p)); ok {
			o.health = &h
		}
	}
	o.instanceName = providers.InstanceName(r.Owner.ClusterID, p.Namespace, p.Name)
	o.ownerCollected = r.ownerCollected(p.Spec.Provider) && (p.Status.Provider == "" || r.ownerCollected(p.Status.Provider))
	if finalizerFirst(p, o.ownerCollected) {
		// plan adds the finalizer whatever the provider holds: the pass
		// asks the cloud nothing (a new proxy's first call to a rate-limited
		// API saved), and the next pass observes everything.
		return o, nil
	}

	// A Proxy being deleted needs only its instance found; anything else
	// needs a provider that accepts the spec and a cloud-init to hash.
	if p.DeletionTimestamp.IsZero() {
		desired, ok := r.Providers[p.Spec.Provider]
		if !ok {
			o.specErr = r.providerNotFound(p.Spec.Provider)
			return o, nil
		}
		if err := desired.Validate(p); err != nil {
			o.specErr = &specError{ReasonInvalidPlacement, providers.TerminalMessage(err)}
			return o, nil
		}
		if o.cloudInit, o.specErr = resolveCloudInit(ctx, r.Client, p); o.specErr != nil {
			return o, nil
		}
		var err error
		if o.credentials, o.specErr, err = r.resolveCredentials(ctx, p); o.specErr != nil || err != nil {
			o.getErr = err
			return o, nil
		}
		// Every instance built now checks per-lease credentials; its
		// record says so, for discovery and the health engine.
		o.credentials.Scheme = credentials.SchemeLease
		o.desiredHash = specHash(&p.Spec, o.cloudInit, o.credentials)
	}

	// Look where the instance was recorded first: after a change of
	// spec.provider the old instance lives in the old provider until deleted.
	candidates := []string{p.Spec.Provider}
	if recorded := p.Status.Provider; recorded != "" && recorded != p.Spec.Provider {
		candidates = []string{recorded, p.Spec.Provider}
	}
	var last providers.Provider
	for _, name := range candidates {
		prov, ok := r.Providers[name]
		if !ok {
			o.specErr = r.providerNotFound(name)
			return o, nil
		}
		inst, err := prov.Get(ctx, o.instanceName, p)
		switch {
		case errors.Is(err, providers.ErrNotFound):
			last = prov
			continue
		case err != nil:
			o.getErr = fmt.Errorf("getting instance %s from provider %s: %w", o.instanceName, name, err)
			return o, prov
		}
		o.instance, o.instanceProvider = inst, name
		return o, prov
	}
	if p.Status.InstanceName == "" && (!p.DeletionTimestamp.IsZero() || p.Generation > 1) {
		// Nothing recorded (a new proxy's quiet start, a lost write) and
		// nothing under the name where the spec says: before the finalizer
		// goes, or before a second instance is created after the spec
		// changed (spec.provider, say), make sure no provider holds an
		// instance made for this Proxy under any name or in any place.
		return r.findByOwner(ctx, o, last)
	}
	return o, last
}

// checkBurned asks the burned-IP memory about a running instance's IP, and
// its IPv6 range when it has one, before it first serves; one already
// serving at that IP was checked then (its own ban burns its IP, and it
// serves on until replaced). The later end of the two counts.
func (r *ProxyReconciler) checkBurned(ctx context.Context, o *observation) {
	inst, p := o.instance, o.proxy
	if r.Burned == nil || inst == nil || inst.State != providers.StateRunning || inst.IP == "" || !p.DeletionTimestamp.IsZero() ||
		(p.Status.Phase == crawlv1alpha1.PhaseReady && p.Status.IP == inst.IP && p.Status.InstanceName == inst.Name) {
		return
	}
	addresses := []string{inst.IP}
	if a := netid.RangeAddr(inst.IPv6Prefix); a != "" {
		addresses = append(addresses, a)
	}
	for _, ip := range addresses {
		until, err := r.Burned.BurnedUntil(ctx, o.instanceProvider, ip)
		if err != nil {
			o.burnedErr = fmt.Errorf("reading the burned-IP memory for %s: %w", ip, err)
			return
		}
		if until.After(o.burnedUntil) {
			o.burnedUntil = until
		}
	}
}

// findByOwner lists every provider instance for an instance labelled with
// the Proxy's UID.
func (r *ProxyReconciler) findByOwner(ctx context.Context, o observation, fallback providers.Provider) (observation, providers.Provider) {
	for _, name := range r.Providers.Names() {
		prov := r.Providers[name]
		instances, err := prov.List(ctx, r.Owner)
		if err != nil {
			o.getErr = fmt.Errorf("listing provider %s for instances of Proxy %s/%s: %w", name, o.proxy.Namespace, o.proxy.Name, err)
			return o, prov
		}
		for i := range instances {
			if instances[i].OwnerUID() == string(o.proxy.UID) {
				o.instance, o.instanceProvider = &instances[i], name
				return o, prov
			}
		}
	}
	return o, fallback
}

// ownerCollected says whether the provider instance called name deletes
// its instances with their Proxy (providers.OwnerCollected); a name not in
// the providers config does not.
func (r *ProxyReconciler) ownerCollected(name string) bool {
	_, ok := r.Providers[name].(providers.OwnerCollected)
	return ok
}

// deleteInstancesOfGone deletes the instance a Proxy without a finalizer
// left behind: the one under its instance name in each provider that
// deletes instances with their Proxy, as the cache shows it. The cache saw
// the Proxy before any pass made an instance for it and holds it until it
// is deleted, so an instance found here is an orphan: of this Proxy, or of
// an earlier Proxy of the same name. Kubernetes' garbage collector takes it
// too, a moment later (and alone, while the operator is down: after a
// restart, the instance's own watch event brings it here).
func (r *ProxyReconciler) deleteInstancesOfGone(ctx context.Context, key types.NamespacedName) error {
	log := logf.FromContext(ctx)
	instanceName := providers.InstanceName(r.Owner.ClusterID, key.Namespace, key.Name)
	gone := &crawlv1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
	var errs []error
	for _, name := range r.Providers.Names() {
		if !r.ownerCollected(name) {
			continue
		}
		prov := r.Providers[name]
		inst, err := prov.Get(ctx, instanceName, gone)
		switch {
		case errors.Is(err, providers.ErrNotFound):
			continue
		case err != nil:
			errs = append(errs, fmt.Errorf("getting instance %s of deleted Proxy %s from provider %s: %w", instanceName, key, name, err))
			continue
		case inst.State == providers.StateStopping || !r.Owner.Owns(inst.Labels) || inst.ProviderName() != name:
			continue
		}
		if err := prov.Delete(ctx, inst); err != nil {
			errs = append(errs, fmt.Errorf("deleting instance %s of deleted Proxy %s: %w", inst.Name, key, err))
			continue
		}
		log.Info("deleted the instance of a deleted Proxy", "provider", name, "instance", inst.Name, "ownerUID", inst.OwnerUID())
	}
	return errors.Join(errs...)
}

func (r *ProxyReconciler) clock() clock.PassiveClock {
	if r.Clock == nil {
		return clock.RealClock{}
	}
	return r.Clock
}

func (r *ProxyReconciler) providerNotFound(name string) *specError {
	return &specError{ReasonProviderNotFound, fmt.Sprintf("provider %q is not in the operator's providers config; configured: %s",
		name, strings.Join(r.Providers.Names(), ", "))}
}

// SetupWithManager registers the reconciler: Proxies (spec changes and
// deletion), the cloud-init Secrets they reference, and, for providers whose
// instances are Kubernetes objects, those objects.
func (r *ProxyReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if err := indexProxies(mgr.GetFieldIndexer()); err != nil {
		return err
	}
	workers := r.Workers
	if workers == 0 {
		workers = DefaultMaxConcurrentReconciles
	}
	b := ctrl.NewControllerManagedBy(mgr).
		Named("proxy").
		WithOptions(controller.Options{MaxConcurrentReconciles: workers}).
		For(&crawlv1alpha1.Proxy{}, builder.WithPredicates(ProxyChangePredicate())).
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(r.proxiesUsingSecret)).
		WatchesRawSource(source.Kind[client.Object](r.CredentialsCache, &corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(r.proxiesUsingCredentials)))
	if r.Triggers != nil {
		b = b.WatchesRawSource(source.Channel(r.Triggers, &handler.EnqueueRequestForObject{}))
	}
	watched := map[reflect.Type]bool{}
	for _, prov := range r.Providers {
		backed, ok := prov.(providers.ObjectBacked)
		if !ok {
			continue
		}
		obj := backed.InstanceObject()
		if t := reflect.TypeOf(obj); !watched[t] {
			watched[t] = true
			b = b.Watches(obj, handler.EnqueueRequestsFromMapFunc(ownerFromLabels))
		}
	}
	return b.Complete(r)
}

// indexProxies registers the cache indexes the reconciler lists Proxies by:
// the cloud-init Secret and the credentials they use, and the provider
// instance replacing them.
func indexProxies(indexer client.FieldIndexer) error {
	if err := indexer.IndexField(context.Background(), &crawlv1alpha1.Proxy{}, secretRefIndex, func(obj client.Object) []string {
		p := obj.(*crawlv1alpha1.Proxy)
		if p.Spec.CloudInit == nil || p.Spec.CloudInit.SecretRef == nil {
			return nil
		}
		return []string{p.Spec.CloudInit.SecretRef.Name}
	}); err != nil {
		return fmt.Errorf("indexing Proxies by cloud-init Secret: %w", err)
	}
	if err := indexer.IndexField(context.Background(), &crawlv1alpha1.Proxy{}, credentialsIndex, credentialsSource); err != nil {
		return fmt.Errorf("indexing Proxies by their credentials: %w", err)
	}
	if err := indexer.IndexField(context.Background(), &crawlv1alpha1.Proxy{}, replacingIndex, replacingProvider); err != nil {
		return fmt.Errorf("indexing Proxies by the provider replacing them: %w", err)
	}
	return nil
}

// CacheByObject scopes the manager's cache for what the reconciler reads
// beyond Proxies: Secrets, and only those labelled for cloud-init.
func CacheByObject() map[client.Object]cache.ByObject {
	return map[client.Object]cache.ByObject{
		&corev1.Secret{}: {Label: labels.SelectorFromSet(labels.Set{crawlv1alpha1.LabelCloudInit: "true"})},
	}
}

// ProxyChangePredicate lets through what needs a reconcile: creation, a spec
// change (generation) and the start of deletion. Status writes, including
// the health engine's, do not trigger a pass.
func ProxyChangePredicate() predicate.Predicate {
	return predicate.Or(predicate.GenerationChangedPredicate{}, predicate.Funcs{
		CreateFunc:  func(event.CreateEvent) bool { return false },
		DeleteFunc:  func(event.DeleteEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
		UpdateFunc: func(e event.UpdateEvent) bool {
			return e.ObjectOld != nil && e.ObjectNew != nil &&
				e.ObjectOld.GetDeletionTimestamp().IsZero() && !e.ObjectNew.GetDeletionTimestamp().IsZero()
		},
	})
}

// proxiesUsingSecret maps a cloud-init Secret to the Proxies referencing it.
func (r *ProxyReconciler) proxiesUsingSecret(ctx context.Context, secret client.Object) []reconcile.Request {
	var list crawlv1alpha1.ProxyList
	if err := r.Client.List(ctx, &list, client.InNamespace(secret.GetNamespace()),
		client.MatchingFields{secretRefIndex: secret.GetName()}); err != nil {
		logf.FromContext(ctx).Error(err, "listing Proxies for Secret", "secret", client.ObjectKeyFromObject(secret))
		return nil
	}
	return requestsFor(&list)
}

// requestsFor is a reconcile request for each listed Proxy.
func requestsFor(list *crawlv1alpha1.ProxyList) []reconcile.Request {
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for i := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
	}
	return reqs
}

// ownerFromLabels maps an instance object to the Proxy named by its owner
// labels.
func ownerFromLabels(_ context.Context, obj client.Object) []reconcile.Request {
	labels := obj.GetLabels()
	ns, name := labels[crawlv1alpha1.LabelOwnerNamespace], labels[crawlv1alpha1.LabelOwnerName]
	if ns == "" || name == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}}}
}
