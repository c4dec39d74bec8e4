package broker

import (
	"context"

	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/example/egress-proxies-operator/lease"
)

// MaxSameSender bounds the other proxies one refusal is carried to (those
// sites see as the same sender, View.SameSender), so that one report costs
// a bounded number of store writes however many proxies share a /64.
const MaxSameSender = 32

// refusedSender carries a refusal of proxy by host to every other proxy
// sites see as the same sender (an IPv4 address, the /64 of an IPv6 one:
// netid; a dual-stack proxy's IPv6 range's for a host reached over IPv6): a site that blocked or pushed back one of them refused the
// sender, so the others are refused too and cool for the same time,
// reported by the same reporter (one tenant's word stays one voice for the
// ban judge). Outcomes other than refusals are the proxy's own.
func (b *Broker) refusedSender(ctx context.Context, proxy, host string, o lease.Outcome) {
	if !o.Blocked || b.opts.View == nil {
		return
	}
	for _, other := range b.opts.View.SameSender(proxy, b.families.overIPv6Of(ctx, host), MaxSameSender) {
		if err := b.store.RecordOutcome(ctx, other, host, o); err != nil {
			logf.FromContext(ctx).Error(err, "carrying a refusal to a proxy of the same sender", "proxy", other, "sender", proxy, "host", host)
			return
		}
	}
}
