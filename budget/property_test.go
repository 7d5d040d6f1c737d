package budget_test

import (
	"math"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/stormguard/stormguard/budget"
)

// history is what a random run did: the times (ns offsets) of each deposit
// and of each granted withdrawal, in order.
type history struct {
	deposits, grants []int64
	refused          int
}

// drive runs a random interleaving of deposits, withdrawals, clock advances
// and Balance probes against b, and records it. A probe checks that Balance
// is exactly the number of back-to-back withdrawals granted.
func drive(t *rapid.T, b *budget.Budget, clk *fakeClock, ttl time.Duration) history {
	var h history
	now := int64(0)
	try := func() bool {
		if b.Withdraw() {
			h.grants = append(h.grants, now)
			return true
		}
		h.refused++
		return false
	}
	advance := rapid.OneOf(
		rapid.Int64Range(0, int64(10*time.Millisecond)),
		rapid.Int64Range(0, int64(1200*time.Millisecond)),
		rapid.Int64Range(0, int64(2*ttl)),
		rapid.SampledFrom([]int64{0, 1, int64(time.Second), int64(ttl), int64(ttl) - 1}),
	)
	steps := rapid.IntRange(1, 150).Draw(t, "steps")
	for range steps {
		switch rapid.IntRange(0, 3).Draw(t, "op") {
		case 0:
			for range rapid.IntRange(1, 40).Draw(t, "deposits") {
				b.Deposit()
				h.deposits = append(h.deposits, now)
			}
		case 1:
			for range rapid.IntRange(1, 15).Draw(t, "withdrawals") {
				try()
			}
		case 2:
			now += advance.Draw(t, "advance")
			clk.Set(time.Duration(now))
		case 3:
			bal := b.Stats().Balance
			if bal != math.Trunc(bal) || bal < 0 {
				t.Fatalf("Balance %v is not a whole number", bal)
			}
			for i := range int(bal) {
				if !try() {
					t.Fatalf("Balance %v, but withdrawal %d was refused", bal, i+1)
				}
			}
			if try() {
				t.Fatalf("Balance %v, but withdrawal %d was granted", bal, int(bal)+1)
			}
		}
	}
	s := b.Stats()
	if s.Requests != uint64(len(h.deposits)) || s.Granted != uint64(len(h.grants)) || s.Refused != uint64(h.refused) {
		t.Fatalf("Stats %+v, history has %d deposits, %d granted, %d refused",
			s, len(h.deposits), len(h.grants), h.refused)
	}
	return h
}

// count returns how many of the sorted times lie in [from, to).
func count(times []int64, from, to int64) int {
	i, _ := slices.BinarySearch(times, from)
	j, _ := slices.BinarySearch(times, to)
	return j - i
}

// checkWindows checks, for every window [x, x+l), that
//
//	granted ≤ ratio × deposits in [x-lookback, x+l) + rate × l + burst,
//
// where lookback = min(TTL, ShortWindow) is how far back a deposit can fund a
// retry. The two sides are step functions of x, so it is enough to try every
// x where an event enters or leaves either window.
func checkWindows(t *rapid.T, h history, creditMicro, rate, burst float64, l, lookback int64) {
	var xs []int64
	add := func(e int64) { xs = append(xs, e-1, e, e+1) }
	for _, e := range h.grants {
		add(e)
		add(e - l)
	}
	for _, e := range h.deposits {
		add(e - l)
		add(e + lookback)
	}
	slices.Sort(xs)
	xs = slices.Compact(xs)
	for _, x := range xs {
		g := count(h.grants, x, x+l)
		d := count(h.deposits, x-lookback, x+l)
		limit := float64(d)*creditMicro/1e6 + rate*float64(l)/1e9 + burst
		if float64(g) > limit+1e-9 {
			t.Fatalf("window [%v, %v): %d granted > %v (%d deposits since %v, ratio %v, rate %v, burst %v)",
				time.Duration(x), time.Duration(x+l), g, limit, d, time.Duration(x-lookback),
				creditMicro/1e6, rate, burst)
		}
	}
}

