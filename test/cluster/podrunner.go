package cluster

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/test/squid"
)

// PodRunner plays the kubelet for the kubernetes provider's proxy pods: for
// each new pod it starts a real Squid with the squid.conf from the pod's
// ConfigMap, bound to a loopback address of the pod's own and the pod's
// port, then marks the pod Running and Ready with that address as its IP.
// When the pod goes away, so does its Squid.
type PodRunner struct {
	client client.Client
	dir    string

	mu      sync.Mutex
	running map[types.UID]*runningPod
	nextIP  int
	// reuse: an address a stopped pod released goes to the next pod
	// started, once (as a cloud hands a new VM an IP someone released):
	// released are those waiting, reused those handed out again already.
	reuse    bool
	released []string
	reused   map[string]bool
}

// ReuseReleasedIPs makes the runner hand the address of a pod that went
// away to the next pod it starts, each address at most once more; false
// stops it and forgets the addresses waiting.
func (r *PodRunner) ReuseReleasedIPs(on bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reuse, r.released = on, nil
	if r.reused == nil {
		r.reused = map[string]bool{}
	}
}

type runningPod struct {
	key   types.NamespacedName
	ip    string
	squid *squid.Squid
	// cfg and dir start the same Squid again after a crash.
	cfg squid.Config
	dir string
}

// NewPodRunner returns a runner keeping its Squids' files under dir.
func NewPodRunner(c client.Client, dir string) *PodRunner {
	return &PodRunner{client: c, dir: dir, running: map[types.UID]*runningPod{}}
}

// Run reconciles pods against Squids every 100ms until ctx ends.
func (r *PodRunner) Run(ctx context.Context) {
	for ctx.Err() == nil {
		if err := r.sync(ctx); err != nil && ctx.Err() == nil {
			fmt.Fprintf(os.Stderr, "pod runner: %v\n", err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Running reports whether a Squid runs for the pod with uid.
func (r *PodRunner) Running(uid types.UID) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, ok := r.running[uid]
	return ok && p.squid.Running()
}

// StopAll stops every Squid.
func (r *PodRunner) StopAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for uid, p := range r.running {
		p.squid.Stop()
		delete(r.running, uid)
	}
}

// KillSquid kills the Squid of a pod, as a crash would, leaving the pod as
// it is.
func (r *PodRunner) KillSquid(uid types.UID) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, ok := r.running[uid]
	if ok {
		p.squid.Stop()
	}
	return ok
}

// RestartSquid starts a pod's Squid again after KillSquid, as the kubelet
// restarts a crashed container: same address, same config. It does nothing
// for a Squid that runs, and reports false for a pod it does not know.
func (r *PodRunner) RestartSquid(uid types.UID) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, ok := r.running[uid]
	if !ok {
		return false, nil
	}
	if p.squid.Running() {
		return true, nil
	}
	sq, err := squid.StartProcess(p.cfg, p.dir)
	if err != nil {
		return true, fmt.Errorf("restarting the Squid of pod %s: %w", p.key, err)
	}
	p.squid = sq
	return true, nil
}

// Addr is where a running pod's Squid listens (its pod IP and port), or ""
// for a pod the runner does not run.
func (r *PodRunner) Addr(uid types.UID) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, ok := r.running[uid]
	if !ok {
		return ""
	}
	return net.JoinHostPort(p.ip, strconv.Itoa(p.cfg.Port))
}

// Pods lists the pods it runs a Squid for (running or killed).
func (r *PodRunner) Pods() []types.UID {
	r.mu.Lock()
	defer r.mu.Unlock()
	uids := make([]types.UID, 0, len(r.running))
	for uid := range r.running {
		uids = append(uids, uid)
	}
	return uids
}

