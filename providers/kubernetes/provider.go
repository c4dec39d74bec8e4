// Package kubernetes is the provider that runs each Managed proxy as a Squid
// pod in the Proxy's own namespace: no cloud account needed, for local
// development, CI and in-cluster egress. It knows Pods and Secrets (and the
// ConfigMaps earlier versions made) and nothing of the reconciler; it must
// never import the controllers.
package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"net"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	crawlv1alpha1 "github.com/example/egress-proxies-operator/api/v1alpha1"
	"github.com/example/egress-proxies-operator/providers"
	"github.com/example/egress-proxies-operator/providers/squidconf"
)

// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;create;delete
// Each pod's files (squid.conf, the lease-auth helper, its lease key) are
// in a Secret of its own, named as the pod, which the operator writes and
// deletes (never reads). Instances of earlier
// versions kept their files in a ConfigMap: deleted with them.
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=delete
// +kubebuilder:rbac:groups="",resources=secrets,verbs=create;patch;delete

// Type is this provider's type name in the providers config.
const Type = "kubernetes"

// Paths inside the Squid container. The root filesystem is read-only, so
// everything Squid writes goes to emptyDirs mounted here.
const (
	configDir    = "/etc/squid-operator"
	runDir       = "/run/squid"
	spoolDir     = "/var/spool/squid"
	logDir       = "/var/log/squid"
	squidConfKey = "squid.conf"
	// leaseAuthKey and leaseKeyKey are the lease-auth helper's and the
	// proxy's lease key's names in configDir; revokedFile is where the
	// helper keeps revoked leases (the spool emptyDir, writable).
	leaseAuthKey = "lease-auth.pl"
	leaseKeyKey  = "lease.key"
	revokedFile  = spoolDir + "/revoked-leases"
	// squidUID is the proxy user of Debian and Ubuntu images.
	squidUID int64 = 13
)

// Settings are a kubernetes provider instance's settings in the providers
// config.
type Settings struct {
	// Image is the Squid image. Default: ubuntu/squid.
	Image string `json:"image,omitempty"`
	// AllowedSourceRanges are the CIDRs that may use the proxies: the
	// cluster's pod and service ranges. Default: the private ranges
	// 10.0.0.0/8, 172.16.0.0/12 and 192.168.0.0/16.
	AllowedSourceRanges []string `json:"allowedSourceRanges,omitempty"`
	// DeniedDestinationRanges are never reachable through the proxies.
	// Default: loopback and link-local (cloud metadata servers). An explicit
	// empty list denies nothing.
	DeniedDestinationRanges *[]string `json:"deniedDestinationRanges,omitempty"`
	// Perl is the path of perl in the image, which runs the lease-auth
	// helper. Default: /usr/bin/perl (Debian's and Ubuntu's squid package
	// brings it).
	Perl string `json:"perl,omitempty"`
	// AuthHelper is accepted and ignored: proxies no longer check a
	// password file with Squid's basic_ncsa_auth.
	AuthHelper string `json:"authHelper,omitempty"`
}

// resolved are Settings with the defaults applied.
type resolved struct {
	Image                   string
	Perl                    string
	AllowedSourceRanges     []string
	DeniedDestinationRanges []string
}

// resolve applies the defaults and checks every CIDR, naming the field.
func (s Settings) resolve() (resolved, error) {
	r := resolved{
		Image:                   s.Image,
		Perl:                    s.Perl,
		AllowedSourceRanges:     s.AllowedSourceRanges,
		DeniedDestinationRanges: []string{"127.0.0.0/8", "169.254.0.0/16", "::1/128", "fe80::/10"},
	}
	if r.Image == "" {
		r.Image = "ubuntu/squid"
	}
	if r.Perl == "" {
		r.Perl = squidconf.DefaultPerl
	}
	if len(r.AllowedSourceRanges) == 0 {
		r.AllowedSourceRanges = []string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"}
	}
	if s.DeniedDestinationRanges != nil {
		r.DeniedDestinationRanges = *s.DeniedDestinationRanges
	}
	var errs []error
	for _, f := range []struct {
		field string
		cidrs []string
	}{{"allowedSourceRanges", r.AllowedSourceRanges}, {"deniedDestinationRanges", r.DeniedDestinationRanges}} {
		for i, cidr := range f.cidrs {
			if _, _, err := net.ParseCIDR(cidr); err != nil {
				errs = append(errs, fmt.Errorf("settings.%s[%d]: %q is not a CIDR", f.field, i, cidr))
			}
		}
	}
	return r, errors.Join(errs...)
}

