package v1alpha1

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestAnExternalProxyIsRecordedFromItsSpec: an External proxy's record is
// its spec's address, Ready and Provisioned; a verdict about the address it
// had does not make the one it moved to Ready, and the same address keeps
// its verdict. A Managed proxy is recorded by the reconciler: AsRecorded
// leaves it as it is.
func TestAnExternalProxyIsRecordedFromItsSpec(t *testing.T) {
	p := &Proxy{ObjectMeta: metav1.ObjectMeta{Name: "ext", Generation: 3},
		Spec: ProxySpec{Mode: ModeExternal, Port: 3128, External: &ExternalEndpoint{Address: "127.0.0.9"}}}
	assert.True(t, p.ExternalRecordDiffers(), "never recorded")
	r := p.AsRecorded()
	assert.Equal(t, PhaseReady, r.Status.Phase)
	assert.Equal(t, "127.0.0.9", r.Status.IP)
	assert.Equal(t, int32(3128), r.Status.Port, "spec.port when spec.external.port is unset")
	assert.Equal(t, int64(3), r.Status.ObservedGeneration)
	assert.True(t, r.Serving())
	assert.Empty(t, p.Status.Phase, "p itself is left alone")

	// Recorded with a Healthy verdict about 127.0.0.9: Ready.
	r.Status.Conditions = append(r.Status.Conditions, metav1.Condition{Type: ConditionHealthy, Status: metav1.ConditionTrue, Reason: "ProbeSucceeded"})
	r.Status.HealthCheckedInstance = r.Status.Instance()
	p.Status = r.Status
	assert.False(t, p.ExternalRecordDiffers())
	require.True(t, p.AsRecorded().IsReady())

	// The spec moves it: the verdict about 127.0.0.9 says nothing of 127.0.0.1.
	p.Spec.External.Address, p.Generation = "127.0.0.1", 4
	assert.True(t, p.ExternalRecordDiffers())
	moved := p.AsRecorded()
	assert.Equal(t, "127.0.0.1", moved.Status.IP)
	assert.False(t, moved.IsReady())
	assert.Equal(t, ReasonAwaitingProbe, moved.ReadyCondition(moved.RecordedHealth()).Reason)

	managed := &Proxy{Spec: ProxySpec{Mode: ModeManaged, Provider: "gcp-eu"}}
	assert.Same(t, managed, managed.AsRecorded())
	assert.False(t, managed.ExternalRecordDiffers())
}
