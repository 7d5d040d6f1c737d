package budget_test

import (
	"math"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/stormguard/stormguard/budget"
)

// The properties of the package documentation, over random interleavings
// of deposits, withdrawals and time: the model below records what was
// done, and each step is checked against what the documentation promises.

// record is what a run did, with times as offsets from base.
type record struct {
	deposits, asks []time.Duration
}

// in counts the times in (from, to].
func in(times []time.Duration, from, to time.Duration) int {
	n := 0
	for _, t := range times {
		if t > from && t <= to {
			n++
		}
	}
	return n
}

// drawConfig draws a Config, and its Ratio and Burst as the documentation
// says they are applied.
func drawConfig(t *rapid.T) (c budget.Config, ratio float64, burst int) {
	c.Ratio = rapid.SampledFrom([]float64{-1, 0, 0.05, 0.1, 0.25, 1, 2.5}).Draw(t, "ratio")
	c.Burst = rapid.SampledFrom([]int{-1, 0, 1, 5, 20}).Draw(t, "burst")
	switch {
	case c.Ratio == 0:
		ratio = budget.DefaultRatio
	case c.Ratio > 0:
		ratio = c.Ratio
	}
	switch {
	case c.Burst == 0:
		burst = budget.DefaultBurst
	case c.Burst > 0:
		burst = c.Burst
	}
	return c, ratio, burst
}

func TestPropertyCreditLoansAndLending(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		cfg, ratio, burst := drawConfig(t)
		b := newClocked(cfg)
		var rec record
		lend := lendModel{period: -1, fresh: true}
		steps := rapid.IntRange(1, 200).Draw(t, "steps")
		for range steps {
			b.at += rapid.SampledFrom([]time.Duration{0, time.Millisecond, 50 * time.Millisecond,
				400 * time.Millisecond, time.Second, 3 * time.Second, 11 * time.Second}).Draw(t, "dt")
			for range rapid.IntRange(0, 30).Draw(t, "deposits") {
				b.deposit(1)
				rec.deposits = append(rec.deposits, b.at)
			}
			for range rapid.IntRange(0, 8).Draw(t, "withdrawals") {
				hedge := rapid.Bool().Draw(t, "hedge")
				before := b.stats()
				lend.ask(t, b.at, before, ratio, rec)
				share := 1.0
				var ok bool
				if hedge {
					// A hedge is lent only on half the loan limit; a
					// refused one is not demand and stops nothing.
					share, ok = 0.5, b.hedge(1) == 1
				} else {
					ok = b.withdraw(1) == 1
				}
				if ok || !hedge {
					rec.asks = append(rec.asks, b.at)
				}
				after := b.stats()
				switch {
				case hedge && !ok && after.Lending != before.Lending:
					t.Fatalf("at %v: a refused hedge changed lending from %v to %v", b.at, before.Lending, after.Lending)
				case !hedge && !ok && before.Lending && before.Credit < 1:
					lend.period = -1 // a loan refused: it has lent all it may and stops
				}
				checkStep(t, b.at, before, after, ok, ratio, burst, share, rec)
			}
		}
	})
}

// checkStep checks one withdrawal at offset at.
// lendModel follows the Budget's lending periods as the package
// documentation states them: a period lasts LendFor from its first
// withdrawal; once it has ended (or the Budget stopped lending) the Budget
// lends again only when it is owed nothing and judged under the ratio.
type lendModel struct {
	period time.Duration // the first withdrawal of the current period; -1: none
	fresh  bool          // no period yet: a new Budget lends without being judged
}

// ask checks the lending state before a withdrawal at offset at.
func (m *lendModel) ask(t *rapid.T, at time.Duration, before budget.Stats, ratio float64, rec record) {
	if !before.Lending {
		m.period = -1
		return
	}
	if m.period >= 0 && at-m.period < budget.LendFor {
		return // the period goes on
	}
	if !m.fresh {
		// A new period after one that ended: only when owed nothing and
		// judged under the ratio over the last JudgeWindow (slots of
		// 500 ms: 9.5-10 s of asks and deposits).
		asks := in(rec.asks, at-budget.JudgeWindow+500*time.Millisecond, at)
		deps := in(rec.deposits, at-budget.JudgeWindow-500*time.Millisecond, at)
		if before.Credit < 0 || float64(asks) > ratio*float64(deps)+1e-6 {
			t.Fatalf("at %v: lending again with credit %v and %d asks for %d deposits in the last %v", at, before.Credit, asks, deps, budget.JudgeWindow)
		}
	}
	m.period, m.fresh = at, false
}

