package overload

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// unlimited is the limit of a method that is not overloaded.
const unlimited = math.MaxInt64

// none marks a minimum that no request of the window set.
const none = math.MaxInt64

// Limiter constants.
const (
	// minWindowSamples is the least number of ends a window needs.
	minWindowSamples = 5
	// engageAfter is how many overloaded windows in a row engage a limit.
	engageAfter = 2
	// The baseline follows each window's minimum latency by alpha, and by
	// alphaOver in an overloaded or draining window, so that a lasting
	// change of the method's latency is learned (in about 5 s, or 50 s
	// while overloaded, at 100 ms windows) and an overload of seconds is
	// not.
	alpha     = 0.02
	alphaOver = alpha / 10
	// deadlineQuantile is the quantile of the arrivals' remaining
	// deadlines that DeadlineShare applies to.
	deadlineQuantile = 0.1
	// growthWindows is how many windows back the requests in flight are
	// compared with, in two halves, to tell a queue that grows from the
	// noise of one that stands, and from the step of a method that became
	// slower (at the same arrival rate, more requests are in flight).
	growthWindows = 6
	// growthSigmas is how many square roots of the requests in flight at
	// the start of a half (about their standard deviation when arrivals
	// are random) they must have grown by in it, besides MinLimit.
	growthSigmas = 3
)

// limiter is a method's adaptive concurrency limit: a gradient limiter in
// the manner of Netflix's concurrency-limits (limit × the ratio of the
// tolerated latency to the current one, clamped to [0.5, 1], plus
// headroom while within tolerance), changed so that it does not refuse a
// server that keeps up:
//
//   - it measures each window's minimum latency, not its mean: a standing
//     queue delays every request, a burst or a pause only some (CoDel's
//     observation);
//   - it learns only what a request proves: the latency of a request that
//     completed (Done), and, of one that ended before it completed
//     (Abandon: its caller left, or its deadline passed), only that it
//     took longer than its elapsed time, which counts when even that
//     exceeds the tolerated latency and is never learned as a baseline;
//   - the tolerated latency is the larger of Tolerance × the baseline (the
//     minimum latency learned over time) and DeadlineShare × the 10th
//     percentile of the deadlines left to the requests arriving in the
//     window: while requests finish well within their callers' deadlines,
//     shedding one only loses it;
//   - slowness alone is no overload: a window is overloaded only when its
//     latency is beyond tolerance and the method fails to keep up, its
//     queue growing (the requests in flight rose during the window and,
//     over the last growthWindows windows, beyond noise) or its callers
//     missing their deadlines (refused on arrival, or ended after them;
//     deadlines shorter than Tolerance × the baseline, which the method
//     could not meet even when idle, do not count) without the requests in
//     flight falling. A window that is slow while the method keeps up
//     teaches the baseline the new latency at the normal rate, and lets an
//     engaged limit grow;
//   - it starts unlimited, engages after engageAfter overloaded windows in
//     a row at the concurrency that would have the tolerated latency at
//     the window's throughput (Little's law) or the window's peak in
//     flight if lower, shrinks only in overloaded windows, and lets go
//     once fewer than half the limit are in flight while the method keeps
//     up.
type limiter struct {
	limit  atomic.Int64 // unlimited, or the current limit (≥ minLimit)
	base   atomic.Int64 // ns; the baseline, for readers without mu; 0 until known
	target atomic.Int64 // ns; the latency the last window tolerated; 0 until known
	// little is the concurrency that has the target latency at the last
	// window's throughput (Little's law), at least MinLimit: where a limit
	// would engage, and where sheddable requests are shed while none is
	// engaged. 0 until known.
	little atomic.Int64
	// queued: the last window's least completed latency was beyond
	// Tolerance × the baseline: every request of it waited in a queue.
	// Admission then judges by the queue (see Method.needAt).
	queued atomic.Bool

	// The current window, added to without a lock.
	start   atomic.Int64 // ns; when the window began
	from    atomic.Int64 // requests in flight when the window began
	n       atomic.Int64 // ends
	minDone atomic.Int64 // ns; least latency of a request that completed; none
	minCut  atomic.Int64 // ns; least elapsed time beyond target of one cut short; none
	peak    atomic.Int64 // most requests in flight seen at an admission
	missed  atomic.Int64 // callers that missed a deadline the method could meet
	left    [numBuckets]atomic.Uint32
	nLeft   atomic.Uint32

	mu       sync.Mutex               // held by the one goroutine that closes a window
	baseline float64                  // ns; 0 until the first window with a completed request
	over     int                      // overloaded windows in a row
	ends     [growthWindows + 1]int64 // requests in flight at the last windows' ends (a ring)
	nEnds    int                      // windows closed
	missedAt int                      // the last window (nEnds) in which callers missed deadlines; 0: none
	stake    bool                     // callers missed deadlines while the limit was engaged
	held     bool                     // requests waited for a place at the last window's close
}

