package lease

import (
	"container/heap"
	"time"
)

// The memory store's indexes: the candidate set of one selector, a heap
// of its proxies by load, and the generic heap every index uses.

// candidateSet indexes one set of candidates by load.
type candidateSet struct {
	version uint64
	used    time.Time
	items   map[string]*setItem
	heap    heapOf[*setItem]
}

// pick returns the least-loaded member (of at most maxLoad leases, when
// not negative) for which skip says false; when there is none, "" and the
// soonest end of what held the skipped ones back. Members popped while
// skipping are pushed back.
func (s *candidateSet) pick(skip func(id string) (time.Time, bool), blocked func(id string) float64, maxLoad int) (best string, soonest time.Time, byRecord bool) {
	var skipped []*setItem
	var first *setItem
	bestBlocked := 0.0
	for s.heap.Len() > 0 {
		top := s.heap.items[0]
		if first != nil && (blocked == nil || top.load != first.load || len(skipped) >= maxRecordTies) {
			break
		}
		if maxLoad >= 0 && top.load > maxLoad {
			break
		}
		cooling := skip
		until, cool := cooling(top.id)
		switch {
		case cool:
			if soonest.IsZero() || until.Before(soonest) {
				soonest = until
			}
		case first == nil:
			first, best = top, top.id
			if blocked != nil {
				bestBlocked = blocked(top.id)
			}
		default:
			if b := blocked(top.id); betterRecord(b, bestBlocked) {
				best, bestBlocked, byRecord = top.id, b, true
			}
		}
		if first != nil && blocked == nil {
			break
		}
		skipped = append(skipped, heap.Pop(&s.heap).(*setItem))
	}
	for _, it := range skipped {
		heap.Push(&s.heap, it)
	}
	return best, soonest, byRecord
}

type setItem struct {
	id         string
	load       int
	lastLeased time.Time
	index      int
}

// leaseFirst orders a set's members: the fewest leases, then the least
// recently leased, then by id (so a new set's ties are stable).
func leaseFirst(a, b *setItem) bool {
	if a.load != b.load {
		return a.load < b.load
	}
	if !a.lastLeased.Equal(b.lastLeased) {
		return a.lastLeased.Before(b.lastLeased)
	}
	return a.id < b.id
}

func (it *setItem) setIndex(i int) { it.index = i }

type memLease struct {
	Lease
	index int
	// limit is the Limit key it counts under ("" for none).
	limit string
	// hostLoad is the key of the host load it counts in (hostLoadKey):
	// its proxy's, or its pace's bucket's; "" for no target.
	hostLoad string
}

func (l *memLease) setIndex(i int) { l.index = i }

type cooldownEnd struct {
	proxy, target string
	until         time.Time
}

// setIndex: cooldown ends are only ever popped, never fixed in place.
func (*cooldownEnd) setIndex(int) {}

// heapOf is a container/heap of items that remember their place in it, for
// heap.Fix and heap.Remove: the store's three heaps (set members, leases by
// end, cooldowns by end) differ only in their order.
type heapOf[T interface{ setIndex(int) }] struct {
	items []T
	less  func(a, b T) bool
}

func (h *heapOf[T]) Len() int { return len(h.items) }

func (h *heapOf[T]) Less(i, j int) bool { return h.less(h.items[i], h.items[j]) }

func (h *heapOf[T]) Swap(i, j int) {
	h.items[i], h.items[j] = h.items[j], h.items[i]
	h.items[i].setIndex(i)
	h.items[j].setIndex(j)
}

func (h *heapOf[T]) Push(x any) {
	it := x.(T)
	it.setIndex(len(h.items))
	h.items = append(h.items, it)
}

// maxRecordTies bounds the least-loaded candidates a lease compares by
// their record with its target: enough to steer clear of the few a host
// blocked, at a bounded cost per lease.
const maxRecordTies = 16

func (h *heapOf[T]) Pop() any {
	last := len(h.items) - 1
	it := h.items[last]
	var zero T
	h.items[last] = zero // no reference kept past the heap
	h.items = h.items[:last]
	return it
}

// setLocked returns the index for c, building it when it is new or its
// version moved.
func (m *MemoryStore) setLocked(c Candidates, now time.Time) *candidateSet {
	s, ok := m.sets[c.Key]
	if ok && s.version == c.Version && len(s.items) == len(c.IDs) {
		s.used = now
		return s
	}
	if !ok && c.Key != "" && len(m.sets) >= maxCandidateSets {
		var oldest string
		for k, other := range m.sets {
			if oldest == "" || other.used.Before(m.sets[oldest].used) {
				oldest = k
			}
		}
		delete(m.sets, oldest)
	}
	fresh := &candidateSet{version: c.Version, used: now, items: make(map[string]*setItem, len(c.IDs)),
		heap: heapOf[*setItem]{items: make([]*setItem, 0, len(c.IDs)), less: leaseFirst}}
	for _, id := range c.IDs {
		it := &setItem{id: id, load: m.loads[id]}
		if s != nil {
			if prev, ok := s.items[id]; ok {
				it.lastLeased = prev.lastLeased
			}
		}
		it.index = len(fresh.heap.items)
		fresh.items[id] = it
		fresh.heap.items = append(fresh.heap.items, it)
	}
	heap.Init(&fresh.heap)
	if c.Key != "" { // no key: an index for this call only
		m.sets[c.Key] = fresh
	}
	return fresh
}
