package geo

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	acv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1/applyconfiguration/api/v1alpha1"
	"github.com/example/egress-proxies-operator/geoip"
)

// Locator is the geo database as the reconciler uses it (*geoip.Database).
type Locator interface {
	Lookup(ip string) (geoip.Location, bool)
	// Changes delivers a value when lookups may answer differently.
	Changes() <-chan struct{}
}

// ReasonGeoMismatch is the Event a Proxy gets when the database
// contradicts what it declares.
const ReasonGeoMismatch = "GeoMismatch"

// Reconciler keeps each Proxy's status.geo to what the database says of
// its exit IP.
type Reconciler struct {
	Client   client.Client
	Database Locator
	Recorder events.EventRecorder
}

// SetupWithManager watches Proxies whose exit IP or declarations may have
// changed, and looks at every Proxy again when the database changes.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	changed := predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		old, oldOK := e.ObjectOld.(*crawlv1alpha1.Proxy)
		cur, curOK := e.ObjectNew.(*crawlv1alpha1.Proxy)
		return !oldOK || !curOK || old.ExitIP() != cur.ExitIP() || old.Generation != cur.Generation ||
			!equality.Semantic.DeepEqual(old.Status.Geo, cur.Status.Geo)
	}}
	everyProxy := source.Func(func(ctx context.Context, queue workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
		go r.requeueOnChange(ctx, queue)
		return nil
	})
	if err := ctrl.NewControllerManagedBy(mgr).
		Named("geo").
		For(&crawlv1alpha1.Proxy{}, builder.WithPredicates(changed)).
		WatchesRawSource(everyProxy).
		Complete(r); err != nil {
		return fmt.Errorf("building the geo controller: %w", err)
	}
	return nil
}

// requeueOnChange queues every Proxy whenever the database changes.
func (r *Reconciler) requeueOnChange(ctx context.Context, queue workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.Database.Changes():
			var list crawlv1alpha1.ProxyList
			if err := r.Client.List(ctx, &list); err != nil {
				logf.FromContext(ctx).Error(err, "listing Proxies to look up again after the geo database changed")
				continue
			}
			for i := range list.Items {
				queue.Add(reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
			}
		}
	}
}

// Reconcile applies the Proxy's status.geo when it is not what Judge says.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var p crawlv1alpha1.Proxy
	if err := r.Client.Get(ctx, req.NamespacedName, &p); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	var loc geoip.Location
	found := false
	if ip := p.ExitIP(); ip != "" {
		loc, found = r.Database.Lookup(ip)
	}
	want := Judge(&p, loc, found)
	if equality.Semantic.DeepEqual(want, p.Status.Geo) {
		return reconcile.Result{}, nil
	}
	apply := acv1alpha1.Proxy(p.Name, p.Namespace).WithStatus(statusApply(want))
	if err := r.Client.Status().Apply(ctx, apply, client.FieldOwner(crawlv1alpha1.FieldManagerGeo), client.ForceOwnership); err != nil {
		if apierrors.IsNotFound(err) {
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, fmt.Errorf("applying the geo of Proxy %s: %w", req.NamespacedName, err)
	}
	if want != nil && want.Mismatch != "" && (p.Status.Geo == nil || p.Status.Geo.Mismatch != want.Mismatch) {
		r.Recorder.Eventf(&p, nil, corev1.EventTypeWarning, ReasonGeoMismatch, "GeoLookup", "%s", want.Mismatch)
	}
	return reconcile.Result{}, nil
}

// statusApply is the geo controller's whole part of a status: want, or
// nothing (which drops a geo it applied before).
func statusApply(want *crawlv1alpha1.ProxyGeo) *acv1alpha1.ProxyStatusApplyConfiguration {
	status := acv1alpha1.ProxyStatus()
	if want == nil {
		return status
	}
	g := acv1alpha1.ProxyGeo().WithIP(want.IP)
	if want.Country != "" {
		g.WithCountry(want.Country)
	}
	if want.City != "" {
		g.WithCity(want.City)
	}
	if want.ASN != 0 {
		g.WithASN(want.ASN)
	}
	if want.ASNOrg != "" {
		g.WithASNOrg(want.ASNOrg)
	}
	if want.Mismatch != "" {
		g.WithMismatch(want.Mismatch)
	}
	return status.WithGeo(g)
}
