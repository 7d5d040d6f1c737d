package engine

import (
	"math/rand/v2"
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
