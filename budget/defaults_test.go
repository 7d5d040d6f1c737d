package budget_test

import (
	"testing"
	"time"

	"github.com/stormguard/stormguard/budget"
)

// The default floor of issue 14 ("do no harm"): a reserve of 10 retries
// for a fresh or quiet client, refilled at 10 per second, that stays a
// minimum, never an addition to the ratio.

// TestDefaultFloorFreshClient: a fresh default Budget grants 10 retries at
// once without a single deposit, then 10 per second.
func TestDefaultFloorFreshClient(t *testing.T) {
	b, clk := newBudget(budget.Config{})
	if got := withdraw(b, 100); got != 10 {
		t.Fatalf("fresh Budget, no deposit: %d of 100 granted at once, want 10", got)
	}
	if s := b.Stats(); s.Granted != 10 || s.FromFloor != 10 || s.Balance != 0 {
		t.Fatalf("Stats = %+v, want 10 granted from the floor, balance 0", s)
	}
	// A caller failing every millisecond for 10 s, with no deposit.
	perSecond := make([]int, 10)
	for ms := 1; ms < 10_000; ms++ {
		clk.Set(time.Duration(ms) * time.Millisecond)
		if b.Withdraw() {
			perSecond[ms/1000]++
		}
	}
	t.Logf("granted per second after the burst: %v", perSecond)
	if perSecond[0] != 9 { // at 100ms, 200ms, ..., 900ms
		t.Errorf("rest of second 0: %d granted, want 9", perSecond[0])
	}
	for i, n := range perSecond[1:] {
		if n != 10 {
			t.Errorf("second %d: %d granted, want 10", i+1, n)
		}
	}
}

// TestDefaultFloorFirstCallersOneByOne: the first ten calls of a fresh
// client each fail once, one after the other: all ten are retried, though
// ten deposits fund only one retry from the ratio.
func TestDefaultFloorFirstCallersOneByOne(t *testing.T) {
	b, clk := newBudget(budget.Config{})
	for i := range 10 {
		clk.Set(time.Duration(i) * time.Millisecond)
		b.Deposit()
		if !b.Withdraw() {
			t.Fatalf("call %d: its retry was refused", i+1)
		}
	}
}

// TestDefaultFloorIsAMinimum: with deposits, the default floor does not add
// to the ratio: a burst of failures after 50 calls gets max(5, 10) = 10
// retries, not 15; after 200 calls max(20, 10) = 20, not 30.
func TestDefaultFloorIsAMinimum(t *testing.T) {
	for _, tt := range []struct{ deposits, want, fromFloor int }{
		{50, 10, 5},
		{200, 20, 0},
	} {
		b, _ := newBudget(budget.Config{})
		deposit(b, tt.deposits)
		if got := withdraw(b, 1000); got != tt.want {
			t.Errorf("%d deposits, then 1000 failures at once: %d granted, want %d", tt.deposits, got, tt.want)
		}
		if s := b.Stats(); s.FromFloor != uint64(tt.fromFloor) {
			t.Errorf("%d deposits: %d of the grants from the floor, want %d", tt.deposits, s.FromFloor, tt.fromFloor)
		}
	}
}

// TestNoBankDefaults is TestNoBank with the default floor: after 10 healthy
// minutes at 900 requests per second, every request fails and is retried up
// to twice. The full floor bucket may add its rate to the first second of
// the outage (within the package's bound: Ratio × deposits + MinPerSecond ×
// 1s + burst), and nothing later.
func TestNoBankDefaults(t *testing.T) {
	b, clk := newBudget(budget.Config{})
	healthyTenMinutes(b, clk)
	perSecond := outage(b, clk)
	t.Logf("retries granted per second of the outage: %v", perSecond)
	if perSecond[0] > 90+10 {
		t.Errorf("first second of the outage: %d retries granted, want ≤ 90 + the floor's 10/s", perSecond[0])
	}
	for i, n := range perSecond[1:] {
		if n > 90 || n < 80 {
			t.Errorf("second %d of the outage: %d retries granted, want 80..90", i+1, n)
		}
	}
}
