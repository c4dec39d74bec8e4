package cluster

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
)

// PodMarker plays a fast kubelet for benchmarks: each new proxy pod gets a
// loopback address of its own with an in-process CONNECT proxy on the pod's
// port, and is marked Running and Ready at once. Unlike PodRunner it starts
// no Squid, so a thousand pods cost a thousand sockets, not a thousand
// processes. It watches pods and reads them from its informer, so its only
// API requests are the status writes a kubelet would make. Its proxies
// refuse a CONNECT without credentials, as every Managed Squid does (so
// the operator's open-proxy probe passes), but accept any they are given:
// reading each pod's lease key would be API load on the machine the
// operator is measured on.
type PodMarker struct {
	client  client.Client
	workers int
	queue   workqueue.TypedInterface[types.NamespacedName]

	mu      sync.Mutex
	proxies map[types.UID]*ConnectProxy
	byKey   map[types.NamespacedName]types.UID
	nextIP  int

	writes atomic.Int64
}

// Writes is how many status writes the marker has made: a benchmark counts
// them with the operator's, as the kubelet's writes are the bare
// sequence's.
func (m *PodMarker) Writes() int64 { return m.writes.Load() }

// NewPodMarker returns a marker writing through c with workers goroutines.
func NewPodMarker(c client.Client, workers int) *PodMarker {
	return &PodMarker{
		client: c, workers: workers, queue: workqueue.NewTyped[types.NamespacedName](),
		proxies: map[types.UID]*ConnectProxy{}, byKey: map[types.NamespacedName]types.UID{},
	}
}

// Run watches proxy pods (those carrying the operator's cluster-id label)
// until ctx ends, then closes every proxy it started.
func (m *PodMarker) Run(ctx context.Context, cfg *rest.Config) error {
	hasLabel, err := labels.NewRequirement(crawlv1alpha1.LabelClusterID, selection.Exists, nil)
	if err != nil {
		return err
	}
	informers, err := cache.New(cfg, cache.Options{Scheme: m.client.Scheme(), ByObject: map[client.Object]cache.ByObject{
		&corev1.Pod{}: {Label: labels.NewSelector().Add(*hasLabel)},
	}})
	if err != nil {
		return fmt.Errorf("pod marker cache: %w", err)
	}
	inf, err := informers.GetInformer(ctx, &corev1.Pod{})
	if err != nil {
		return fmt.Errorf("pod marker informer: %w", err)
	}
	enqueue := func(obj any) {
		if pod, ok := obj.(*corev1.Pod); ok {
			m.queue.Add(client.ObjectKeyFromObject(pod))
		} else if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			if pod, ok := tomb.Obj.(*corev1.Pod); ok {
				m.queue.Add(client.ObjectKeyFromObject(pod))
			}
		}
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, UpdateFunc: func(_, obj any) { enqueue(obj) }, DeleteFunc: enqueue,
	}); err != nil {
		return fmt.Errorf("pod marker handler: %w", err)
	}
	go func() { _ = informers.Start(ctx) }()
	var wg sync.WaitGroup
	for range m.workers {
		wg.Go(func() {
			for {
				key, shutdown := m.queue.Get()
				if shutdown {
					return
				}
				if err := m.sync(ctx, informers, key); err != nil && ctx.Err() == nil {
					fmt.Fprintf(os.Stderr, "pod marker: pod %s: %v\n", key, err)
					m.queue.Add(key) // retried at once: a benchmark has no time to back off
				}
				m.queue.Done(key)
			}
		})
	}
	<-ctx.Done()
	m.queue.ShutDown()
	wg.Wait()
	m.mu.Lock()
	defer m.mu.Unlock()
	for uid, p := range m.proxies {
		p.Close()
		delete(m.proxies, uid)
	}
	return nil
}

// sync reads the pod from the marker's own informer (no API request per
// event) and marks it running if it is new.
func (m *PodMarker) sync(ctx context.Context, pods client.Reader, key types.NamespacedName) error {
	var pod corev1.Pod
	err := pods.Get(ctx, key, &pod)
	if apierrors.IsNotFound(err) || (err == nil && pod.DeletionTimestamp != nil) {
		m.forget(key)
		return nil
	}
	if err != nil {
		return err
	}
	m.mu.Lock()
	uid, known := m.byKey[key]
	m.mu.Unlock()
	if known && uid == pod.UID {
		return nil
	}
	if known {
		m.forget(key) // the same name, a new pod
	}
	m.mu.Lock()
	m.nextIP++
	n := m.nextIP
	m.mu.Unlock()
	ip := LoopbackIP(3, n)
	port := pod.Spec.Containers[0].Ports[0].ContainerPort
	proxy, err := StartAuthenticatingProxy(fmt.Sprintf("%s:%d", ip, port), credentialsPresent)
	if err != nil {
		return err
	}
	pod.Status = RunningStatus(&pod, ip, time.Now())
	if err := m.client.Status().Update(ctx, &pod); err != nil {
		proxy.Close()
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return nil // gone, or the cache was behind: its next event brings it back
		}
		return fmt.Errorf("marking it running: %w", err)
	}
	m.writes.Add(1)
	m.mu.Lock()
	m.proxies[pod.UID], m.byKey[key] = proxy, pod.UID
	m.mu.Unlock()
	return nil
}

func (m *PodMarker) forget(key types.NamespacedName) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if uid, ok := m.byKey[key]; ok {
		m.proxies[uid].Close()
		delete(m.proxies, uid)
		delete(m.byKey, key)
	}
}

// credentialsPresent admits a CONNECT that carries any Basic credentials.
func credentialsPresent(user, _ string) bool { return user != "" }