func (l *limiter) init() {
	l.limit.Store(unlimited)
	l.minDone.Store(none)
	l.minCut.Store(none)
}

// arrived records a request arriving with n requests in flight (itself
// included) and, if it has a deadline the Guard believes, left ns to it.
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

// meetable reports whether a deadline of left ns is one the method meets
// when it is not overloaded (at least Tolerance × its baseline), so that
// missing it says something of the method rather than of the caller.
func (l *limiter) meetable(left int64, s *settings) bool {
	b := l.base.Load()
	return b > 0 && float64(left) >= s.tolerance*float64(b)
}

// miss records a caller that missed a meetable deadline.
func (l *limiter) miss() { l.missed.Add(1) }

// lower sets *m to d if d is lower.
func lower(m *atomic.Int64, d int64) {
	for {
		v := m.Load()
		if d >= v || m.CompareAndSwap(v, d) {
			return
		}
	}
}

// closed is what a window saw, at its close.
type closed struct {
	done, cut      int64   // ns; least latency completed, least elapsed cut short; none
	tolerable      float64 // ns the arrivals' deadlines tolerate; 0: none had one
	rate           float64 // ends per ns
	peak           int64   // most in flight at an admission
	from, inflight int64   // in flight at the start and at the end
	missed         int64
	waiting        bool // requests waited for a place when it closed
}

// observe adds the end of a request that took d ns and ended at now,
// having completed or (completed false) been cut short, and closes the
// window when it is due: after LimitWindow, with at least
// minWindowSamples ends.
//
// waiting says whether requests wait for a place under the limit (see
// gate): the latency of the requests in flight is then one the limit
// chose, and the baseline does not learn it.
func (l *limiter) observe(now, d int64, completed bool, s *settings, inflight int64, waiting bool) {
	n := l.n.Add(1)
	if completed {
		lower(&l.minDone, d)
	} else if d > l.target.Load() {
		// Only a request cut short after more than the tolerated latency
		// proves anything to the limit; one cancelled sooner must not hide
		// it.
		lower(&l.minCut, d)
	}
	if now-l.start.Load() < int64(s.limitWindow) || n < minWindowSamples || !l.mu.TryLock() {
		return
	}
	defer l.mu.Unlock()
	if now-l.start.Load() < int64(s.limitWindow) {
		return // another goroutine just closed it
	}
	start := l.start.Swap(now)
	w := closed{
		from:     l.from.Swap(inflight),
		inflight: inflight,
		done:     l.minDone.Swap(none),
		cut:      l.minCut.Swap(none),
		peak:     max(l.peak.Swap(inflight), inflight),
		missed:   l.missed.Swap(0),
		waiting:  waiting,
	}
	n = l.n.Swap(0)
	w.rate = float64(n) / float64(now-start)
	var left [numBuckets]uint32
	nLeft := l.nLeft.Swap(0)
	for i := range l.left {
		left[i] = l.left[i].Swap(0)
	}
	if nLeft > 0 {
		w.tolerable = s.deadlineShare * float64(quantileOf(&left, uint64(nLeft), deadlineQuantile))
	}
	l.update(w, s)
}

// grew records the requests in flight at the end of a window that began
// with from of them, and reports whether the method's queue grows: they
// rose during the window, and in each half of the last growthWindows
// windows by more than MinLimit + growthSigmas × √(what was in flight at
// the half's start). A step (the requests in flight of a method that
// became slower) rises in one half only. Called with mu held.
func (l *limiter) grew(from, inflight int64, s *settings) bool {
	const half = growthWindows / 2
	k := l.nEnds
	l.ends[k%len(l.ends)] = inflight
	l.nEnds++
	if k < growthWindows {
		return false
	}
	mid, old := l.ends[(k-half)%len(l.ends)], l.ends[(k-growthWindows)%len(l.ends)]
	rose := func(a, b int64) bool {
		return float64(b-a) > float64(s.minLimit)+growthSigmas*math.Sqrt(float64(max(a, 0)))
	}
	return inflight > from && rose(old, mid) && rose(mid, inflight)
}

// learn moves the baseline towards the least completed latency of a window
// by a; not while requests wait for a place (held).
func (l *limiter) learn(done int64, a float64) {
	if done == none || l.held {
		return
	}
	l.baseline += (float64(done) - l.baseline) * a
	l.base.Store(int64(l.baseline))
}

