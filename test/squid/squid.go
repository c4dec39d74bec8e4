// Package squid runs real Squid processes (Debian's squid package) on
// loopback addresses for tests, benchmarks and the local demo, each with its
// own config, pid file and logs, and stops them when asked or when the test
// ends. It is test support only; production code must never import it.
package squid

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// InstallHint is what to run when squid is missing.
const InstallHint = "install Debian's squid package: sudo apt-get install -y squid (.ci/run does this)"

// Binary finds squid, which Debian installs in /usr/sbin (often not on a
// non-root PATH).
func Binary() (string, error) {
	if path, err := exec.LookPath("squid"); err == nil {
		return path, nil
	}
	if _, err := os.Stat("/usr/sbin/squid"); err == nil {
		return "/usr/sbin/squid", nil
	}
	return "", fmt.Errorf("squid not found on PATH or in /usr/sbin: %s", InstallHint)
}

// Config describes one Squid.
type Config struct {
	// Address and Port it listens on; Address should be a loopback address.
	Address string
	Port    int
	// Rules are the access rules (acl and http_access lines). The default
	// allows CONNECT to any port from localhost, and nothing else.
	Rules string
	// ConfigText, when set, is the whole squid.conf (Rules are then unused);
	// the process settings (pid file, logs) are still appended.
	ConfigText string
}

// DefaultRules let localhost CONNECT anywhere: for probing local targets,
// whatever port they listen on.
const DefaultRules = `acl CONNECT method CONNECT
http_access allow localhost
http_access deny all
`

// DenyConnectRules refuse every CONNECT with 403.
const DenyConnectRules = `acl CONNECT method CONNECT
http_access deny CONNECT
http_access allow localhost
http_access deny all
`

// Squid is a running squid process.
type Squid struct {
	// Addr is host:port.
	Addr string
	cmd  *exec.Cmd
	dir  string
	done chan struct{}
	err  error
}

var instances atomic.Int64

// Start starts squid and waits until it accepts connections; it is stopped
// when the test ends.
func Start(t testing.TB, cfg Config) *Squid {
	t.Helper()
	s, err := StartProcess(cfg, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Stop() })
	return s
}

// StartProcess starts squid with its files in dir and waits until it
// accepts connections. The caller must Stop it.
func StartProcess(cfg Config, dir string) (*Squid, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating squid's directory: %w", err)
	}
	// Started as root, squid drops to the proxy user: its directory must be
	// that user's.
	if os.Geteuid() == 0 {
		if err := chownToProxyUser(dir); err != nil {
			return nil, err
		}
	}
	addr := net.JoinHostPort(cfg.Address, strconv.Itoa(cfg.Port))
	conf := cfg.ConfigText
	if conf == "" {
		rules := cfg.Rules
		if rules == "" {
			rules = DefaultRules
		}
		conf = fmt.Sprintf("http_port %s\n%s", addr, rules)
	}
	conf += fmt.Sprintf(`
pid_filename %[1]s/squid.pid
cache deny all
cache_store_log none
pinger_enable off
coredump_dir %[1]s
access_log none
cache_log %[1]s/cache.log
logfile_rotate 0
shutdown_lifetime 0 seconds
`, dir)
	confPath := filepath.Join(dir, "squid.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		return nil, fmt.Errorf("writing squid.conf: %w", err)
	}
	// A service name of its own keeps its shared memory apart from other
	// squids running at the same time.
	name := fmt.Sprintf("t%dn%d", os.Getpid(), instances.Add(1)) // squid allows [A-Za-z0-9] only
	cmd := exec.Command(bin, "-N", "-n", name, "-f", confPath)
	cmd.Dir = dir
	stderr, err := os.Create(filepath.Join(dir, "stderr.log"))
	if err != nil {
		return nil, fmt.Errorf("creating squid's stderr log: %w", err)
	}
	defer stderr.Close()
	cmd.Stdout, cmd.Stderr = stderr, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting squid: %w", err)
	}
	s := &Squid{Addr: addr, cmd: cmd, dir: dir, done: make(chan struct{})}
	go func() { s.err = cmd.Wait(); close(s.done) }()

	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-s.done:
			return nil, fmt.Errorf("squid exited at startup: %w: %s", s.err, s.log())
		default:
		}
		conn, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			_ = conn.Close()
			return s, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.Stop()
	return nil, fmt.Errorf("squid did not listen on %s within 15s: %s", addr, s.log())
}

// Stop kills squid and waits for it to exit; calling it again is harmless.
func (s *Squid) Stop() {
	select {
	case <-s.done:
		return
	default:
	}
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	<-s.done
}

// Running says whether the process is still alive.
func (s *Squid) Running() bool {
	select {
	case <-s.done:
		return false
	default:
		return true
	}
}

func (s *Squid) log() string {
	stderr, _ := os.ReadFile(filepath.Join(s.dir, "stderr.log"))
	cacheLog, _ := os.ReadFile(filepath.Join(s.dir, "cache.log"))
	data := slices.Concat(stderr, cacheLog)
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) > 10 {
		lines = lines[len(lines)-10:]
	}
	return strings.Join(lines, "\n")
}

// ChownForSquid gives dir to the user squid runs as when started as root
// (the proxy user); otherwise it does nothing.
func ChownForSquid(dir string) error {
	if os.Geteuid() != 0 {
		return nil
	}
	return chownToProxyUser(dir)
}

func chownToProxyUser(dir string) error {
	u, err := user.Lookup("proxy")
	if err != nil {
		return fmt.Errorf("squid runs as the proxy user, which does not exist (%w): %s", err, InstallHint)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	// Go's TempDir parents are root-only; squid must be able to reach dir.
	for d := dir; d != "/" && d != "."; d = filepath.Dir(d) {
		if info, err := os.Stat(d); err == nil && info.Mode().Perm()&0o001 == 0 {
			_ = os.Chmod(d, info.Mode().Perm()|0o011)
		}
		if strings.Count(d, "/") <= 2 {
			break
		}
	}
	if err := os.Chown(dir, uid, gid); err != nil {
		return fmt.Errorf("giving %s to the proxy user: %w", dir, err)
	}
	return nil
}