// Provider runs proxies as Squid pods.
type Provider struct {
	name     string
	settings resolved
	client   client.Client
}

var (
	_ providers.Provider     = (*Provider)(nil)
	_ providers.ObjectBacked = (*Provider)(nil)
)

// New builds a kubernetes provider instance from its settings.
func New(name string, raw map[string]any, deps providers.Dependencies) (providers.Provider, error) {
	var s Settings
	if err := providers.DecodeSettings(raw, &s); err != nil {
		return nil, err
	}
	settings, err := s.resolve()
	if err != nil {
		return nil, err
	}
	// deps.Client is nil when the registry only checks the config.
	return &Provider{name: name, settings: settings, client: deps.Client}, nil
}

// InstancesFollowTheirProxy says that a proxy pod is owned by its Proxy
// (see objectMeta), so a kubernetes Proxy needs no finalizer.
func (p *Provider) InstancesFollowTheirProxy() {}

// InstanceObject makes the reconciler watch Pods.
func (p *Provider) InstanceObject() client.Object { return &corev1.Pod{} }

// Validate rejects placement fields a pod cannot honour. A zone pins the
// pod to nodes labelled topology.kubernetes.io/zone with it; region is an
// attribute for discovery only; nothing else means anything here.
func (p *Provider) Validate(proxy *crawlv1alpha1.Proxy) error {
	pl := proxy.Spec.Placement
	if pl == nil {
		return nil
	}
	for field, value := range map[string]bool{
		"machineType": pl.MachineType != "",
		"image":       pl.Image != "",
		"parameters":  len(pl.Parameters) > 0,
	} {
		if value {
			return providers.Terminal("spec.placement.%s is not supported by kubernetes provider %s (it runs the image from the providers config); remove it", field, p.name)
		}
	}
	return nil
}

// Get reads the proxy's pod from the manager's cache.
func (p *Provider) Get(ctx context.Context, name string, proxy *crawlv1alpha1.Proxy) (*providers.Instance, error) {
	var pod corev1.Pod
	if err := p.client.Get(ctx, client.ObjectKey{Namespace: proxy.Namespace, Name: name}, &pod); err != nil {
		return nil, classify(fmt.Errorf("getting pod %s/%s: %w", proxy.Namespace, name, err))
	}
	inst := instanceOf(&pod)
	return &inst, nil
}

// Create creates the proxy's files Secret and its pod. The pod's files
// (squid.conf, the lease-auth helper and the proxy's lease key: its alone,
// derived from the provider's password, never the password) are in the
// Secret, which the pod mounts: never in the pod object, which anyone with
// the built-in view role may read, and which every pod watcher (the
// operator, the kubelet, the scheduler) receives whole on each change, so
// the pod carries its spec alone. The cloud-init document is in the
// pod's spec-hash label, which changes with it and so replaces the pod.
// Both are owned by the Proxy. An existing pod is left alone: Create after
// a lost reply is a no-op; an existing Secret is given this instance's
// files.
func (p *Provider) Create(ctx context.Context, req providers.CreateRequest) error {
	if req.Credentials.IsZero() {
		return providers.ErrNoCredentials
	}
	squidConf, err := renderSquidConfig(req.Owner(), req.Proxy.Spec.Port, p.settings)
	if err != nil {
		return providers.Terminal("%v", err)
	}
	if err := p.ensureFilesSecret(ctx, req, squidConf); err != nil {
		return err
	}
	pod := p.pod(req)
	if err := p.client.Create(ctx, pod); err != nil && !apierrors.IsAlreadyExists(err) {
		return classify(fmt.Errorf("creating pod %s/%s: %w", pod.Namespace, pod.Name, err))
	}
	return nil
}

// ensureFilesSecret writes the pod's files (squid.conf, the lease-auth
// helper, the proxy's lease key) into the Secret its pod mounts (named as
// the pod), creating it or giving an existing one (a replaced instance's)
// the files of this one.
func (p *Provider) ensureFilesSecret(ctx context.Context, req providers.CreateRequest, squidConf string) error {
	secret := &corev1.Secret{ObjectMeta: p.objectMeta(req), Data: map[string][]byte{
		squidConfKey: []byte(squidConf),
		leaseAuthKey: []byte(squidconf.LeaseAuthHelper),
		leaseKeyKey:  []byte(req.LeaseKeyFile()),
	}}
	err := p.client.Create(ctx, secret)
	if apierrors.IsAlreadyExists(err) {
		err = p.client.Patch(ctx, secret, client.MergeFrom(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: secret.Namespace, Name: secret.Name}}))
	}
	if err != nil {
		return classify(fmt.Errorf("writing the files Secret %s/%s: %w", secret.Namespace, secret.Name, err))
	}
	return nil
}

