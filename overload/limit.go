package overload

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// unlimited is the limit of a method whose latency shows no standing
// queue.
const unlimited = math.MaxInt64

// Limiter constants.
const (
	// minWindowSamples is the least number of latencies a window needs.
	minWindowSamples = 5
	// engageAfter is how many overloaded windows in a row engage a limit.
	engageAfter = 2
	// The baseline follows each window's minimum latency by alpha, and by
	// alphaOver in an overloaded window, so that a lasting change of the
	// method's latency is learned (in about 5 s, or 50 s while
	// overloaded, at 100 ms windows) and an overload of seconds is not.
	alpha     = 0.02
	alphaOver = alpha / 10
	// deadlineQuantile is the quantile of the arrivals' remaining
	// deadlines that DeadlineShare applies to.
	deadlineQuantile = 0.1
)

// limiter is a method's adaptive concurrency limit: a gradient limiter in
// the manner of Netflix's concurrency-limits (limit × the ratio of the
// tolerated latency to the current one, clamped to [0.5, 1], plus
// headroom while within tolerance), changed so that it does not refuse a
// server that is not overloaded:
//
//   - it measures each window's minimum latency, not its mean: a standing
//     queue delays every request, a burst or a pause only some (CoDel's
//     observation);
//   - the tolerated latency is the larger of Tolerance × the baseline (the
//     minimum latency learned over time) and DeadlineShare × the 10th
//     percentile of the deadlines left to the requests arriving in the
//     window: while requests finish well within their callers' deadlines,
//     shedding one only loses it;
//   - it starts unlimited, engages only after engageAfter overloaded
//     windows in a row in which the requests in flight did not fall (a
//     server catching up after a pause has a backlog, not a standing
//     queue), at the concurrency that would have the tolerated
//     latency at the window's throughput (Little's law) or the window's
//     peak in flight if lower, and lets go again once the latency is
//     tolerable and fewer than half the limit are in flight.
type limiter struct {
	limit atomic.Int64 // unlimited, or the current limit (≥ minLimit)

	// The current window, added to without a lock.
	start  atomic.Int64 // ns; when the window began
	from   atomic.Int64 // requests in flight when the window began
	n      atomic.Int64 // latencies
	minLat atomic.Int64 // ns; math.MaxInt64 when none
	peak   atomic.Int64 // most requests in flight seen at an admission
	left   [numBuckets]atomic.Uint32
	nLeft  atomic.Uint32

	mu       sync.Mutex // held by the one goroutine that closes a window
	baseline float64    // ns; 0 until the first window
	over     int        // overloaded windows in a row
}

func (l *limiter) init(now int64) {
	l.limit.Store(unlimited)
	l.start.Store(now)
	l.minLat.Store(math.MaxInt64)
}

// arrived records a request arriving with n requests in flight (itself
// included) and, if it has one, left ns to its deadline.
func (l *limiter) arrived(n, left int64, hasDeadline bool) {
	for {
		p := l.peak.Load()
		if n <= p || l.peak.CompareAndSwap(p, n) {
			break
		}
	}
	if hasDeadline {
		l.left[bucketOf(time.Duration(left))].Add(1)
		l.nLeft.Add(1)
	}
}

// observe adds a latency of d ns that ended at now, and closes the window
// when it is due: after LimitWindow, with at least minWindowSamples
// latencies.
func (l *limiter) observe(now, d int64, s *settings, inflight int64) {
	n := l.n.Add(1)
	for {
		m := l.minLat.Load()
		if d >= m || l.minLat.CompareAndSwap(m, d) {
			break
		}
	}
	if now-l.start.Load() < int64(s.limitWindow) || n < minWindowSamples || !l.mu.TryLock() {
		return
	}
	defer l.mu.Unlock()
	if now-l.start.Load() < int64(s.limitWindow) {
		return // another goroutine just closed it
	}
	start := l.start.Swap(now)
	from := l.from.Swap(inflight)
	n = l.n.Swap(0)
	minLat := l.minLat.Swap(math.MaxInt64)
	peak := max(l.peak.Swap(inflight), inflight)
	var left [numBuckets]uint32
	nLeft := l.nLeft.Swap(0)
	for i := range l.left {
		left[i] = l.left[i].Swap(0)
	}
	if minLat == math.MaxInt64 {
		return
	}
	tolerable := 0.0
	if nLeft > 0 {
		tolerable = s.deadlineShare * float64(quantileOf(&left, nLeft, deadlineQuantile))
	}
	l.update(float64(minLat), tolerable, float64(n)/float64(now-start), peak, inflight < from, s)
}

// update applies one window: its minimum latency, the latency its
// arrivals' deadlines tolerate (0: none had one), its throughput (ends per
// ns), its peak concurrency, and whether fewer requests are in flight at
// its end than at its start. Called with mu held.
func (l *limiter) update(minLat, tolerable, rate float64, peak int64, draining bool, s *settings) {
	if l.baseline == 0 {
		l.baseline = minLat
		return
	}
	target := max(s.tolerance*l.baseline, tolerable)
	limit := l.limit.Load()
	if minLat > target {
		l.baseline += (minLat - l.baseline) * alphaOver
		if limit == unlimited {
			if draining {
				// Slow, but catching up: the backlog of a pause, not a
				// standing queue.
				l.over = 0
				return
			}
			if l.over++; l.over < engageAfter {
				return
			}
			// Engage at the concurrency that, at the throughput of the
			// window, has the target latency (Little's law), if that is
			// below the peak.
			l.limit.Store(max(s.minLimit, min(peak, int64(math.Ceil(rate*target)))))
			return
		}
		if peak > limit {
			// Still working off what was admitted before the limit
			// engaged or shrank: the latency says nothing about the
			// limit yet.
			return
		}
		g := max(0.5, target/minLat)
		l.limit.Store(max(s.minLimit, int64(float64(limit)*g)))
		return
	}
	l.over = 0
	l.baseline += (minLat - l.baseline) * alpha
	if l.baseline > 2*minLat {
		// Back to normal after a long overload that the baseline had
		// partly learned: forget it faster (as Gradient2 does).
		l.baseline = max(minLat, l.baseline*0.9)
	}
	switch {
	case limit == unlimited:
	case peak < limit/2:
		l.limit.Store(unlimited) // the limit no longer binds
	default:
		l.limit.Store(limit + headroom(limit))
	}
}

// headroom is how much a limit grows per window while the latency is
// tolerable: the square root of the limit, at least 4 (Netflix's queue
// size).
func headroom(limit int64) int64 {
	return max(4, int64(math.Sqrt(float64(limit))))
}
