// Command barecache is the memory benchmark's baseline: a process that
// holds an informer cache of every Proxy (managedFields stripped, as the
// operator keeps them) and nothing else, built as the operator's image is.
// The operator's resident memory is compared with it, so its own must be
// the least a process caching those Proxies needs: it links client-go,
// controller-runtime's cache and the API types, not the benchmark's harness.
//
// It prints "synced" once its cache has synced and then waits to be killed.
package main

import (
	"context"
	"fmt"
	"os"
	"runtime"

	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: barecache KUBECONFIG")
		os.Exit(2)
	}
	if err := syncCache(context.Background(), os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, "barecache:", err)
		os.Exit(1)
	}
	runtime.GC()
	fmt.Println("synced")
	select {} // hold the cache until the benchmark kills this process
}

// syncCache starts the Proxy informer and returns once it has synced; the
// informer goes on running with ctx.
func syncCache(ctx context.Context, kubeconfig string) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("loading %s: %w", kubeconfig, err)
	}
	scheme := k8sruntime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if err := crawlv1alpha1.AddToScheme(scheme); err != nil {
		return err
	}
	informers, err := cache.New(cfg, cache.Options{Scheme: scheme, DefaultTransform: cache.TransformStripManagedFields()})
	if err != nil {
		return fmt.Errorf("building the cache: %w", err)
	}
	if _, err := informers.GetInformer(ctx, &crawlv1alpha1.Proxy{}); err != nil {
		return fmt.Errorf("starting the Proxy informer: %w", err)
	}
	go func() { _ = informers.Start(ctx) }()
	if !informers.WaitForCacheSync(ctx) {
		return fmt.Errorf("the cache did not sync")
	}
	return nil
}
