// Command demo runs the whole operator on this machine, no Docker needed: a
// real API server, the operator binary, real Squid proxies and a local HTTPS
// probe target (the test/cluster harness), with the rotating gateway on and
// two simulated sites (test/simweb) that rate-limit and ban per exit IP. It
// applies a Managed and an External proxy, a small ProxyPool spread over
// three zones and a CrawlTarget for one site, waits until all of them
// serve, prints how to use the discovery API, the gateway and its
// politeness, and how to scale the pool, and stays up until interrupted.
// Ctrl-C ends it, and make demo, with status 0. Run it with make demo.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/test/cluster"
	"github.com/example/egress-proxies-operator/test/simweb"
	"github.com/example/egress-proxies-operator/test/squid"
)

const (
	discoveryAddr = "127.0.0.1:8090"
	gatewayAddr   = "127.0.0.1:3128"
	demoPool      = "demo-pool"
	// The simulated sites: shop over HTTPS (Squid lets CONNECT reach 443
	// only), news over plain HTTP (port 80), each on an address of its own.
	shopIP = "127.0.70.1"
	newsIP = "127.0.70.2"
)

// siteRules are both sites' anti-bot rules: 2 requests a second per exit
// IP after a burst of 4, 2 at once, and 5 violations ban the IP for 10
// minutes.
var siteRules = simweb.Rules{RatePerSecond: 2, Burst: 4, MaxConcurrent: 2, BanAfter: 5,
	BanWindow: simweb.Duration(time.Minute), BanFor: simweb.Duration(10 * time.Minute), Latency: simweb.Duration(20 * time.Millisecond)}

func main() {
	// Ctrl-C while it starts is a stop too, not a failure.
	if err := run(); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run() error {
	// The demo speaks for itself; the control plane's library logs are not
	// its to print.
	logf.SetLogger(logr.Discard())
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
	op, err := c.StartOperator(bin, cluster.OperatorOptions{DiscoveryAddr: discoveryAddr, ProbeAddr: "127.0.0.1:8081",
		ExtraArgs: []string{"--gateway-bind-address=" + gatewayAddr}})
	if err != nil {
		return err
	}
	defer op.Stop()

	// The External proxy is a Squid the operator does not run.
	external, err := squid.StartProcess(squid.Config{Address: "127.0.0.3", Port: 3128,
		Rules: squid.DefaultRules + "tcp_outgoing_address 127.0.0.3\n"}, filepath.Join(dir, "external-squid"))
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
	shop, err := simweb.StartOn(shopIP+":443", true, siteRules)
	if err != nil {
		return fmt.Errorf("the shop site needs port 443 (root or CAP_NET_BIND_SERVICE): %w", err)
	}
	defer shop.Close()
	news, err := simweb.StartOn(newsIP+":80", false, siteRules)
	if err != nil {
		return fmt.Errorf("the news site needs port 80 (root or CAP_NET_BIND_SERVICE): %w", err)
	}
	defer news.Close()
	shopCA := filepath.Join(dir, "shop-ca.pem")
	if err := os.WriteFile(shopCA, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: shop.Certificate().Raw}), 0o644); err != nil {
		return err
	}
	// The shop's published rules, as a crawler team's CrawlTarget; the news
	// site has none, so the fleet learns its pace from its 429s.
	if err := c.Env.Client.Create(ctx, &crawlv1alpha1.CrawlTarget{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "shop"},
		Spec: crawlv1alpha1.CrawlTargetSpec{Host: shopIP, RequestsPerInterval: 2, Interval: metav1.Duration{Duration: time.Second},
			Burst: ptr(int32(4)), MaxConcurrentPerIP: ptr(int32(2))},
	}); err != nil {
		return fmt.Errorf("creating the shop's CrawlTarget: %w", err)
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

The rotating gateway (one proxy URL; the username is a session name) and two
simulated sites that allow each exit IP 2 requests a second (4 at once) and
ban it after 5 violations. The shop has a CrawlTarget with those rules; the
news site has none:

  curl -s -x http://demo:$TOKEN@%[9]s --cacert %[10]s https://%[11]s/page/1
  %[4]s get crawltargets

A strict session in the providers' grammar: one exit IP for 10 minutes, or
a 502 whose Proxy-Status says why; every CONNECT reply names the proxy and
the exit IP:

  curl -sv -x http://session-demo1-sesstime-10-strict:$TOKEN@%[9]s --cacert %[10]s https://%[11]s/page/1 2>&1 | grep -i '< \(x-egress\|proxy-status\)'

Politeness at work: 40 requests at once to the shop through the gateway.
The gateway holds each until an IP's pace allows it (every answer is a 200,
spread over a few seconds), or answers 429 with Retry-After and Proxy-Status
when none will within 5s; the shop never sees a request over its limit:

  for i in $(seq 40); do curl -s -o /dev/null -w '%%{http_code} %%{time_total}s\n' -x http://demo:$TOKEN@%[9]s --cacert %[10]s https://%[11]s/page/$i & done; wait
  curl -s -H "Authorization: Bearer $TOKEN" http://%[5]s/v1/targets/%[11]s

The same at the news site, which has no CrawlTarget: its first 429s (seen by
the gateway on plain HTTP) teach the fleet its pace, shown as "learned":

  for i in $(seq 40); do curl -s -o /dev/null -w '%%{http_code}\n' -x http://demo:$TOKEN@%[9]s http://%[12]s/page/$i & done; wait
  curl -s -H "Authorization: Bearer $TOKEN" http://%[5]s/v1/targets/%[12]s

Scale the pool, and watch it spread over its zones:

  %[4]s scale pxp/%[8]s --replicas=5
  %[4]s get pxp %[8]s -w

Press Ctrl-C to stop everything.
`, c.Kubeconfig, token, op.Log, kubectl, discoveryAddr, c.Target.CAFile, c.Target.URL, demoPool, gatewayAddr, shopCA, shopIP, newsIP)
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
