package overload

import (
	"time"

	"github.com/stormguard/stormguard/internal/loghist"
	"github.com/stormguard/stormguard/internal/window"
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
func quantileOf[C uint32 | int64](counts *[numBuckets]C, n uint64, q float64) time.Duration {
	if i, ok := loghist.Quantile(counts[:], n, q); ok {
		return upperBound(i)
	}
	return upperBound(numBuckets - 1)
}

// newHistory returns a method's history of recent handler latencies:
// numSlots histograms of span/numSlots each, on the Guard's time line,
// in a window.Counter (one kind per bucket). An observation costs two
// atomic operations (more when it starts a slot) and keeps no lock.
func newHistory(span time.Duration) *window.Counter {
	return window.New(numSlots, numBuckets, span/numSlots)
}

// summary is what admission needs of a history.
type summary struct {
	n    int           // latencies in the window
	q    time.Duration // their q-quantile (bucket upper bound)
	span int64         // ns of time line the window covers
	// The latencies that ended in the newest recentSlots slots (the last
	// quarter to half of the window, at the default four slots), and the ns
	// of time line they cover: the rate requests end at lately.
	recent     int
	recentSpan int64
}

// recentSlots is how many of the newest slots of a history are its recent
// part (see summary).
const recentSlots = 2

// summarize returns the latencies of h's slots that are still in the
// window at now (ns on the time line): the current slot and the
// numSlots-1 before it.
func summarize(h *window.Counter, now int64, q float64, born int64) summary {
	var counts, older [numBuckets]int64
	h.Sum(now, 0, recentSlots, counts[:])
	var sum summary
	for _, c := range counts {
		sum.recent += int(c)
	}
	h.Sum(now, recentSlots, numSlots, older[:])
	for i, c := range older {
		counts[i] += c
	}
	for _, c := range counts {
		sum.n += int(c)
	}
	// The window reaches back numSlots-1 whole slots before the current
	// one, or to when the history was born; its recent part recentSlots-1.
	width := int64(h.Width())
	slot := h.Slot(now)
	sum.span = now - max((slot-(numSlots-1))*width, born)
	sum.recentSpan = now - max((slot-(recentSlots-1))*width, born)
	if sum.n > 0 {
		sum.q = quantileOf(&counts, uint64(sum.n), q)
	}
	return sum
}