// update applies one window. Called with mu held.
func (l *limiter) update(w closed, s *settings) {
	l.held = w.waiting
	growing := l.grew(w.from, w.inflight, s)
	if l.baseline == 0 {
		if w.done != none {
			l.baseline = float64(w.done)
			l.base.Store(w.done)
		}
		return
	}
	if w.done != none {
		l.queued.Store(float64(w.done) > s.tolerance*l.baseline)
	}
	target := max(s.tolerance*l.baseline, w.tolerable)
	l.target.Store(int64(target))
	l.little.Store(max(s.minLimit, int64(math.Ceil(w.rate*target))))
	// The least latency the window proves: that of a request that
	// completed, or the elapsed time of one cut short if even that is
	// beyond the target (it waited at least that long).
	minLat := w.done
	if w.cut != none && float64(w.cut) > target {
		minLat = min(minLat, w.cut)
	}
	if minLat == none {
		return // only requests cut short early: they prove nothing
	}
	limit := l.limit.Load()
	// A backlog drains: the requests in flight fell, beyond the noise of
	// a queue that stands (√ of them).
	draining := float64(w.from-w.inflight) > math.Sqrt(float64(max(w.from, 0)))
	// The method fails to keep up: its queue grows, or its callers miss
	// deadlines it could meet (unless a backlog drains: the requests that
	// waited through a pause miss theirs). Misses are events, a few per
	// window or fewer: they are remembered for growthWindows.
	if w.missed > 0 && !draining {
		l.missedAt = l.nEnds
	}
	pressed := growing || (l.missedAt > 0 && l.nEnds-l.missedAt < growthWindows)
	if float64(minLat) <= target {
		l.keptUp(w, limit)
		return
	}
	l.slow(w, s, limit, target, minLat, pressed, draining)
}

// keptUp applies a window whose latency was tolerable: the baseline
// learns it, and an engaged limit grows. Called with mu held.
func (l *limiter) keptUp(w closed, limit int64) {
	l.over = 0
	l.learn(w.done, alpha)
	if l.baseline > 2*float64(w.done) && !l.held {
		// Back to normal after a long overload that the baseline had
		// partly learned: forget it faster (as Gradient2 does).
		l.baseline = max(float64(w.done), l.baseline*0.9)
		l.base.Store(int64(l.baseline))
	}
	l.relax(limit, w.peak)
}

// slow applies a window whose latency was beyond the target: a limit is
// engaged or shrunk only if the method fails to keep up (pressed), or
// under a limit that engaged while deadlines were at stake. Called with mu
// held.
func (l *limiter) slow(w closed, s *settings, limit int64, target float64, minLat int64, pressed, draining bool) {
	if limit != unlimited && l.missedAt > 0 && l.nEnds-l.missedAt < growthWindows {
		l.stake = true
	}
	switch {
	case draining:
		// A backlog says nothing of the limit: it holds.
		l.over = 0
		l.learn(w.done, alphaOver)
		return
	case !pressed && limit == unlimited:
		// Slower, not queued: the method keeps up, and its latency now is
		// learned at the normal rate.
		l.over = 0
		l.learn(w.done, alpha)
		return
	case !pressed && !l.stake:
		// A limit engaged by a queue that grew, with no deadline at
		// stake: while the method keeps up, it grows again, and lets go
		// once it no longer binds, so that a method that is only slower
		// is not held back.
		l.over = 0
		l.learn(w.done, alphaOver)
		l.relax(limit, w.peak)
		return
	}
	// Overloaded (slow, and the queue grows or callers miss their
	// deadlines), or slow under a limit that engaged while they did: the
	// latency is a queue the limit shortens.
	l.learn(w.done, alphaOver)
	if limit == unlimited {
		if l.over++; l.over < engageAfter {
			return
		}
		// Engage at the concurrency that, at the throughput of the
		// window, has the target latency (Little's law), if that is
		// below the peak.
		l.limit.Store(max(s.minLimit, min(w.peak, int64(math.Ceil(w.rate*target)))))
		l.stake = l.missedAt > 0 && l.nEnds-l.missedAt < growthWindows
		return
	}
	if w.peak > limit {
		// Still working off what was admitted before the limit engaged
		// or shrank: the latency says nothing about the limit yet.
		return
	}
	g := max(0.5, target/float64(minLat))
	l.limit.Store(max(s.minLimit, int64(float64(limit)*g)))
}

// relax grows an engaged limit while the method keeps up, or lets it go
// once fewer than half of it were in flight. Called with mu held.
func (l *limiter) relax(limit, peak int64) {
	switch {
	case limit == unlimited:
	case peak < limit/2:
		l.limit.Store(unlimited) // the limit no longer binds
		l.stake = false
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
