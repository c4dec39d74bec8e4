package gateway_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/example/egress-proxies-operator/gateway"
	"github.com/example/egress-proxies-operator/test/squid"
)

// blobServer is a target that sends size bytes to whoever connects, then
// closes: a download with nothing but bytes in it.
func blobServer(b *testing.B, ip string, size int) string {
	b.Helper()
	lis, err := net.Listen("tcp", ip+":0")
	require.NoError(b, err)
	b.Cleanup(func() { _ = lis.Close() })
	chunk := make([]byte, 64<<10)
	for i := range chunk {
		chunk[i] = byte(i)
	}
	go func() {
		for {
			conn, err := lis.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				for left := size; left > 0; {
					n, err := conn.Write(chunk[:min(left, len(chunk))])
					if err != nil {
						return
					}
					left -= n
				}
			}()
		}
	}()
	return lis.Addr().String()
}

// tunnelTo opens a CONNECT to target through proxy (with auth, or none)
// and returns the connection, past the 200.
func tunnelTo(proxy, target, auth string) (net.Conn, *bufio.Reader, error) {
	conn, err := net.Dial("tcp", proxy)
	if err != nil {
		return nil, nil, err
	}
	req := "CONNECT " + target + " HTTP/1.1\r\nHost: " + target + "\r\n"
	if auth != "" {
		req += "Proxy-Authorization: " + auth + "\r\n"
	}
	if _, err := io.WriteString(conn, req+"\r\n"); err != nil {
		_ = conn.Close()
		return nil, nil, err
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		_ = conn.Close()
		return nil, nil, err
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_ = conn.Close()
		return nil, nil, fmt.Errorf("CONNECT %s via %s: %s", target, proxy, resp.Status)
	}
	return conn, br, nil
}

