// Package redisserver runs real Redis servers (Debian's redis-server) on loopback
// for tests, benchmarks and the soak: no persistence, a port of their own,
// stopped when the test ends. A server can be stopped and started again on
// the same port, to test what discovery does while Redis is away. It is
// test support only; production code must never import it.
package redisserver

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// InstallHint is what to run when redis-server is missing.
const InstallHint = "install Debian's redis-server package: sudo apt-get install -y redis-server (.ci/run does this)"

// Binary finds redis-server.
func Binary() (string, error) {
	if path, err := exec.LookPath("redis-server"); err == nil {
		return path, nil
	}
	if _, err := os.Stat("/usr/bin/redis-server"); err == nil {
		return "/usr/bin/redis-server", nil
	}
	return "", fmt.Errorf("redis-server not found on PATH: %s", InstallHint)
}

// Server is a redis-server process on a loopback address.
type Server struct {
	// Addr is host:port; it stays the same across Stop and Start.
	Addr string
	// Password, when set, is required of clients (requirepass).
	Password string
	// CertFile and KeyFile, when set, make the server speak TLS only (no
	// client certificates asked for).
	CertFile, KeyFile string
	// ReplicaOf, when set, makes the server a replica of that primary
	// (host:port).
	ReplicaOf string
	// Sentinel, when set, makes the process a Sentinel watching
	// Sentinel.Primary under Sentinel.Name (redis-server --sentinel).
	Sentinel *SentinelConfig
	dir      string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// Start starts a redis-server on a free loopback port and waits until it
// answers; it is killed when the test ends.
func Start(t testing.TB, password string) *Server {
	t.Helper()
	s, err := StartProcess(t.TempDir(), password)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// StartProcess starts a redis-server with its files in dir. The caller must
// Stop it.
func StartProcess(dir, password string) (*Server, error) {
	return (&Server{Password: password}).startIn(dir)
}

// StartTLS is Start for a server that speaks TLS only, with the given
// certificate and key files.
func StartTLS(t testing.TB, certFile, keyFile string) *Server {
	t.Helper()
	s, err := (&Server{CertFile: certFile, KeyFile: keyFile}).startIn(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

func (s *Server) startIn(dir string) (*Server, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("finding a free port: %w", err)
	}
	s.Addr, s.dir = l.Addr().String(), dir
	_ = l.Close()
	return s, s.Start()
}

// Start (re)starts the server on its address, empty, and waits until it
// answers PING.
func (s *Server) Start() error {
	bin, err := Binary()
	if err != nil {
		return err
	}
	host, port, _ := net.SplitHostPort(s.Addr)
	args := []string{"--bind", host, "--port", port, "--save", "", "--appendonly", "no",
		"--dir", s.dir, "--logfile", filepath.Join(s.dir, "redis.log"), "--daemonize", "no"}
	if s.ReplicaOf != "" {
		primaryHost, primaryPort, _ := net.SplitHostPort(s.ReplicaOf)
		args = append(args, "--replicaof", primaryHost, primaryPort)
	}
	if s.Sentinel != nil {
		// A Sentinel rewrites its configuration file: it needs one.
		conf := filepath.Join(s.dir, "sentinel.conf")
		primaryHost, primaryPort, _ := net.SplitHostPort(s.Sentinel.Primary)
		text := fmt.Sprintf("sentinel monitor %s %s %s 1\nsentinel down-after-milliseconds %s %d\nsentinel failover-timeout %s %d\n",
			s.Sentinel.Name, primaryHost, primaryPort, s.Sentinel.Name, s.Sentinel.DownAfter.Milliseconds(), s.Sentinel.Name, (4 * s.Sentinel.DownAfter).Milliseconds())
		if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
			return fmt.Errorf("writing the Sentinel's configuration: %w", err)
		}
		args = append([]string{conf, "--sentinel"}, args[:4]...)
		args = append(args, "--dir", s.dir, "--logfile", filepath.Join(s.dir, "redis.log"), "--daemonize", "no")
	}
	if s.CertFile != "" {
		args = append(args, "--port", "0", "--tls-port", port, "--tls-cert-file", s.CertFile, "--tls-key-file", s.KeyFile, "--tls-auth-clients", "no")
	}
	if s.Password != "" {
		args = append(args, "--requirepass", s.Password)
	}
	cmd := exec.Command(bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting redis-server: %w", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()

	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-done:
			return fmt.Errorf("redis-server exited at startup: %s", s.log())
		default:
		}
		if s.ping() == nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.Stop()
	return fmt.Errorf("redis-server did not answer on %s within 15s: %s", s.Addr, s.log())
}

// SentinelConfig is what a Sentinel watches.
type SentinelConfig struct {
	// Name is the primary's name (the failover client's MasterName);
	// Primary its first address. DownAfter is how long it must not answer
	// before the Sentinel fails it over (a quorum of one: this Sentinel).
	Name, Primary string
	DownAfter     time.Duration
}

// StartReplica starts a replica of primary (host:port), answering once it
// is up; it is killed when the test ends.
func StartReplica(t testing.TB, primary string) *Server {
	t.Helper()
	s, err := (&Server{ReplicaOf: primary}).startIn(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// StartSentinel starts a Sentinel watching primary under name, which fails
// it over once it has not answered for downAfter; it is killed when the
// test ends.
func StartSentinel(t testing.TB, name, primary string, downAfter time.Duration) *Server {
	t.Helper()
	s, err := (&Server{Sentinel: &SentinelConfig{Name: name, Primary: primary, DownAfter: downAfter}}).startIn(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// Stop kills the server (SIGKILL: everything in it is lost) and waits for
// it to exit; calling it again is harmless.
func (s *Server) Stop() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	select {
	case <-done:
		return
	default:
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-done
}

// Pause stops the server without closing its socket (SIGSTOP): clients
// connect and wait, as with a Redis that hangs. Resume continues it.
func (s *Server) Pause() { s.signal(syscall.SIGSTOP) }

// Resume continues a paused server.
func (s *Server) Resume() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		_ = syscall.Kill(-s.cmd.Process.Pid, sig)
	}
}

// ping speaks just enough RESP to know the server is up.
func (s *Server) ping() error {
	var conn net.Conn
	var err error
	if s.CertFile != "" {
		// The harness only asks whether it is up: the test's client checks
		// the certificate.
		conn, err = tls.DialWithDialer(&net.Dialer{Timeout: 200 * time.Millisecond}, "tcp", s.Addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // a liveness ping on loopback
	} else {
		conn, err = net.DialTimeout("tcp", s.Addr, 200*time.Millisecond)
	}
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(time.Second))
	cmd := "*1\r\n$4\r\nPING\r\n"
	if s.Password != "" {
		cmd = fmt.Sprintf("*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n", len(s.Password), s.Password) + cmd
	}
	if _, err := conn.Write([]byte(cmd)); err != nil {
		return err
	}
	buf := make([]byte, 64)
	n, err := conn.Read(buf)
	if err != nil {
		return err
	}
	reply := string(buf[:n])
	if s.Password != "" && strings.HasPrefix(reply, "+OK\r\n") && !strings.Contains(reply, "PONG") {
		n, err = conn.Read(buf)
		if err != nil {
			return err
		}
		reply = string(buf[:n])
	}
	if !strings.Contains(reply, "+PONG") {
		return errors.New("redis answered " + strconv.Quote(reply))
	}
	return nil
}

func (s *Server) log() string {
	data, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) > 10 {
		lines = lines[len(lines)-10:]
	}
	return strings.Join(lines, "\n")
}