// TestPropertyGrantedWithinRatioAndFloor: over random interleavings, in every
// window of length TTL (and of one second), granted ≤ Ratio × deposits +
// MinPerSecond × window + burst, with deposits counted from ShortWindow (or
// TTL, if shorter) before the window: that is how far back a deposit can fund
// a retry. (Counting only the deposits inside the window cannot hold for any
// budget in which a deposit funds a later retry: 100 deposits at 0s and 10
// retries at 0.5s put 10 retries and no deposits in [0.25s, 0.25s+TTL).)
func TestPropertyGrantedWithinRatioAndFloor(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		ratio := rapid.SampledFrom([]float64{-1, 0, 0.05, 0.1, 0.25, 0.3, 1, 2.5}).Draw(t, "ratio")
		rate := rapid.SampledFrom([]float64{-1, 0, 0.3, 1, 2.5, 5}).Draw(t, "minPerSecond")
		ttl := rapid.OneOf(
			rapid.SampledFrom([]time.Duration{5 * time.Millisecond, 300 * time.Millisecond,
				time.Second, 1500 * time.Millisecond, 10 * time.Second}),
			rapid.Custom(func(t *rapid.T) time.Duration {
				return time.Duration(rapid.Int64Range(1, int64(20*time.Second)).Draw(t, "ttlNs"))
			}),
		).Draw(t, "ttl")

		b, clk := newBudget(budget.Config{Ratio: ratio, TTL: ttl, MinPerSecond: rate})
		h := drive(t, b, clk, ttl)

		// The documented meaning of the Config.
		credit := 0.0 // micro-retries per deposit
		switch {
		case ratio == 0:
			credit = 1e5
		case ratio > 0:
			credit = math.Round(ratio * 1e6)
		}
		burst := 0.0
		switch {
		case rate == 0:
			rate, burst = budget.DefaultMinPerSecond, budget.DefaultMinPerSecond
		case rate > 0:
			burst = math.Max(1, rate)
		default:
			rate = 0
		}
		lookback := min(int64(ttl), int64(budget.ShortWindow))
		for _, l := range []int64{int64(ttl), int64(time.Second), lookback, int64(ttl)/7 + 1} {
			checkWindows(t, h, credit, rate, burst, l, lookback)
		}
	})
}

// TestPropertyNoneGrantsNothing: with Ratio and MinPerSecond both "none"
// (negative), no interleaving is ever granted anything.
func TestPropertyNoneGrantsNothing(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		ratio := -rapid.Float64Range(1e-9, 1e9).Draw(t, "-ratio")
		rate := -rapid.Float64Range(1e-9, 1e9).Draw(t, "-minPerSecond")
		ttl := time.Duration(rapid.Int64Range(-int64(time.Second), int64(20*time.Second)).Draw(t, "ttl"))
		b, clk := newBudget(budget.Config{Ratio: ratio, TTL: ttl, MinPerSecond: rate})
		effTTL := ttl
		if effTTL <= 0 {
			effTTL = budget.DefaultTTL
		}
		h := drive(t, b, clk, effTTL)
		if len(h.grants) != 0 {
			t.Fatalf("Ratio %v, MinPerSecond %v: %d withdrawals granted", ratio, rate, len(h.grants))
		}
	})
}

// TestWindowPropertyNeedsLookback shows why the property counts deposits from
// before the window: the counterexample from the comment above. The default
// budget (floor off) rightly grants the 10 retries, and the window
// [0.25s, 0.25s+TTL) then holds 10 grants and no deposits.
func TestWindowPropertyNeedsLookback(t *testing.T) {
	b, clk := newBudget(budget.Config{MinPerSecond: -1})
	deposit(b, 100)
	clk.Set(500 * time.Millisecond)
	if got := withdraw(b, 20); got != 10 {
		t.Fatalf("%d granted, want 10", got)
	}
	h := history{deposits: make([]int64, 100), grants: make([]int64, 10)}
	for i := range h.grants {
		h.grants[i] = int64(500 * time.Millisecond)
	}
	x, l := int64(250*time.Millisecond), int64(budget.DefaultTTL)
	if g, d := count(h.grants, x, x+l), count(h.deposits, x, x+l); g != 10 || d != 0 {
		t.Fatalf("window [0.25s, 10.25s): %d granted, %d deposits; want 10 and 0", g, d)
	}
	if d := count(h.deposits, x-int64(budget.ShortWindow), x+l); d != 100 {
		t.Fatalf("with the lookback: %d deposits, want 100", d)
	}
}
