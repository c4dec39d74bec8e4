// Command demo runs the whole operator on this machine, no Docker needed: a
// real API server, the operator binary, real Squid proxies and a local HTTPS
// probe target (the test/cluster harness). It applies a Managed and an
// External proxy and a small ProxyPool spread over three zones, waits until
// all of them serve, prints how to use the discovery API and scale the
// pool, and stays up until interrupted. Ctrl-C ends it, and make demo, with
// status 0. Run it with make demo.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/test/cluster"
	"github.com/example/egress-proxies-operator/test/squid"
)

const (
	discoveryAddr = "127.0.0.1:8090"
	demoPool      = "demo-pool"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run() error {
	defer takeTerminal()()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	dir, err := filepath.Abs("tmp/demo")
	if err != nil {
		return err
	}
	_ = os.RemoveAll(dir)

	fmt.Println("building the operator...")
	bin, err := cluster.BuildOperator(dir)
	if err != nil {
		return err
	}
	fmt.Println("starting the API server, the pod runner and the probe target...")
	c, err := cluster.Start(dir, cluster.Options{})
	if err != nil {
		return err
	}
	defer c.Stop()

	token := randomToken()
	if err := c.Env.Client.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: cluster.OperatorNamespace, Name: "discovery-token"},
		Data:       map[string][]byte{"token": []byte(token)},
	}); err != nil {
		return fmt.Errorf("creating the token Secret: %w", err)
	}
	op, err := c.StartOperator(bin, cluster.OperatorOptions{DiscoveryAddr: discoveryAddr, ProbeAddr: "127.0.0.1:8081"})
	if err != nil {
		return err
	}
	defer op.Stop()

	// The External proxy is a Squid the operator does not run.
	external, err := squid.StartProcess(squid.Config{Address: "127.0.0.3", Port: 3128}, filepath.Join(dir, "external-squid"))
	if err != nil {
		return err
	}
	defer external.Stop()

	proxies := []*crawlv1alpha1.Proxy{
		{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "proxy-kubernetes-sample"},
			Spec: crawlv1alpha1.ProxySpec{Mode: crawlv1alpha1.ModeManaged, Provider: cluster.ProviderName, Port: 3128,
				Attributes: map[string]string{"geo": "local"}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "proxy-external-sample"},
			Spec: crawlv1alpha1.ProxySpec{Mode: crawlv1alpha1.ModeExternal, Port: 3128,
				External: &crawlv1alpha1.ExternalEndpoint{Address: "127.0.0.3"}, Attributes: map[string]string{"geo": "local"}}},
	}
	for _, p := range proxies {
		if err := c.Env.Client.Create(ctx, p); err != nil {
			return fmt.Errorf("creating Proxy %s: %w", p.Name, err)
		}
	}
	pool := &crawlv1alpha1.ProxyPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: demoPool},
		Spec: crawlv1alpha1.ProxyPoolSpec{
			Replicas: ptr(int32(3)),
			Zones:    []string{"local-a", "local-b", "local-c"},
			Template: crawlv1alpha1.ProxyTemplate{Spec: crawlv1alpha1.ProxySpec{
				Mode: crawlv1alpha1.ModeManaged, Provider: cluster.ProviderName, Port: 3128,
				Attributes: map[string]string{"geo": "local"},
			}},
		},
	}
	if err := c.Env.Client.Create(ctx, pool); err != nil {
		return fmt.Errorf("creating ProxyPool %s: %w", pool.Name, err)
	}
	fmt.Println("waiting for both proxies and the pool's 3 members to be Ready and Healthy...")
	if err := waitServing(ctx, c.Env.Client, proxies, pool); err != nil {
		return fmt.Errorf("%w (operator log: %s)", err, op.Log)
	}

	kubectl := fmt.Sprintf("bin/k8s/*/kubectl --kubeconfig %s", c.Kubeconfig)
	fmt.Printf(`
Both proxies and the pool %[8]s (3 members, one per zone) are Ready and Healthy.

  kubeconfig: %[1]s
  token:      %[2]s
  operator log: %[3]s

  %[4]s get px,pxp,pods
  export TOKEN=%[2]s
  curl -s -H "Authorization: Bearer $TOKEN" 'http://%[5]s/v1/proxies?healthy=true'
  curl -s -H "Authorization: Bearer $TOKEN" -XPOST http://%[5]s/v1/leases -d '{"selector":{"geo":"local"},"ttlSeconds":300}'
  curl -s -H "Authorization: Bearer $TOKEN" -XPOST http://%[5]s/v1/leases -d '{"selector":{"pool":"%[8]s"},"ttlSeconds":300}'
  curl -s -x '<the lease's proxy.url, credentials included>' --cacert %[6]s %[7]s -o /dev/null -w '%%{http_code}\n'   # through the leased proxy
  curl -s -H "Authorization: Bearer $TOKEN" -XPOST http://%[5]s/v1/leases/<leaseID>/report -d '{"result":"rate_limited","target":"example.com"}'
  curl -si -H "Authorization: Bearer $TOKEN" -XDELETE http://%[5]s/v1/leases/<leaseID>

Scale the pool, and watch it spread over its zones:

  %[4]s scale pxp/%[8]s --replicas=5
  %[4]s get pxp %[8]s -w

Press Ctrl-C to stop everything.
`, c.Kubeconfig, token, op.Log, kubectl, discoveryAddr, c.Target.CAFile, c.Target.URL, demoPool)
	<-ctx.Done()
	fmt.Println("\nstopping...")
	return nil
}

// waitServing waits until every proxy is Ready and Healthy and the pool
// has all its members available.
func waitServing(ctx context.Context, c client.Client, proxies []*crawlv1alpha1.Proxy, pool *crawlv1alpha1.ProxyPool) error {
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		serving := 0
		for _, p := range proxies {
			var got crawlv1alpha1.Proxy
			if err := c.Get(ctx, client.ObjectKeyFromObject(p), &got); err == nil &&
				meta.IsStatusConditionTrue(got.Status.Conditions, crawlv1alpha1.ConditionReady) &&
				meta.IsStatusConditionTrue(got.Status.Conditions, crawlv1alpha1.ConditionHealthy) {
				serving++
			}
		}
		var got crawlv1alpha1.ProxyPool
		if err := c.Get(ctx, client.ObjectKeyFromObject(pool), &got); err == nil &&
			got.Status.ObservedGeneration == got.Generation && got.Status.AvailableReplicas == *pool.Spec.Replicas {
			serving++
		}
		if serving == len(proxies)+1 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return errors.New("the proxies and the pool did not serve within 2 minutes")
}

// takeTerminal makes the demo the terminal's foreground process group, so
// Ctrl-C interrupts the demo (and the processes it started) but not make:
// make then sees the demo exit 0 and exits 0 itself, instead of dying of
// the signal with its "Interrupt" error line. The returned func hands the
// terminal back. Without a terminal (CI, a pipe) it does nothing.
func takeTerminal() (restore func()) {
	fd := int(os.Stdin.Fd())
	previous, err := unix.IoctlGetInt(fd, unix.TIOCGPGRP)
	if err != nil {
		return func() {} // not a terminal
	}
	if err := syscall.Setpgid(0, 0); err != nil {
		return func() {}
	}
	// A background process group may take the terminal only with SIGTTOU
	// ignored, as shells do.
	signal.Ignore(syscall.SIGTTOU)
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPGRP, syscall.Getpgrp()); err != nil {
		return func() {}
	}
	return func() { _ = unix.IoctlSetPointerInt(fd, unix.TIOCSPGRP, previous) }
}

func ptr[T any](v T) *T { return &v }

func randomToken() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
