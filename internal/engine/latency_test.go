package engine

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestLatencyBuckets(t *testing.T) {
	prev := time.Duration(0)
	for i := range numBuckets {
		ub := upperBound(i)
		if ub <= prev {
			t.Fatalf("bucket %d: upper bound %v not above %v", i, ub, prev)
		}
		if got := bucketOf(ub - time.Microsecond); got != i && ub > time.Microsecond {
			t.Fatalf("bucketOf(%v) = %d, want %d", ub-time.Microsecond, got, i)
		}
		prev = ub
	}
	if bucketOf(-time.Second) != 0 || bucketOf(1000*time.Hour) != numBuckets-1 {
		t.Fatal("out-of-range latencies are not clamped")
	}
}

// With 5% of attempts slow and hedged away (recorded at the time they were
// cut short, just past the delay), the 0.925 quantile stays among the fast
// attempts and hedging never stops; the delay is three times the median
// attempt's (1.5 ms, within a bucket), above the fast attempts.
func TestLatencyQuantileWithCensoredAttempts(t *testing.T) {
	l := NewLatency(0.925)
	if _, ok := l.hedgeDelay(); ok {
		t.Fatal("a delay before any data")
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 5000 {
		d := time.Millisecond + time.Duration(r.Int64N(int64(time.Millisecond))) // 1-2 ms
		if r.Float64() < 0.05 {
			cur, ok := l.hedgeDelay()
			if !ok {
				cur = 300 * time.Millisecond // not warm: the slow attempt ran to the end
			}
			d = cur + 1500*time.Microsecond // cut short when the hedge won
		}
		l.observe(d)
	}
	d, ok := l.hedgeDelay()
	if !ok {
		t.Fatal("no hedging delay after 5000 attempts")
	}
	if d < 4500*time.Microsecond || d > 5200*time.Microsecond {
		t.Fatalf("hedging delay %v, want three times the median attempt (1.5 ms): 4.5-5.2 ms", d)
	}
}

// The floor is three times the median interpolated within its bucket, not
// three times the bucket's upper bound. Explicit samples, 4 of 104 slow
// (50 ms); the delay is recomputed on the 104th observation.
func TestHedgeDelayFloorIsThreeInterpolatedMedians(t *testing.T) {
	for _, tc := range []struct {
		name    string
		samples map[time.Duration]int
		want    time.Duration
	}{{
		// All 100 ordinary attempts in the bucket [1024 µs, 1152 µs): the
		// median is the 52nd of its 100, 1024 + 128·52/100 = 1090.56 µs;
		// three times that, above the 92.5th percentile's bound (1152 µs).
		// (The bucket's bound would give 3456 µs.)
		name:    "one bucket",
		samples: map[time.Duration]int{1100 * time.Microsecond: 100, 50 * time.Millisecond: 4},
		want:    3271680 * time.Nanosecond,
	}, {
		// 50 attempts at 1.9 ms, in [1792 µs, 1920 µs), and 50 at 2.1 ms,
		// in [2048 µs, 2304 µs): the median is the 3rd of the second
		// bucket's 50, 2048 + 256·2/50 = 2058.24 µs, and the delay
		// 6174.72 µs. (The bucket's bound would give 6912 µs, 15% more
		// than three times the median's 2 ms, where the first bucket's
		// would give 5760 µs: the delay jumped by a fifth as the median
		// crossed 2048 µs.)
		name:    "across a bucket edge",
		samples: map[time.Duration]int{1900 * time.Microsecond: 50, 2100 * time.Microsecond: 50, 50 * time.Millisecond: 4},
		want:    6174720 * time.Nanosecond,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			l := NewLatency(0.925)
			// In a fixed mixed order: the delay depends only on the
			// counts when it is recomputed.
			var order []time.Duration
			for d, n := range tc.samples {
				for range n {
					order = append(order, d)
				}
			}
			slices.Sort(order)
			for i := range order {
				l.observe(order[(i*37)%len(order)]) // 37 and 104 are coprime: a permutation
			}
			got, ok := l.hedgeDelay()
			if !ok || got != tc.want {
				t.Fatalf("hedging delay %v, %v; want %v", got, ok, tc.want)
			}
		})
	}
}