// share is the part of the loan limit the withdrawal may be lent on: 1 for
// a retry, 0.5 for a hedge.
func checkStep(t *rapid.T, at time.Duration, before, after budget.Stats, ok bool, ratio float64, burst int, share float64, rec record) {
	// Nothing is banked beyond MaxCredit, and the grants never exceed the
	// credit the requests paid for, less what is left of it.
	if after.Credit > budget.MaxCredit {
		t.Fatalf("at %v: credit %v, want ≤ %d", at, after.Credit, budget.MaxCredit)
	}
	if g := float64(after.Granted) + after.Credit; g > ratio*float64(after.Requests)+1e-6 {
		t.Fatalf("at %v: granted %d + credit %v > Ratio × %d requests", at, after.Granted, after.Credit, after.Requests)
	}
	if !ok {
		// A refusal takes nothing.
		if after.Credit != before.Credit || after.Granted != before.Granted {
			t.Fatalf("at %v: a refused withdrawal changed %+v into %+v", at, before, after)
		}
		return
	}
	if before.Credit >= 1 {
		return // paid for: not a loan
	}
	// A loan: within the limit, and within LendFor of the failure's start.
	if after.Lent != before.Lent+1 {
		t.Fatalf("at %v: granted below one retry of credit but not counted as lent: %+v → %+v", at, before, after)
	}
	// The limit counts the deposits of the last 0.9-1 s (slots of 100 ms).
	limit := share * math.Max(float64(burst), ratio*float64(in(rec.deposits, at-budget.ShortWindow, at)))
	if -after.Credit > limit+1e-6 {
		t.Fatalf("at %v: owed %v after a loan, want ≤ %v × max(Burst %d, Ratio × last second's deposits) = %v", at, -after.Credit, share, burst, limit)
	}
	if !before.Lending {
		t.Fatalf("at %v: lent while the Budget said it did not lend: %+v", at, before)
	}
}

// TestPropertyNoneGrantsNothing: with Ratio and Burst both "none"
// (negative), no interleaving is ever granted anything.
func TestPropertyNoneGrantsNothing(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		ratio := -rapid.Float64Range(1e-9, 1e9).Draw(t, "-ratio")
		burst := -rapid.IntRange(1, math.MaxInt).Draw(t, "-burst")
		b := newClocked(budget.Config{Ratio: ratio, Burst: burst})
		for range rapid.IntRange(1, 100).Draw(t, "steps") {
			b.at += time.Duration(rapid.Int64Range(0, int64(20*time.Second)).Draw(t, "dt"))
			b.deposit(rapid.IntRange(0, 50).Draw(t, "deposits"))
			if b.withdraw(rapid.IntRange(0, 5).Draw(t, "withdrawals")) != 0 {
				t.Fatalf("Ratio %v, Burst %d: a withdrawal was granted", ratio, burst)
			}
		}
	})
}

// TestPropertyFleetNeverOwesMoreThanItsBurst: in a fleet of quiet clients
// at random rates and failure probabilities, each client's retries beyond
// Ratio × its calls are at most its credit at the start (MaxCredit) plus
// what it owes at the end, which is at most its Burst; so the fleet's
// attempts stay within 1.10× its calls plus Burst + MaxCredit per client.
func TestPropertyFleetNeverOwesMoreThanItsBurst(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		c := fleetCell{
			n:    rapid.IntRange(1, 20).Draw(t, "clients"),
			rate: rapid.Float64Range(0.2, 50).Draw(t, "rate"),
			p:    rapid.Float64Range(0, 1).Draw(t, "p"),
			dur:  time.Duration(rapid.Int64Range(int64(time.Second), int64(40*time.Second)).Draw(t, "dur")),
			warm: rapid.Bool().Draw(t, "warm"),
			seed: rapid.Uint64().Draw(t, "seed"),
		}
		res := runFleet(c)
		if limit := 1.1*float64(res.calls) + float64(c.n)*(budget.DefaultBurst+budget.MaxCredit); float64(res.attempts) > limit+1e-6 {
			t.Fatalf("%+v: %d attempts for %d calls, more than 1.10× + %d per client", c, res.attempts, res.calls, budget.DefaultBurst+budget.MaxCredit)
		}
	})
}