func (r *PodRunner) sync(ctx context.Context) error {
	var pods corev1.PodList
	if err := r.client.List(ctx, &pods, client.HasLabels{crawlv1alpha1.LabelClusterID}); err != nil {
		return fmt.Errorf("listing proxy pods: %w", err)
	}
	alive := map[types.UID]bool{}
	for i := range pods.Items {
		pod := &pods.Items[i]
		if pod.DeletionTimestamp != nil {
			continue
		}
		alive[pod.UID] = true
		r.mu.Lock()
		_, started := r.running[pod.UID]
		r.mu.Unlock()
		if started {
			continue
		}
		if err := r.start(ctx, pod); err != nil {
			fmt.Fprintf(os.Stderr, "pod runner: pod %s/%s: %v\n", pod.Namespace, pod.Name, err)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for uid, p := range r.running {
		if !alive[uid] {
			p.squid.Stop()
			delete(r.running, uid)
			if r.reuse && !r.reused[p.ip] {
				r.released = append(r.released, p.ip)
			}
		}
	}
	return nil
}

// nextAddress is a new pod's address: a released one waiting, when reuse
// is on, else one never used.
func (r *PodRunner) nextAddress() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.reuse && len(r.released) > 0 {
		ip := r.released[0]
		r.released, r.reused[ip] = r.released[1:], true
		return ip
	}
	r.nextIP++
	return LoopbackIP(1, r.nextIP)
}

// secretFiles are the files a Secret volume lays out, by path (nil for
// another kind of volume): a proxy pod's squid.conf, lease-auth helper and
// lease key.
func (r *PodRunner) secretFiles(ctx context.Context, pod *corev1.Pod, vol corev1.Volume) (map[string][]byte, error) {
	if vol.Secret == nil {
		return nil, nil
	}
	var secret corev1.Secret
	if err := r.client.Get(ctx, client.ObjectKey{Namespace: pod.Namespace, Name: vol.Secret.SecretName}, &secret); err != nil {
		return nil, fmt.Errorf("volume %s: Secret %s: %w", vol.Name, vol.Secret.SecretName, err)
	}
	files := map[string][]byte{}
	for _, item := range vol.Secret.Items {
		data, ok := secret.Data[item.Key]
		if !ok {
			return nil, fmt.Errorf("volume %s: Secret %s has no key %s", vol.Name, vol.Secret.SecretName, item.Key)
		}
		files[item.Path] = data
	}
	return files, nil
}

// configFile is the file the container's command names after -f (its
// squid.conf), read from the volume mounted at its directory.
func configFile(pod *corev1.Pod, volumes map[string]map[string][]byte) (string, error) {
	c := pod.Spec.Containers[0]
	i := slices.Index(c.Command, "-f")
	if i < 0 || i+1 == len(c.Command) {
		return "", fmt.Errorf("its command names no config file (-f)")
	}
	path := c.Command[i+1]
	for _, mount := range c.VolumeMounts {
		if name, ok := strings.CutPrefix(path, mount.MountPath+"/"); ok {
			if data, ok := volumes[mount.Name][name]; ok {
				return string(data), nil
			}
		}
	}
	return "", fmt.Errorf("no volume of it holds %s", path)
}

var httpPortLine = regexp.MustCompile(`(?m)^http_port\s+(\d+)\s*$`)

func (r *PodRunner) start(ctx context.Context, pod *corev1.Pod) error {
	// The pod's Secret volumes (squid.conf, the helper and the lease key),
	// read first: a pod whose Secret is not there yet waits for the next
	// sync, as a kubelet waits, and takes no address meanwhile.
	volumes := map[string]map[string][]byte{}
	for _, vol := range pod.Spec.Volumes {
		files, err := r.secretFiles(ctx, pod, vol)
		if err != nil {
			return err
		}
		if files != nil {
			volumes[vol.Name] = files
		}
	}
	conf, err := configFile(pod, volumes)
	if err != nil {
		return err
	}
	m := httpPortLine.FindStringSubmatch(conf)
	if m == nil {
		return fmt.Errorf("its squid.conf has no http_port line")
	}
	ip := r.nextAddress()
	// The pod's own address: what a pod IP is on a node. Requests leave
	// from it too, so a site sees each proxy's own IP.
	conf = httpPortLine.ReplaceAllString(conf, "http_port "+ip+":"+m[1]) + "\ntcp_outgoing_address " + ip + "\n"
	port, _ := strconv.Atoi(m[1]) // digits, by the regexp
	dir := filepath.Join(r.dir, string(pod.UID))
	// The pod's emptyDir mounts, emulated as directories of its own.
	for _, mount := range pod.Spec.Containers[0].VolumeMounts {
		if mount.ReadOnly {
			continue
		}
		local := filepath.Join(dir, mount.Name)
		if err := os.MkdirAll(local, 0o755); err != nil {
			return err
		}
		if err := squid.ChownForSquid(local); err != nil {
			return err
		}
		conf = strings.ReplaceAll(conf, mount.MountPath+"/", local+"/")
	}
	// Written out as the kubelet projects them.
	for name, files := range volumes {
		local := filepath.Join(dir, name)
		if err := os.MkdirAll(local, 0o755); err != nil {
			return err
		}
		for path, data := range files {
			if err := os.WriteFile(filepath.Join(local, path), data, 0o644); err != nil {
				return err
			}
		}
		for _, mount := range pod.Spec.Containers[0].VolumeMounts {
			if mount.Name == name {
				conf = strings.ReplaceAll(conf, mount.MountPath+"/", local+"/")
			}
		}
	}
	cfg := squid.Config{Address: ip, Port: port, ConfigText: conf}
	sq, err := squid.StartProcess(cfg, dir)
	if err != nil {
		return err
	}
	pod.Status = RunningStatus(pod, ip, time.Now())
	if err := r.client.Status().Update(ctx, pod); err != nil {
		sq.Stop()
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return nil // gone or changed: the next sync sees it again
		}
		return fmt.Errorf("marking it running: %w", err)
	}
	r.mu.Lock()
	r.running[pod.UID] = &runningPod{key: client.ObjectKeyFromObject(pod), ip: ip, squid: sq, cfg: cfg, dir: dir}
	r.mu.Unlock()
	return nil
}

// RunningStatus is the status a kubelet reports for pod once its containers
// run at ip: phase Running, the four pod conditions True, and a ready,
// started status per container, so `kubectl get pods` shows READY 1/1 as
// on a real cluster.
func RunningStatus(pod *corev1.Pod, ip string, now time.Time) corev1.PodStatus {
	since := metav1.NewTime(now)
	status := corev1.PodStatus{
		Phase:  corev1.PodRunning,
		HostIP: "127.0.0.1", HostIPs: []corev1.HostIP{{IP: "127.0.0.1"}},
		PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
		StartTime: &since,
		QOSClass:  pod.Status.QOSClass, // the API server sets it at create; it is immutable
	}
	for _, t := range []corev1.PodConditionType{corev1.PodScheduled, corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady} {
		status.Conditions = append(status.Conditions, corev1.PodCondition{Type: t, Status: corev1.ConditionTrue, LastTransitionTime: since})
	}
	started := true
	for _, c := range pod.Spec.Containers {
		status.ContainerStatuses = append(status.ContainerStatuses, corev1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: c.Image,
			Ready: true, Started: &started,
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: since}},
		})
	}
	return status
}
