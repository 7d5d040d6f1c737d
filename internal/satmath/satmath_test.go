package satmath_test

import (
	"math"
	"math/big"
	"testing"
	"time"

	"go.uber.org/goleak"
	"pgregory.net/rapid"

	"github.com/stormguard/stormguard/internal/satmath"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// clamp returns v, or the limit of int64 it passes.
func clamp(v *big.Int) int64 {
	switch {
	case v.Cmp(big.NewInt(math.MaxInt64)) > 0:
		return math.MaxInt64
	case v.Cmp(big.NewInt(math.MinInt64)) < 0:
		return math.MinInt64
	}
	return v.Int64()
}

// TestAgainstBigInt: Add, Sub and Mul are the exact result, clamped to int64,
// for any operands, extremes included.
func TestAgainstBigInt(t *testing.T) {
	edge := rapid.SampledFrom([]int64{0, 1, -1, 2, -2, math.MaxInt64, math.MinInt64, math.MaxInt64 - 1, math.MinInt64 + 1, 1 << 32, -1 << 32, 3037000499, -3037000500})
	operand := rapid.OneOf(edge, rapid.Int64())
	rapid.Check(t, func(t *rapid.T) {
		a, b := operand.Draw(t, "a"), operand.Draw(t, "b")
		ba, bb := big.NewInt(a), big.NewInt(b)
		if got, want := satmath.Add(a, b), clamp(new(big.Int).Add(ba, bb)); got != want {
			t.Fatalf("Add(%d, %d) = %d, want %d", a, b, got, want)
		}
		if got, want := satmath.Sub(a, b), clamp(new(big.Int).Sub(ba, bb)); got != want {
			t.Fatalf("Sub(%d, %d) = %d, want %d", a, b, got, want)
		}
		if got, want := satmath.Mul(a, b), clamp(new(big.Int).Mul(ba, bb)); got != want {
			t.Fatalf("Mul(%d, %d) = %d, want %d", a, b, got, want)
		}
	})
}

// TestDurations: the functions work on named int64 types, as the packages
// use them on time.Duration.
func TestDurations(t *testing.T) {
	if got := satmath.Add(time.Duration(math.MaxInt64-1), time.Hour); got != math.MaxInt64 {
		t.Errorf("Add = %v", got)
	}
	if got := satmath.Mul(time.Hour, 1<<40); got != math.MaxInt64 {
		t.Errorf("Mul = %v", got)
	}
	if got := satmath.Mul(time.Second, 3); got != 3*time.Second {
		t.Errorf("Mul = %v", got)
	}
}
