package breaker

// window counts attempt outcomes in a ring of windowBuckets time buckets.
// Bucket numbers are the clock's distance from the breaker's epoch divided
// by the bucket width; the ring only moves forward, lazily, when it is told
// the current bucket number. It is not safe for concurrent use: the Breaker
// guards it with its mutex.
type window struct {
	head     int64 // number of the newest bucket
	attempts int64 // totals over the ring
	failures int64
	ring     [windowBuckets]bucket
}

type bucket struct{ attempts, failures int64 }

// advance moves the ring forward to bucket n, dropping the buckets that fall
// out of the window. A number at or before head (a clock that stood still or
// went backwards) changes nothing.
func (w *window) advance(n int64) {
	if n <= w.head {
		return
	}
	if n-w.head >= windowBuckets {
		w.clear()
		w.head = n
		return
	}
	for w.head < n {
		w.head++
		b := &w.ring[w.head%windowBuckets]
		w.attempts -= b.attempts
		w.failures -= b.failures
		*b = bucket{}
	}
}

// add counts one outcome in bucket n (in the newest bucket if n is older).
func (w *window) add(n int64, failed bool) {
	w.advance(n)
	b := &w.ring[w.head%windowBuckets]
	b.attempts++
	w.attempts++
	if failed {
		b.failures++
		w.failures++
	}
}

// clear forgets every outcome; head stays.
func (w *window) clear() {
	w.ring = [windowBuckets]bucket{}
	w.attempts, w.failures = 0, 0
}
