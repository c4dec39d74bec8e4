package cluster

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"golang.org/x/crypto/bcrypt"

	"github.com/example/egress-proxies-operator/providers/gcp/fakecompute"
)

// VMRunner plays the software on the fake Compute API's VMs: every RUNNING
// VM gets an in-process CONNECT proxy on its NAT address and port, which
// goes away with the VM, and checks credentials against the password file
// the provider put in the VM's metadata. Crash stops a VM's proxy while the
// VM stays up, as a Squid dying inside a VM would.
type VMRunner struct {
	fake *fakecompute.Server

	mu      sync.Mutex
	proxies map[string]*ConnectProxy // by VM address
	crashed map[string]bool
}

// NewVMRunner plays the VMs of fake; Run starts it.
func NewVMRunner(fake *fakecompute.Server) *VMRunner {
	return &VMRunner{fake: fake, proxies: map[string]*ConnectProxy{}, crashed: map[string]bool{}}
}

// Run follows the fake's VMs every 250ms until ctx ends.
func (r *VMRunner) Run(ctx context.Context) {
	for ctx.Err() == nil {
		r.sync()
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func (r *VMRunner) sync() {
	alive := map[string]bool{}
	for _, vm := range r.fake.Instances() {
		addr := VMAddr(vm.GetNetworkInterfaces(), vm.GetLabels()["crawl-port"])
		if vm.GetStatus() != "RUNNING" || addr == "" {
			continue
		}
		alive[addr] = true
		r.mu.Lock()
		_, running := r.proxies[addr]
		crashed := r.crashed[addr]
		r.mu.Unlock()
		if running || crashed {
			continue
		}
		p, err := StartAuthenticatingProxy(addr, passwordFileCheck(vm))
		if err != nil {
			fmt.Fprintf(os.Stderr, "vm runner: %v\n", err)
			continue
		}
		r.mu.Lock()
		r.proxies[addr] = p
		r.mu.Unlock()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for addr, p := range r.proxies {
		if !alive[addr] {
			p.Close()
			delete(r.proxies, addr)
		}
	}
	for addr := range r.crashed {
		if !alive[addr] {
			delete(r.crashed, addr)
		}
	}
}

// Crash stops the proxy of a random running VM and returns its address.
func (r *VMRunner) Crash(pick func(n int) int) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	addrs := make([]string, 0, len(r.proxies))
	for addr := range r.proxies {
		addrs = append(addrs, addr)
	}
	if len(addrs) == 0 {
		return ""
	}
	addr := addrs[pick(len(addrs))]
	r.proxies[addr].Close()
	delete(r.proxies, addr)
	r.crashed[addr] = true
	return addr
}

// Recover lets the next sync start a crashed VM's proxy again.
func (r *VMRunner) Recover(addr string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.crashed, addr)
}

// CloseAll stops every VM's proxy.
func (r *VMRunner) CloseAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for addr, p := range r.proxies {
		p.Close()
		delete(r.proxies, addr)
	}
}

// passwordFileCheck checks credentials against the password file the
// provider put in a VM's metadata, as the VM's Squid does.
func passwordFileCheck(vm *computepb.Instance) func(user, password string) bool {
	var line string
	for _, item := range vm.GetMetadata().GetItems() {
		if item.GetKey() == "egress-proxy-password-file" {
			line = strings.TrimSpace(item.GetValue())
		}
	}
	wantUser, hash, _ := strings.Cut(line, ":")
	// Squid checks a password once per credentialsttl, not per request;
	// so does this, or bcrypt would cost every crawler request 60ms of CPU.
	var verified sync.Map
	return func(user, password string) bool {
		if line == "" || user != wantUser {
			return false
		}
		if _, ok := verified.Load(password); ok {
			return true
		}
		if bcrypt.CompareHashAndPassword([]byte(hash), []byte(password)) != nil {
			return false
		}
		verified.Store(password, true)
		return true
	}
}

// VMAddr is where a VM's proxy listens: its external (NAT) address and the
// port the provider labelled it with.
func VMAddr(ifaces []*computepb.NetworkInterface, port string) string {
	for _, iface := range ifaces {
		for _, ac := range iface.GetAccessConfigs() {
			if ip := ac.GetNatIP(); ip != "" && port != "" {
				return net.JoinHostPort(ip, port)
			}
		}
	}
	return ""
}

// GCPProvider is the providers-config entry (for Options.ExtraProviders) of
// a gcp provider instance called name on the fake Compute API at endpoint:
// project and zone as given, the firewall open to loopback, where the VM
// runner's proxies listen.
func GCPProvider(name, project, zone, endpoint string) string {
	return fmt.Sprintf(`- name: %s
  type: gcp
  settings:
    project: %s
    zone: %s
    machineType: e2-small
    image: projects/debian-cloud/global/images/family/debian-12
    endpoint: %s
    withoutAuthentication: true
    requestTimeout: 5s
    firewall:
      sourceRanges: [127.0.0.0/8]
`, name, project, zone, endpoint)
}
