package cluster

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"

	"github.com/example/egress-proxies-operator/providers/gcp/fakecompute"
)

// VMRunner plays the software on the fake Compute API's VMs: every RUNNING
// VM gets an in-process CONNECT proxy on its NAT address and port, which
// goes away with the VM, and checks per-lease credentials with the lease
// key the provider put in the VM's metadata. Crash stops a VM's proxy while the
// VM stays up, as a Squid dying inside a VM would.
type VMRunner struct {
	fake *fakecompute.Server

	mu      sync.Mutex
	proxies map[string]*ConnectProxy // by VM address
	// owner is the VM (its id) each address's proxy plays: a new VM on a
	// reused address gets a proxy of its own, with its own lease key.
	owner   map[string]uint64
	crashed map[string]bool
}

// NewVMRunner plays the VMs of fake; Run starts it.
func NewVMRunner(fake *fakecompute.Server) *VMRunner {
	return &VMRunner{fake: fake, proxies: map[string]*ConnectProxy{}, owner: map[string]uint64{}, crashed: map[string]bool{}}
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
		if p, ok := r.proxies[addr]; ok && r.owner[addr] != vm.GetId() {
			// Another VM on the address: the last one's proxy goes.
			p.Close()
			delete(r.proxies, addr)
			delete(r.crashed, addr)
		}
		_, running := r.proxies[addr]
		crashed := r.crashed[addr]
		r.mu.Unlock()
		if running || crashed {
			continue
		}
		p, err := StartAuthenticatingProxy(addr, leaseKeyCheck(vm))
		if err != nil {
			fmt.Fprintf(os.Stderr, "vm runner: %v\n", err)
			continue
		}
		r.mu.Lock()
		r.proxies[addr], r.owner[addr] = p, vm.GetId()
		r.mu.Unlock()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for addr, p := range r.proxies {
		if !alive[addr] {
			p.Close()
			delete(r.proxies, addr)
			delete(r.owner, addr)
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

// leaseKeyCheck checks credentials as a VM's lease-auth helper does
// (squidconf.LeaseAuthHelper), with the lease key the provider put in the
// VM's metadata: "<subject>~<notAfter>" signed with the key and not yet
// expired, unless revoked; "revoke~<notAfter>~<id>.<id>..." signed the same
// way revokes those ids and is refused.
func leaseKeyCheck(vm *computepb.Instance) func(user, password string) bool {
	var key []byte
	for _, item := range vm.GetMetadata().GetItems() {
		if item.GetKey() == "egress-proxy-lease-key" {
			key, _ = hex.DecodeString(strings.TrimSpace(item.GetValue()))
		}
	}
	var mu sync.Mutex
	revoked := map[string]int64{}
	return func(user, password string) bool {
		if len(key) == 0 {
			return false
		}
		mac := hmac.New(sha256.New, key)
		mac.Write([]byte(user))
		if !hmac.Equal([]byte(password), []byte(base64.RawURLEncoding.EncodeToString(mac.Sum(nil)))) {
			return false
		}
		now := time.Now().Unix()
		parts := strings.Split(user, "~")
		mu.Lock()
		defer mu.Unlock()
		switch {
		case len(parts) == 3 && parts[0] == "revoke":
			until, err := strconv.ParseInt(parts[1], 10, 64)
			if err == nil && until >= now {
				for _, id := range strings.Split(parts[2], ".") {
					revoked[id] = until
				}
			}
			return false
		case len(parts) == 2:
			notAfter, err := strconv.ParseInt(parts[1], 10, 64)
			if until, ok := revoked[parts[0]]; ok && until >= now {
				return false
			}
			return err == nil && notAfter >= now
		}
		return false
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
