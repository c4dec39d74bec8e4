package operator

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/example/egress-proxies-operator/providers"
)

// Where an operator learns who it is and what it keeps to, beside its flags:
// the conventions OLM and the chart fill in through the downward API.
const (
	// EnvWatchNamespace is OLM's convention: the operator group's target
	// namespaces, comma-separated ("" for all namespaces).
	EnvWatchNamespace = "WATCH_NAMESPACE"
	// EnvOperatorName is the release's name (OLM's OPERATOR_NAME
	// convention; the chart sets its full name).
	EnvOperatorName = "OPERATOR_NAME"
	// EnvPodNamespace is the namespace the operator's pod runs in.
	EnvPodNamespace = "POD_NAMESPACE"
	// DefaultName is the name when nobody says otherwise: the kustomize
	// base's and the bundle's deployment.
	DefaultName = "egress-proxies-operator"
	// DefaultNamespace is where the kustomize base deploys, the namespace
	// when neither $POD_NAMESPACE nor a service account says.
	DefaultNamespace = "egress-proxies-operator-system"
)

// Name is the release's name: $OPERATOR_NAME, or DefaultName.
func Name() string {
	if name := os.Getenv(EnvOperatorName); name != "" {
		return name
	}
	return DefaultName
}

// Namespace is the namespace the operator runs in: $POD_NAMESPACE, the
// service account's namespace in-cluster, or DefaultNamespace.
func Namespace() string {
	if ns := os.Getenv(EnvPodNamespace); ns != "" {
		return ns
	}
	if data, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace"); err == nil {
		if ns := strings.TrimSpace(string(data)); ns != "" {
			return ns
		}
	}
	return DefaultNamespace
}

// Identity is who this operator is among the operators and clusters that
// may share a cloud project: the labels on every instance it creates, and
// what it keeps to.
type Identity struct {
	// ClusterID is labelled on every instance; "" until Resolve: the UID
	// of kube-system, or of the operator's own namespace when scoped.
	ClusterID string
	// OperatorID tells this operator from others in the cluster.
	OperatorID string
	// Scope is the namespaces it keeps to (none: the whole cluster).
	Scope Scope
	// CredentialsNamespace keeps the proxy credentials it generates and
	// the record of each instance's.
	CredentialsNamespace string

	watchNamespaces string
}

// AddFlags registers the identity's flags.
func (id *Identity) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&id.ClusterID, "cluster-id", "",
		"Identifier labelled on every instance this operator creates, so orphan GC never touches another cluster's. Default: the UID of the kube-system namespace; with --watch-namespaces, the UID of the operator's own namespace.")
	fs.StringVar(&id.OperatorID, "operator-id", "",
		"Identifier of this operator among those of one cluster, labelled on every instance beside the cluster id: two operators never list, watch or collect each other's instances. Default: <operator namespace>_<$OPERATOR_NAME, or egress-proxies-operator>.")
	fs.StringVar(&id.watchNamespaces, "watch-namespaces", os.Getenv(EnvWatchNamespace),
		"Comma-separated namespaces the operator keeps to: its caches, watches, discovery and GC. Empty: the whole cluster. Default: $WATCH_NAMESPACE (OLM's target namespaces).")
	fs.StringVar(&id.CredentialsNamespace, "credentials-namespace", "",
		"namespace where the operator keeps the proxy credentials it generates per provider instance and the record of each instance's. Default: the operator's namespace.")
}

// Validate checks the flags and fills in the defaults that need no cluster.
func (id *Identity) Validate() error {
	var errs []error
	scope, err := ParseScope(id.watchNamespaces)
	id.Scope = scope
	if err != nil {
		errs = append(errs, fmt.Errorf("--watch-namespaces: %w", err))
	}
	if id.CredentialsNamespace == "" {
		id.CredentialsNamespace = Namespace()
	}
	if bad := validation.IsDNS1123Label(id.CredentialsNamespace); len(bad) > 0 {
		errs = append(errs, fmt.Errorf("--credentials-namespace %q is not a namespace name: %s", id.CredentialsNamespace, strings.Join(bad, "; ")))
	}
	if id.ClusterID != "" && !providers.LabelValuePattern.MatchString(id.ClusterID) {
		errs = append(errs, fmt.Errorf("--cluster-id %q must be 1-63 lowercase letters, digits, '-' or '_': it is a label value on every instance, in Kubernetes and in GCE", id.ClusterID))
	}
	if id.OperatorID == "" {
		id.OperatorID = providers.OperatorID(Namespace(), Name())
	}
	if !providers.LabelValuePattern.MatchString(id.OperatorID) {
		errs = append(errs, fmt.Errorf("--operator-id %q must be 1-63 lowercase letters, digits, '-' or '_': it is a label value on every instance, in Kubernetes and in GCE", id.OperatorID))
	}
	return errors.Join(errs...)
}

// Resolve fills in the default cluster id, which needs the cluster: the UID
// of the kube-system namespace for an operator that watches the whole
// cluster; for one kept to namespaces, whose RBAC reaches nothing outside
// them, the UID of its own namespace (which a Role there may read). Both
// are stable for the namespace's life and distinct between clusters; set
// --cluster-id to keep instances through a change of scope.
func (id *Identity) Resolve(ctx context.Context, reader client.Reader) error {
	if id.ClusterID != "" {
		return nil
	}
	name := metav1.NamespaceSystem
	if !id.Scope.Cluster() {
		name = Namespace()
	}
	var ns corev1.Namespace
	if err := reader.Get(ctx, client.ObjectKey{Name: name}, &ns); err != nil {
		return fmt.Errorf("reading the namespace %s for the default --cluster-id (set --cluster-id to skip): %w", name, err)
	}
	id.ClusterID = string(ns.UID)
	return nil
}

// Owner is the labels that mark this operator's instances.
func (id *Identity) Owner() providers.Owner {
	return providers.Owner{ClusterID: id.ClusterID, OperatorID: id.OperatorID}
}
