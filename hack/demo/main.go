// Command demo runs the whole operator on this machine, no Docker needed: a
// real API server, the operator binary, real Squid proxies and a local HTTPS
// probe target (the test/cluster harness). It applies a Managed and an
// External proxy, waits until both are Ready and Healthy, prints how to use
// the discovery API, and stays up until interrupted. Run it with make demo.
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

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/test/cluster"
	"github.com/example/egress-proxies-operator/test/squid"
)

const discoveryAddr = "127.0.0.1:8090"

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run() error {
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
	fmt.Println("waiting for both proxies to be Ready and Healthy...")
	if err := waitReady(ctx, c.Env.Client, proxies); err != nil {
		return fmt.Errorf("%w (operator log: %s)", err, op.Log)
	}

	kubectl := fmt.Sprintf("bin/k8s/*/kubectl --kubeconfig %s", c.Kubeconfig)
	fmt.Printf(`
Both proxies are Ready and Healthy.

  kubeconfig: %[1]s
  token:      %[2]s
  operator log: %[3]s

  %[4]s get px
  export TOKEN=%[2]s
  curl -s -H "Authorization: Bearer $TOKEN" 'http://%[5]s/v1/proxies?healthy=true'
  curl -s -H "Authorization: Bearer $TOKEN" -XPOST http://%[5]s/v1/leases -d '{"selector":{"geo":"local"},"ttlSeconds":300}'
  curl -s -x http://<proxy ip>:3128 --cacert %[6]s %[7]s -o /dev/null -w '%%{http_code}\n'   # through the leased proxy
  curl -s -H "Authorization: Bearer $TOKEN" -XPOST http://%[5]s/v1/leases/<leaseID>/report -d '{"result":"rate_limited","target":"example.com"}'
  curl -si -H "Authorization: Bearer $TOKEN" -XDELETE http://%[5]s/v1/leases/<leaseID>

Press Ctrl-C to stop everything.
`, c.Kubeconfig, token, op.Log, kubectl, discoveryAddr, c.Target.CAFile, c.Target.URL)
	<-ctx.Done()
	fmt.Println("\nstopping...")
	return nil
}

func waitReady(ctx context.Context, c client.Client, proxies []*crawlv1alpha1.Proxy) error {
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		ready := 0
		for _, p := range proxies {
			var got crawlv1alpha1.Proxy
			if err := c.Get(ctx, client.ObjectKeyFromObject(p), &got); err == nil &&
				meta.IsStatusConditionTrue(got.Status.Conditions, crawlv1alpha1.ConditionReady) {
				ready++
			}
		}
		if ready == len(proxies) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return errors.New("the proxies did not become Ready and Healthy within 2 minutes")
}

func randomToken() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
