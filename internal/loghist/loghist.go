// Package loghist is the log-linear latency histogram layout that the
// interceptor's adaptive hedging delay and the overload package's
// admission share: exact 1µs buckets for the shortest latencies, then a
// fixed number of buckets per power of two.
package loghist

import (
	"math/bits"
	"time"
)

// Layout is a histogram of N buckets: 2^(K+1) linear buckets of 1µs, then
// 2^K buckets per power of two (each at most 1/2^K of its lower bound
// wide); latencies past the last bucket share it, negative ones fall in
// the first. K must be at least 1 and N at least 2^(K+1).
type Layout struct{ K, N int }

// Bucket returns the bucket of latency d.
func (l Layout) Bucket(d time.Duration) int {
	us := uint64(max(d, 0) / time.Microsecond)
	lin := uint64(2) << l.K
	if us < lin {
		return int(us)
	}
	e := bits.Len64(us) - 1 // ≥ K+1
	sub := int(us>>(e-l.K)) & (1<<l.K - 1)
	return min(int(lin)+(e-l.K-1)<<l.K+sub, l.N-1)
}

// UpperBound returns the upper bound of bucket i: every latency in it is
// shorter, and every latency in bucket i+1 at least as long.
func (l Layout) UpperBound(i int) time.Duration {
	lin := 2 << l.K
	if i < lin {
		return time.Duration(i+1) * time.Microsecond
	}
	e := (i-lin)>>l.K + l.K + 1
	sub := (i - lin) & (1<<l.K - 1)
	return time.Duration(uint64(1<<l.K+sub+1)<<(e-l.K)) * time.Microsecond
}

// Quantile returns the bucket that holds the q-quantile of counts, which
// hold n values in all: the first bucket where the cumulative count
// reaches the rank q·n + 1. It returns false when counts hold fewer.
func Quantile[C ~uint32 | ~uint64 | ~int64](counts []C, n uint64, q float64) (int, bool) {
	rank := uint64(q*float64(n)) + 1
	var cum uint64
	for i, c := range counts {
		if cum += uint64(c); cum >= rank {
			return i, true
		}
	}
	return 0, false
}