// Delete deletes the pod, its key Secret, and the ConfigMap in which
// instances made by earlier versions kept their files; any already gone is
// fine.
func (p *Provider) Delete(ctx context.Context, inst *providers.Instance) error {
	meta := metav1.ObjectMeta{Namespace: inst.Location, Name: inst.Name}
	var errs []error
	for _, obj := range []client.Object{&corev1.Pod{ObjectMeta: meta}, &corev1.ConfigMap{ObjectMeta: meta}, &corev1.Secret{ObjectMeta: meta}} {
		if err := p.client.Delete(ctx, obj); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, classify(fmt.Errorf("deleting %T %s/%s: %w", obj, inst.Location, inst.Name, err)))
		}
	}
	return errors.Join(errs...)
}

// List returns every proxy pod, in any namespace the operator watches,
// labelled with owner and with this provider instance's name.
func (p *Provider) List(ctx context.Context, owner providers.Owner) ([]providers.Instance, error) {
	selector := owner.Labels()
	selector[crawlv1alpha1.LabelProvider] = p.name
	var pods corev1.PodList
	if err := p.client.List(ctx, &pods, client.MatchingLabels(selector)); err != nil {
		return nil, classify(fmt.Errorf("listing pods: %w", err))
	}
	out := make([]providers.Instance, 0, len(pods.Items))
	for i := range pods.Items {
		out = append(out, instanceOf(&pods.Items[i]))
	}
	return out, nil
}

// instanceOf maps a pod to the provider-neutral instance view.
func instanceOf(pod *corev1.Pod) providers.Instance {
	inst := providers.Instance{
		Name:      pod.Name,
		Location:  pod.Namespace,
		Labels:    pod.Labels,
		CreatedAt: pod.CreationTimestamp.Time,
		IP:        pod.Status.PodIP,
	}
	if len(pod.Spec.Containers) > 0 && len(pod.Spec.Containers[0].Ports) > 0 {
		inst.Port = pod.Spec.Containers[0].Ports[0].ContainerPort
	}
	switch {
	case pod.DeletionTimestamp != nil:
		inst.State = providers.StateStopping
	case pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded:
		inst.State = providers.StateFailed
		inst.Message = fmt.Sprintf("pod %s: %s %s", pod.Status.Phase, pod.Status.Reason, pod.Status.Message)
	case pod.Status.Phase == corev1.PodRunning && podReady(pod) && pod.Status.PodIP != "":
		inst.State = providers.StateRunning
	default:
		inst.State = providers.StatePending
		inst.Message = pendingReason(pod)
	}
	return inst
}

func podReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func pendingReason(pod *corev1.Pod) string {
	for _, cs := range pod.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil && w.Reason != "" && !routineWaits[w.Reason] {
			return fmt.Sprintf("container %s: %s %s", cs.Name, w.Reason, w.Message)
		}
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason != "" {
			return fmt.Sprintf("pod not scheduled: %s %s", c.Reason, c.Message)
		}
	}
	return "" // starting as expected: nothing to tell (providers.Instance.Message)
}

// routineWaits are the container waiting reasons of every pod that starts:
// not worth a word in the Proxy's status.
var routineWaits = map[string]bool{"ContainerCreating": true, "PodInitializing": true}

// objectMeta is the pod's: the instance labels plus the recommended app
// labels, owned by the Proxy so that Kubernetes' own garbage collector
// deletes the pod with it (providers.OwnerCollected).
func (p *Provider) objectMeta(req providers.CreateRequest) metav1.ObjectMeta {
	labels := map[string]string{
		"app.kubernetes.io/name":       "egress-proxy",
		"app.kubernetes.io/instance":   req.Name,
		"app.kubernetes.io/component":  "squid",
		"app.kubernetes.io/managed-by": "egress-proxies-operator",
	}
	for k, v := range req.Labels {
		labels[k] = v
	}
	labels[crawlv1alpha1.LabelProvider] = p.name
	return metav1.ObjectMeta{
		Name:      req.Name,
		Namespace: req.Proxy.Namespace,
		Labels:    labels,
		OwnerReferences: []metav1.OwnerReference{{
			APIVersion:         crawlv1alpha1.GroupVersion.String(),
			Kind:               "Proxy",
			Name:               req.Proxy.Name,
			UID:                req.Proxy.UID,
			Controller:         ptr.To(true),
			BlockOwnerDeletion: ptr.To(true),
		}},
	}
}