// readAll reads a download to its end in large reads, as a crawler's
// client would, so the figures measure the proxies rather than the bench.
func readAll(conn net.Conn, br *bufio.Reader) (int64, error) {
	n := int64(br.Buffered())
	if _, err := br.Discard(br.Buffered()); err != nil {
		return n, err
	}
	buf := make([]byte, 256<<10)
	for {
		m, err := conn.Read(buf)
		n += int64(m)
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

// drive runs total jobs on workers goroutines and returns the time taken.
func drive(b *testing.B, workers, total int, job func(i int) error) time.Duration {
	b.Helper()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	start := time.Now()
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= total {
					return
				}
				if err := job(i); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	close(errs)
	for err := range errs {
		require.NoError(b, err)
	}
	return took
}

// BenchmarkGatewayThroughput: the same clients download through the gateway
// and straight through the upstream Squids (round robin), in large
// downloads (bytes/s; one client, then eight at once) and tiny ones
// (tunnels/s). The gateway's figures are gateway_*, the direct ones bare_*.
func BenchmarkGatewayThroughput(b *testing.B) {
	f := newFixture(b, gateway.Options{})
	squids := make([]string, 0, len(f.proxies))
	for _, id := range f.proxies {
		squids = append(squids, f.squids[id].Addr)
	}
	auth := basic("", token)
	const workers = 8
	b.ResetTimer()
	for range b.N {
		// Bytes: downloads of 16 MiB each way.
		const size, downloads = 16 << 20, 48
		big := blobServer(b, "127.0.0.84", size)
		download := func(size int64, via func(i int) (net.Conn, *bufio.Reader, error)) func(i int) error {
			return func(i int) error {
				conn, br, err := via(i)
				if err != nil {
					return err
				}
				defer conn.Close()
				n, err := readAll(conn, br)
				if err == nil && n != size {
					err = fmt.Errorf("download %d got %d bytes of %d", i, n, size)
				}
				return err
			}
		}
		viaGateway := func(target string) func(int) (net.Conn, *bufio.Reader, error) {
			return func(int) (net.Conn, *bufio.Reader, error) { return tunnelTo(f.gwAddr, target, auth) }
		}
		viaSquid := func(target string) func(int) (net.Conn, *bufio.Reader, error) {
			return func(i int) (net.Conn, *bufio.Reader, error) { return tunnelTo(squids[i%len(squids)], target, "") }
		}
		// One client at a time: what one crawler's flow sees.
		bareOne := drive(b, 1, downloads/4, download(size, viaSquid(big)))
		gwOne := drive(b, 1, downloads/4, download(size, viaGateway(big)))
		mb := float64(size*downloads/4) / (1 << 20)
		b.ReportMetric(mb/gwOne.Seconds(), "gateway_1client_MiB/s")
		b.ReportMetric(mb/bareOne.Seconds(), "bare_1client_MiB/s")
		// Eight at once: on a small machine, every process here (clients,
		// target, gateway, Squids) shares its cores, and the gateway's
		// extra hop competes with the rest.
		bareBytes := drive(b, workers, downloads, download(size, viaSquid(big)))
		gwBytes := drive(b, workers, downloads, download(size, viaGateway(big)))
		mb = float64(size*downloads) / (1 << 20)
		b.ReportMetric(mb/gwBytes.Seconds(), "gateway_8clients_MiB/s")
		b.ReportMetric(mb/bareBytes.Seconds(), "bare_8clients_MiB/s")

		// Tunnels: 2,000 of 1 KiB each way.
		const tunnels = 2000
		small := blobServer(b, "127.0.0.85", 1<<10)
		bareTunnels := drive(b, 2*workers, tunnels, download(1<<10, viaSquid(small)))
		gwTunnels := drive(b, 2*workers, tunnels, download(1<<10, viaGateway(small)))
		b.ReportMetric(tunnels/gwTunnels.Seconds(), "gateway_tunnels/s")
		b.ReportMetric(tunnels/bareTunnels.Seconds(), "bare_tunnels/s")
	}
	b.ReportMetric(0, "ns/op")
}

// BenchmarkGatewayMemoryAt5000Tunnels opens 5,000 tunnels through the
// gateway to an idle target (a Squid of its own, which holds each
// connection waiting for a request) and measures what the process holds
// for them: Go heap and goroutine stacks, after a GC, beside the same
// before. The bench's own client sockets are in the figure too (a few
// hundred bytes each).
func BenchmarkGatewayMemoryAt5000Tunnels(b *testing.B) {
	f := newFixture(b, gateway.Options{})
	idle := squid.Start(b, squid.Config{Address: "127.0.0.86", Port: 3128})
	auth := basic("", token)
	const tunnels = 5000
	b.ResetTimer()
	for range b.N {
		held := func() uint64 {
			runtime.GC()
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			return m.HeapInuse + m.StackInuse
		}
		before := held()
		conns := make([]net.Conn, tunnels)
		took := drive(b, 16, tunnels, func(i int) error {
			conn, _, err := tunnelTo(f.gwAddr, idle.Addr, auth)
			conns[i] = conn
			return err
		})
		require.Equal(b, tunnels, f.gw.Open(), "every tunnel is open at the gateway")
		after := held()
		b.ReportMetric(float64(after-before)/(1<<20), "gateway_MiB_at_5000_tunnels")
		b.ReportMetric(float64(after-before)/tunnels/(1<<10), "gateway_KiB/tunnel")
		b.ReportMetric(tunnels/took.Seconds(), "gateway_opened_tunnels/s")
		for _, c := range conns {
			_ = c.Close()
		}
		require.Eventually(b, func() bool { return f.gw.Open() == 0 }, 30*time.Second, 50*time.Millisecond)
	}
	b.ReportMetric(0, "ns/op")
}

// BenchmarkGatewaySessions: tunnels per second through the gateway, one
// session per client, three clients (one per upstream, so each exclusive
// session holds one): soft sessions as the baseline (bare_), then strict
// sessions, rotation without a session, and exclusive holds (last: they
// keep their proxies while their sessions live), each over the same 1 KiB
// downloads in the same run.
func BenchmarkGatewaySessions(b *testing.B) {
	for range b.N {
		f := newFixture(b, gateway.Options{})
		small := blobServer(b, "127.0.0.85", 1<<10)
		const tunnels, clients = 1500, 3
		pass := func(username func(client int) string) float64 {
			// The last pass's tunnels end (and free their proxies) first.
			require.Eventually(b, func() bool { return f.gw.Open() == 0 }, 10*time.Second, 10*time.Millisecond)
			took := drive(b, clients, tunnels, func(i int) error {
				conn, br, err := tunnelTo(f.gwAddr, small, basic(username(i%clients), token))
				if err != nil {
					return err
				}
				defer conn.Close()
				n, err := readAll(conn, br)
				if err == nil && n != 1<<10 {
					err = fmt.Errorf("tunnel %d got %d bytes", i, n)
				}
				return err
			})
			return tunnels / took.Seconds()
		}
		b.ReportMetric(pass(func(c int) string { return fmt.Sprintf("session-soft%d", c) }), "bare_tunnels/s")
		b.ReportMetric(pass(func(c int) string { return fmt.Sprintf("session-strict%d-strict", c) }), "strict_tunnels/s")
		b.ReportMetric(pass(func(int) string { return "" }), "rotating_tunnels/s")
		b.ReportMetric(pass(func(c int) string { return fmt.Sprintf("session-excl%d-strict-exclusive", c) }), "exclusive_tunnels/s")
	}
	b.ReportMetric(0, "ns/op")
}
