package broker

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/example/egress-proxies-operator/lease"
	"github.com/example/egress-proxies-operator/test/testenv"
)

func TestPolicyIndex(t *testing.T) {
	t0 := time.Unix(1000, 0)
	x := NewPolicyIndex()
	h := x.Handler()
	h.OnAdd(testenv.CrawlTarget("crawl", "wild", "*.example.com", 10, t0), false)
	h.OnAdd(testenv.CrawlTarget("crawl", "shop", "shop.example.com", 2, t0.Add(time.Minute)), false)
	h.OnAdd(testenv.CrawlTarget("crawl", "shop-late", "shop.example.com", 50, t0.Add(time.Hour)), false)
	h.OnAdd(testenv.CrawlTarget("other", "shop", "shop.example.com", 5, t0), false)

	p, ok := x.For("crawl", "shop.example.com")
	assert.True(t, ok)
	assert.Equal(t, "crawl/shop", p.Name, "the exact host beats the wildcard; the older of two for one host wins")
	assert.Equal(t, lease.WindowPace(2, time.Second), p.Pace.Interval, "2 in any second: one each 525ms")
	p, ok = x.For("crawl", "www.example.com")
	assert.True(t, ok)
	assert.Equal(t, "crawl/wild", p.Name)
	_, ok = x.For("crawl", "example.org")
	assert.False(t, ok)
	_, ok = x.For("nobody", "shop.example.com")
	assert.False(t, ok, "a namespace's policies govern its own proxies only")

	names := []string{}
	for _, p := range x.ForHost("shop.example.com") {
		names = append(names, p.Name)
	}
	assert.Equal(t, []string{"crawl/shop", "other/shop"}, names)
	assert.Equal(t, []string{"shop.example.com"}, x.exactHosts())

	h.OnDelete(toolscache.DeletedFinalStateUnknown{Obj: testenv.CrawlTarget("crawl", "shop", "shop.example.com", 2, t0)})
	p, _ = x.For("crawl", "shop.example.com")
	assert.Equal(t, "crawl/shop-late", p.Name, "the next in line takes over")
}

func TestPolicyOfKeepsAReserveOfTheBurst(t *testing.T) {
	ct := testenv.CrawlTarget("crawl", "shop", "shop.example.com", 4, time.Unix(0, 0))
	fleet := int32(100)
	conc := int32(2)
	ct.Spec.FleetRequestsPerInterval, ct.Spec.MaxConcurrentPerIP = &fleet, &conc
	p := PolicyOf(ct)
	assert.Equal(t, lease.Pace{Interval: 262500 * time.Microsecond, Burst: 1, MaxConcurrent: 2, FleetKey: "crawl/shop", FleetInterval: 10500 * time.Microsecond, FleetBurst: 1},
		p.Pace, "a bound over any window: even spacing, 5% kept for jitter, no burst")

	burst := int32(4)
	ct.Spec.Burst = &burst // the token-bucket reading, asked for
	p = PolicyOf(ct)
	assert.Equal(t, lease.Pace{Interval: 250 * time.Millisecond, Burst: 4, MaxConcurrent: 2, FleetKey: "crawl/shop", FleetInterval: 10 * time.Millisecond, FleetBurst: 100}, p.Pace)
	assert.Equal(t, 3, withJitterReserve(p.Pace).Burst)
	assert.Equal(t, 99, withJitterReserve(p.Pace).FleetBurst)
	assert.Equal(t, 1, withJitterReserve(lease.Pace{Interval: time.Second, Burst: 1}).Burst, "a burst of one has nothing to spare")
}
