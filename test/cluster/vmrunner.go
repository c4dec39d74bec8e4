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

	"github.com/example/egress-proxies-operator/providers/aws/fakeec2"
	"github.com/example/egress-proxies-operator/providers/gcp/fakecompute"
)

// VMRunner plays the software on a fake cloud's VMs: every running VM gets
// an in-process CONNECT proxy on its public address and port, which goes
// away with the VM, and checks per-lease credentials with the lease key the
// provider gave the VM. Crash stops a VM's proxy while the VM stays up, as
// a Squid dying inside a VM would.
type VMRunner struct {
	machines func() []machine

	mu      sync.Mutex
	proxies map[string]*ConnectProxy // by VM address
	// owner is the VM (its id) each address's proxy plays: a new VM on a
	// reused address gets a proxy of its own, with its own lease key.
	owner   map[string]string
	crashed map[string]bool
}

// machine is one running VM as a runner plays it: its id, where its proxy
// listens, and how to read its lease key (only when its proxy starts: a
// sync of thousands of VMs must not parse each one's user-data).
type machine struct {
	id, addr string
	key      func() []byte
}

// NewVMRunner plays the VMs of the fake Compute API; Run starts it.
func NewVMRunner(fake *fakecompute.Server) *VMRunner {
	return newRunner(func() []machine {
		var running []machine
		for _, vm := range fake.Instances() {
			addr := VMAddr(vm.GetNetworkInterfaces(), vm.GetLabels()["crawl-port"])
			if vm.GetStatus() != "RUNNING" || addr == "" {
				continue
			}
			running = append(running, machine{id: strconv.FormatUint(vm.GetId(), 10), addr: addr, key: func() []byte { return secretLeaseKey(fake, vm) }})
		}
		return running
	})
}

// NewEC2Runner plays the instances of the fake EC2 API: the proxy listens
// on the public IP and the port the provider tagged the instance with, and
// takes its lease key from the Parameter Store parameter the instance is
// tagged with, as the instance's fetcher does.
func NewEC2Runner(fake *fakeec2.Server) *VMRunner {
	return newRunner(func() []machine {
		var running []machine
		for _, in := range fake.Instances() {
			port := in.Tags["crawl.example.com/port"]
			if in.State != fakeec2.StateRunning || in.PublicIP == "" || port == "" {
				continue
			}
			parameter := in.Tags["crawl.example.com/lease-key-parameter"]
			running = append(running, machine{id: in.ID, addr: net.JoinHostPort(in.PublicIP, port), key: func() []byte {
				key, _ := fake.Parameter(parameter)
				return decodeKey(key)
			}})
		}
		return running
	})
}

func newRunner(machines func() []machine) *VMRunner {
	return &VMRunner{machines: machines, proxies: map[string]*ConnectProxy{}, owner: map[string]string{}, crashed: map[string]bool{}}
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
	for _, vm := range r.machines() {
		alive[vm.addr] = true
		r.mu.Lock()
		if p, ok := r.proxies[vm.addr]; ok && r.owner[vm.addr] != vm.id {
			// Another VM on the address: the last one's proxy goes.
			p.Close()
			delete(r.proxies, vm.addr)
			delete(r.crashed, vm.addr)
		}
		_, running := r.proxies[vm.addr]
		crashed := r.crashed[vm.addr]
		r.mu.Unlock()
		if running || crashed {
			continue
		}
		p, err := StartAuthenticatingProxy(vm.addr, leaseKeyCheck(vm.key()))
		if err != nil {
			fmt.Fprintf(os.Stderr, "vm runner: %v\n", err)
			continue
		}
		r.mu.Lock()
		r.proxies[vm.addr], r.owner[vm.addr] = p, vm.id
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

// secretLeaseKey is the lease key in the Secret Manager version a VM's
// metadata names, as the VM's fetcher reads it.
func secretLeaseKey(fake *fakecompute.Server, vm *computepb.Instance) []byte {
	for _, item := range vm.GetMetadata().GetItems() {
		if item.GetKey() == "egress-proxy-lease-key-secret" {
			key, _ := fake.Secret(strings.TrimSuffix(item.GetValue(), "/versions/latest"))
			return decodeKey(key)
		}
	}
	return nil
}

// decodeKey is a lease key file's key, as the helper reads it (hex).
func decodeKey(file string) []byte {
	key, _ := hex.DecodeString(strings.TrimSpace(file))
	return key
}

// leaseKeyCheck checks credentials as a VM's lease-auth helper does
// (squidconf.LeaseAuthHelper) with the VM's lease key: "<subject>~<notAfter>"
// signed with the key and not yet expired, unless revoked;
// "revoke~<notAfter>~<id>.<id>..." signed the same way revokes those ids
// and is refused.
func leaseKeyCheck(key []byte) func(user, password string) bool {
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
// a gcp provider instance called name on the fake Compute API (and its
// Secret Manager) at endpoint: project and zone as given, the firewall open
// to loopback, where the VM runner's proxies listen.
func GCPProvider(name, project, zone, endpoint string) string {
	return fmt.Sprintf(`- name: %s
  type: gcp
  settings:
    project: %s
    zone: %s
    machineType: e2-small
    image: projects/debian-cloud/global/images/family/debian-12
    endpoint: %[4]s
    secretManagerEndpoint: %[4]s
    serviceAccount: egress-proxy-vm@%[2]s.iam.gserviceaccount.com
    withoutAuthentication: true
    requestTimeout: 5s
    firewall:
      sourceRanges: [127.0.0.0/8]
`, name, project, zone, endpoint)
}

// AWSProvider is the providers-config entry (for Options.ExtraProviders) of
// an aws provider instance called name on the fake EC2 API (and its SSM)
// at endpoint: the region and default zone as given, the security group
// open to loopback, where the EC2 runner's proxies listen.
func AWSProvider(name, region, zone, endpoint string) string {
	return fmt.Sprintf(`- name: %s
  type: aws
  settings:
    region: %s
    zone: %s
    instanceType: t3.micro
    imageId: ami-0debian12
    endpoint: %[4]s
    ssmEndpoint: %[4]s
    instanceProfile: egress-proxy-vm
    withoutAuthentication: true
    requestTimeout: 5s
    securityGroup:
      sourceRanges: [127.0.0.0/8]
`, name, region, zone, endpoint)
}
