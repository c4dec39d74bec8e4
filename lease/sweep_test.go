package lease

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"
)

// TestHostKeyedMapsAreSwept: learned paces decayed to nothing and a
// session's reports past their window are dropped as new ones come, so a
// crawl over ever new hosts does not grow the store.
func TestHostKeyedMapsAreSwept(t *testing.T) {
	ctx := context.Background()
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC))
	m := NewMemoryStore(clk)
	for i := range 3000 {
		_, err := m.PushBack(ctx, fmt.Sprintf("h%d.example", i), 0)
		require.NoError(t, err)
		clk.Step(10 * time.Millisecond)
	}
	clk.Step(time.Hour) // every learned pace has halved to nothing
	for i := range 3000 {
		_, err := m.PushBack(ctx, fmt.Sprintf("new%d.example", i), 0)
		require.NoError(t, err)
	}
	m.mu.Lock()
	learned := len(m.learned)
	m.mu.Unlock()
	assert.LessOrEqual(t, learned, 3000+minSweep, "the decayed paces were swept, not kept beside the new ones")

	require.NoError(t, m.SetRoute(ctx, "s1", "h0.example", RouteSet{Proxy: "crawl/eu-1", Own: true, Idle: 24 * time.Hour}))
	for i := range 1000 {
		_, err := m.ReportSession(ctx, SessionReport{Session: "s1", Reporter: "team-a", Result: ResultRateLimited, Target: fmt.Sprintf("r%d.example", i), Cooldown: time.Minute, Window: 10 * time.Second})
		require.NoError(t, err)
		clk.Step(time.Second)
	}
	m.mu.Lock()
	reported := len(m.sessions["s1"].reported)
	m.mu.Unlock()
	assert.LessOrEqual(t, reported, 2*minSessionReports, "reports past their window were swept")
}
