package breaker

import "sync/atomic"

// window counts attempt outcomes in a ring of windowBuckets time buckets.
// Bucket numbers are the clock's distance from the breaker's epoch divided
// by the bucket width; the ring only moves forward, lazily, when it is told
// the current bucket number.
//
// Everything but addSuccess must be called with the Breaker's mutex held.
// addSuccess is the lock-free fast path for the common case, a success in
// the newest bucket; it races benignly with the rest: at worst, a success
// reported at the very moment the ring moves lands in a neighbouring bucket
// or is dropped.
type window struct {
	head atomic.Int64 // number of the newest bucket
	_    [56]byte     // keep head (read on every success) off the ring's cache line
	ring [windowBuckets]slot
}

type slot struct{ attempts, failures atomic.Int64 }

// addSuccess counts a success in bucket n if n is the newest bucket, and
// reports whether it did. It takes no lock.
func (w *window) addSuccess(n int64) bool {
	if w.head.Load() != n {
		return false
	}
	w.ring[n%windowBuckets].attempts.Add(1)
	return true
}

// advance moves the ring forward to bucket n, clearing the buckets that
// fall out of the window. A number at or before head (a clock that stood
// still or went backwards) changes nothing.
func (w *window) advance(n int64) {
	head := w.head.Load()
	if n <= head {
		return
	}
	if n-head >= windowBuckets {
		w.clear()
		w.head.Store(n)
		return
	}
	for head < n {
		head++
		s := &w.ring[head%windowBuckets]
		s.attempts.Store(0) // clear before publishing head, so that
		s.failures.Store(0) // addSuccess never counts into a stale slot
		w.head.Store(head)
	}
}

// add counts one outcome in bucket n (in the newest bucket if n is older).
func (w *window) add(n int64, failed bool) {
	w.advance(n)
	s := &w.ring[w.head.Load()%windowBuckets]
	s.attempts.Add(1)
	if failed {
		s.failures.Add(1)
	}
}

// totals returns the outcomes counted in the ring.
func (w *window) totals() (attempts, failures int64) {
	for i := range w.ring {
		attempts += w.ring[i].attempts.Load()
		failures += w.ring[i].failures.Load()
	}
	return attempts, failures
}

// clear forgets every outcome; head stays.
func (w *window) clear() {
	for i := range w.ring {
		w.ring[i].attempts.Store(0)
		w.ring[i].failures.Store(0)
	}
}
