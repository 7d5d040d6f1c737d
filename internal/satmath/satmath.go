// Package satmath is saturating integer arithmetic, for times and counts
// that must not wrap around when a caller gives absurd values: a sum or
// product beyond the range of int64 is the nearest limit instead.
package satmath

import (
	"math"
	"math/bits"
)

// Add returns a+b, or the limit of int64 it passes.
func Add[T ~int64](a, b T) T {
	s := a + b
	switch {
	case a > 0 && b > 0 && s < 0:
		return math.MaxInt64
	case a < 0 && b < 0 && s >= 0:
		return math.MinInt64
	}
	return s
}

// Sub returns a−b, or the limit of int64 it passes.
func Sub[T ~int64](a, b T) T {
	d := a - b
	switch {
	case a >= 0 && b < 0 && d < 0:
		return math.MaxInt64
	case a < 0 && b > 0 && d >= 0:
		return math.MinInt64
	}
	return d
}

// Mul returns a×b, or the limit of int64 it passes.
func Mul[T ~int64](a, b T) T {
	neg := (a < 0) != (b < 0)
	hi, lo := bits.Mul64(abs(int64(a)), abs(int64(b)))
	switch {
	case !neg && (hi != 0 || lo > math.MaxInt64):
		return math.MaxInt64
	case neg && (hi != 0 || lo > 1<<63):
		return math.MinInt64
	case neg:
		return T(-lo) // two's complement: also right for lo = 1<<63
	}
	return T(lo)
}

// abs returns |v| as a uint64 (exact also for math.MinInt64).
func abs(v int64) uint64 {
	if v < 0 {
		return uint64(-v)
	}
	return uint64(v)
}
