package lease_test

import (
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/example/egress-proxies-operator/lease"
	"github.com/example/egress-proxies-operator/lease/storetest"
)

// TestMemoryStoreConformance runs the store suite on the in-memory store
// with a fake clock.
func TestMemoryStoreConformance(t *testing.T) {
	storetest.Run(t, func(*testing.T) storetest.Harness {
		clk := clocktesting.NewFakeClock(time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC))
		return storetest.Harness{Store: lease.NewMemoryStore(clk), Advance: clk.Step}
	})
}