// pod is the Squid pod for req: restricted Pod Security (non-root, no
// privilege escalation, all capabilities dropped, RuntimeDefault seccomp,
// read-only root filesystem), a TCP readiness probe on the proxy port, and
// resource requests so it schedules predictably.
func (p *Provider) pod(req providers.CreateRequest) *corev1.Pod {
	port := req.Proxy.Spec.Port
	emptyDir := func(name string) corev1.Volume {
		return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}
	}
	// A zone pins the pod to that zone's nodes, as a pool's spread asks;
	// a cluster whose nodes carry no zone label leaves it Pending.
	var nodeSelector map[string]string
	if pl := req.Proxy.Spec.Placement; pl != nil && pl.Zone != "" {
		nodeSelector = map[string]string{corev1.LabelTopologyZone: pl.Zone}
	}
	meta := p.objectMeta(req)
	file := func(key string) corev1.KeyToPath { return corev1.KeyToPath{Key: key, Path: key} }
	return &corev1.Pod{
		ObjectMeta: meta,
		Spec: corev1.PodSpec{
			NodeSelector:                  nodeSelector,
			AutomountServiceAccountToken:  ptr.To(false),
			EnableServiceLinks:            ptr.To(false),
			TerminationGracePeriodSeconds: ptr.To[int64](10),
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot:   ptr.To(true),
				RunAsUser:      ptr.To(squidUID),
				RunAsGroup:     ptr.To(squidUID),
				FSGroup:        ptr.To(squidUID),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name:    "squid",
				Image:   p.settings.Image,
				Command: []string{"squid", "-N", "-d", "1", "-f", configDir + "/" + squidConfKey},
				Ports:   []corev1.ContainerPort{{Name: "proxy", ContainerPort: port, Protocol: corev1.ProtocolTCP}},
				ReadinessProbe: &corev1.Probe{
					ProbeHandler:  corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(port)}},
					PeriodSeconds: 5,
				},
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("50m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
					Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")},
				},
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: ptr.To(false),
					ReadOnlyRootFilesystem:   ptr.To(true),
					RunAsNonRoot:             ptr.To(true),
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
				VolumeMounts: []corev1.VolumeMount{
					{Name: "config", MountPath: configDir, ReadOnly: true},
					{Name: "run", MountPath: runDir},
					{Name: "spool", MountPath: spoolDir},
					{Name: "log", MountPath: logDir},
				},
			}},
			Volumes: []corev1.Volume{
				{Name: "config", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
					SecretName:  meta.Name,
					Items:       []corev1.KeyToPath{file(squidConfKey), file(leaseAuthKey), file(leaseKeyKey)},
					DefaultMode: ptr.To[int32](0o440),
				}}},
				emptyDir("run"), emptyDir("spool"), emptyDir("log"),
			},
		},
	}
}

// classify maps an API error to the provider error kinds: not found, terminal
// (the request itself is wrong or forbidden) or transient (anything else).
func classify(err error) error {
	switch {
	case err == nil:
		return nil
	case apierrors.IsNotFound(err):
		return fmt.Errorf("%w: %w", providers.ErrNotFound, err)
	case apierrors.IsForbidden(err), apierrors.IsInvalid(err), apierrors.IsBadRequest(err):
		return fmt.Errorf("%w: %w", providers.ErrTerminal, err)
	default:
		return providers.Transient(err)
	}
}

// CacheByObject scopes the manager's cache to this provider's objects: Pods
// carrying a cluster-id label, never every pod in the cluster.
func CacheByObject() map[client.Object]cache.ByObject {
	hasClusterID, err := labels.NewRequirement(crawlv1alpha1.LabelClusterID, selection.Exists, nil)
	if err != nil {
		panic(err) // a constant, valid label key
	}
	instances := labels.NewSelector().Add(*hasClusterID)
	return map[client.Object]cache.ByObject{
		&corev1.Pod{}: {Label: instances},
	}
}
