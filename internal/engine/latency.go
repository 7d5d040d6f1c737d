package engine

import (
	"sync/atomic"
	"time"

	"github.com/stormguard/stormguard/internal/loghist"
)

// Latency tracks one route's attempt latencies in a log-linear histogram
// (about 12% wide buckets from 1µs to hours) to choose an adaptive hedging
// delay: the q-quantile of recent attempts, and at least hedgeFloor times
// their median. An attempt only a little slower than most is about to
// answer: hedging it mostly adds load. Where most attempts take about the
// same time and a few take far longer (a long tail), the quantile alone
// falls among the ordinary ones and hedges them by the hundred for each
// slow one it rescues; the floor keeps hedges to the attempts that are
// slow for their method. The median is interpolated within its bucket (as
// if the bucket's attempts were spread evenly over it), not taken at the
// bucket's upper bound: that bound overstates the median, and so the
// floor, by up to a bucket's width (12.5%), a delay that every slow
// attempt's caller waits out in full, and makes the floor jump whenever
// the median crosses a bucket's edge. See delayOf. It is lock-free: an
// observation is two atomic adds; every recomputeEvery observations, one
// of them recomputes the delay. Counts are halved when they pass decayAt,
// so the delay follows the latency of the last few thousand attempts.
//
// An attempt cancelled because another attempt won is recorded at the time
// it had run when it was cancelled: a lower bound of its latency. Quantiles
// at or below the current hedging delay stay exact (every such attempt ran
// past the delay), and the estimate cannot run away upwards; recording such
// attempts as "longer than anything" instead would make the quantile land
// among them whenever hedges win more often than the budget ratio, and stop
// hedging exactly when it helps.
//
// Make one with NewLatency; a Latency is safe for concurrent use.
type Latency struct {
	q       float64
	buckets [numBuckets]atomic.Uint32
	n       atomic.Uint32
	delay   atomic.Int64 // ns; -1 until warm
}

const (
	// hedgeFloor is how many times the median attempt an attempt runs
	// before it is hedged.
	hedgeFloor     = 3
	numBuckets     = 16 + 34*8 // 16 linear buckets of 1µs, then 8 per power of two
	warmup         = 20        // observations before the first delay
	recomputeEvery = 8         // observations between recomputations
	decayAt        = 2048      // halve the counts beyond this total
)

var layout = loghist.Layout{K: 3, N: numBuckets}

// NewLatency returns the Latency of a route that hedges at the q-quantile
// of its attempts.
func NewLatency(q float64) *Latency {
	l := &Latency{q: q}
	l.delay.Store(-1)
	return l
}

func bucketOf(d time.Duration) int { return layout.Bucket(d) }

// upperBound is the upper bound of bucket i (see loghist.Layout).
func upperBound(i int) time.Duration { return layout.UpperBound(i) }

// observe records an attempt that took d (or, if it was cancelled, had run
// for d).
func (l *Latency) observe(d time.Duration) {
	l.buckets[bucketOf(d)].Add(1)
	if n := l.n.Add(1); n >= warmup && n%recomputeEvery == 0 {
		l.recompute()
	}
}

func (l *Latency) recompute() {
	var counts [numBuckets]uint32
	var total uint64
	for i := range l.buckets {
		counts[i] = l.buckets[i].Load()
		total += uint64(counts[i])
	}
	if total == 0 {
		return
	}
	l.delay.Store(delayOf(&counts, total, l.q))
	if total > decayAt {
		for i := range l.buckets {
			l.buckets[i].Store(l.buckets[i].Load() / 2)
		}
	}
}

// delayOf returns the hedging delay in ns for counts, which hold total
// observations: the upper bound of the q-quantile's bucket, and at least
// hedgeFloor times the median, interpolated within its bucket; -1 if
// counts hold fewer than total. It is cheap: two passes over the buckets,
// no sorting.
func delayOf(counts *[numBuckets]uint32, total uint64, q float64) int64 {
	i, ok := loghist.Quantile(counts[:], total, q)
	if !ok {
		return -1
	}
	d := int64(upperBound(i))
	// The median: the rank total/2 among the attempts of its bucket m,
	// spread evenly between the bucket's bounds.
	rank := total / 2
	var below uint64 // the attempts in the buckets before m
	for m, c := range counts {
		if below+uint64(c) <= rank {
			below += uint64(c)
			continue
		}
		lo := int64(0)
		if m > 0 {
			lo = int64(upperBound(m - 1))
		}
		width := int64(upperBound(m)) - lo
		median := lo + int64(float64(width)*float64(rank-below)/float64(c))
		return max(d, hedgeFloor*median)
	}
	return d
}

// hedgeDelay returns the adaptive delay, or false while there is not enough
// data.
func (l *Latency) hedgeDelay() (time.Duration, bool) {
	d := l.delay.Load()
	return time.Duration(d), d >= 0
}
