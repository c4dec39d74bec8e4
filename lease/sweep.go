package lease

// sweep drops the entries of m that over says are done with, once m has
// doubled since the last sweep (*next, at least least): the memory store's
// host-keyed maps stay as large as what is live in them, at an amortized
// constant cost per write.
func sweep[K comparable, V any](m map[K]V, next *int, least int, over func(V) bool) {
	if len(m) < max(*next, least) {
		return
	}
	for k, v := range m {
		if over(v) {
			delete(m, k)
		}
	}
	*next = max(least, 2*len(m))
}
