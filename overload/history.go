package overload

import (
	"sync/atomic"
	"time"

	"github.com/stormguard/stormguard/internal/loghist"
)

// The latency histogram: 8 linear buckets of 1µs, then 4 per power of two
// (about 19% wide) up to 2³² µs (71 minutes); longer latencies share the
// last bucket.
const (
	numBuckets = 8 + 30*4 // 128
	numSlots   = 4
)

var layout = loghist.Layout{K: 2, N: numBuckets}

func bucketOf(d time.Duration) int { return layout.Bucket(d) }

// upperBound is the upper bound of bucket i (see loghist.Layout).
func upperBound(i int) time.Duration { return layout.UpperBound(i) }

// quantileOf returns the q-quantile (a bucket's upper bound) of counts,
// which hold n values in all.
func quantileOf(counts *[numBuckets]uint32, n uint32, q float64) time.Duration {
	if i, ok := loghist.Quantile(counts[:], uint64(n), q); ok {
		return upperBound(i)
	}
	return upperBound(numBuckets - 1)
}

// history is a method's recent handler latencies: numSlots histograms of
// width each, on the Guard's time line, reused round-robin. An observation
// costs three atomic operations (four when it starts a slot). It keeps no
// lock: a slot being reset may lose an observation made at the same
// instant, which only makes the history a little thinner.
type history struct {
	width int64 // ns per slot
	slots [numSlots]slot
}

type slot struct {
	period atomic.Int64 // the slot's period number + 1; 0: never used
	counts [numBuckets]atomic.Uint32
}

// observe records a latency d that ended at now (ns on the time line).
func (h *history) observe(now int64, d time.Duration) {
	p := now/h.width + 1
	s := &h.slots[p%numSlots]
	if old := s.period.Load(); old != p && old < p && s.period.CompareAndSwap(old, p) {
		for i := range s.counts {
			s.counts[i].Store(0)
		}
	}
	s.counts[bucketOf(d)].Add(1)
}

// summary is what admission needs of a history.
type summary struct {
	n    int           // latencies in the window
	q    time.Duration // their q-quantile (bucket upper bound)
	span int64         // ns of time line the window covers
}

// summarize returns the latencies of the slots that are still in the
// window at now: the current period and the numSlots-1 before it.
func (h *history) summarize(now int64, q float64, born int64) summary {
	p := now/h.width + 1
	var counts [numBuckets]uint32
	var sum summary
	for i := range h.slots {
		s := &h.slots[i]
		if sp := s.period.Load(); sp <= p-numSlots || sp > p {
			continue
		}
		for b := range counts {
			c := s.counts[b].Load()
			counts[b] += c
			sum.n += int(c)
		}
	}
	// The window reaches back numSlots-1 whole slots before the current
	// one, or to when the history was born.
	sum.span = now - max((p-numSlots)*h.width, born)
	if sum.n > 0 {
		sum.q = quantileOf(&counts, uint32(sum.n), q)
	}
	return sum
}
