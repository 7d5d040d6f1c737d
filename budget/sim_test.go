package budget_test

import (
	"math"
	"testing"
	"time"

	"github.com/stormguard/stormguard/budget"
)

// The seed-004 capacity-drop simulation: 20 ticks of one second; 900 requests
// per tick; the upstream serves 1000 attempts per tick, but only 200 in ticks
// 5-7; each request makes up to 3 attempts within its tick, and an attempt
// beyond the tick's capacity fails. The article reports a peak of 2,300
// attempts per tick without a budget and 1,169 with its 10% budget, 15,900
// requests served either way.
const (
	simTicks       = 20
	simRequests    = 900
	simAttempts    = 3
	simCapacity    = 1000
	simLowCapacity = 200
)

type simResult struct {
	attempts []int // upstream attempts per tick
	peak     int
	served   int
}

// simulate runs the model. deposit is called once per request before its
// first attempt and allow once before each retry, both with the tick; nil
// means no budget.
func simulate(deposit func(tick int), allow func(tick int) bool) simResult {
	var r simResult
	for tick := range simTicks {
		capacity := simCapacity
		if tick >= 5 && tick <= 7 {
			capacity = simLowCapacity
		}
		used := 0
		for range simRequests {
			if deposit != nil {
				deposit(tick)
			}
			for attempt := 1; attempt <= simAttempts; attempt++ {
				if attempt > 1 && allow != nil && !allow(tick) {
					break
				}
				used++
				if used <= capacity {
					r.served++
					break
				}
			}
		}
		r.attempts = append(r.attempts, used)
		r.peak = max(r.peak, used)
	}
	return r
}

func TestSeed004SimulationWithoutBudget(t *testing.T) {
	r := simulate(nil, nil)
	t.Logf("no budget: attempts per tick %v, peak %d, served %d", r.attempts, r.peak, r.served)
	if r.peak != 2300 || r.served != 15900 {
		t.Fatalf("no budget: peak %d, served %d; the article's model gives 2300 and 15900", r.peak, r.served)
	}
}

func TestSeed004SimulationWithBudget(t *testing.T) {
	b, clk := newBudget(budget.Config{MinPerSecond: 1}) // 10%, 10s TTL, floor 1/s
	at := func(tick int) { clk.Set(time.Duration(tick) * time.Second) }
	r := simulate(
		func(tick int) { at(tick); b.Deposit() },
		func(tick int) bool { at(tick); return b.Withdraw() },
	)
	s := b.Stats()
	t.Logf("budget: attempts per tick %v, peak %d, served %d; %+v", r.attempts, r.peak, r.served, s)
	if r.peak > 1000 {
		t.Errorf("peak %d attempts per tick, want ≤ 1000", r.peak)
	}
	if r.served != 15900 {
		t.Errorf("served %d, want 15900 (what no budget serves)", r.served)
	}
	// Exactly: 900 first attempts + 10% of the tick's 900 requests; the
	// floor (1/s) is a minimum, below that.
	if r.peak != 990 {
		t.Errorf("peak %d, want 900 + 90 = 990", r.peak)
	}
	if s.Granted != 3*90 || s.FromFloor != 0 {
		t.Errorf("granted %d (%d from the floor), want 3 × 90 (0)", s.Granted, s.FromFloor)
	}
}

// seedBucket is the seed article's RetryBudget, transcribed: tokens decay
// exponentially with a 10s time constant, each request adds 0.1 (up to
// 10,000) and a retry takes a whole token. It banks healthy deposits, which
// is what the two windows of package budget prevent.
type seedBucket struct {
	tokens, last float64
}

func (s *seedBucket) decay(now float64) {
	elapsed := now - s.last
	s.last = now
	s.tokens = math.Max(0, s.tokens-elapsed*s.tokens/10)
}

func (s *seedBucket) onRequest(now float64) {
	s.decay(now)
	s.tokens = math.Min(s.tokens+0.1, 10_000)
}

func (s *seedBucket) allowRetry(now float64) bool {
	s.decay(now)
	if s.tokens >= 1 {
		s.tokens--
		return true
	}
	return false
}

// TestSeed004SimulationCatchesABank checks the model itself: the seed's
// banking bucket, run through the same simulation, overshoots 1000.
func TestSeed004SimulationCatchesABank(t *testing.T) {
	var s seedBucket
	r := simulate(
		func(tick int) { s.onRequest(float64(tick)) },
		func(tick int) bool { return s.allowRetry(float64(tick)) },
	)
	t.Logf("seed bucket: attempts per tick %v, peak %d, served %d", r.attempts, r.peak, r.served)
	if r.peak <= 1000 || r.served != 15900 {
		t.Fatalf("seed bucket: peak %d, served %d; want a peak over 1000 (it banks) and 15900 served", r.peak, r.served)
	}
}

// TestSeed004SimulationWithDefaultBudget: the same simulation with the
// defaults (floor 10/s, burst 10) stays within the upstream's 1000 attempts
// per tick and serves what no budget serves.
func TestSeed004SimulationWithDefaultBudget(t *testing.T) {
	b, clk := newBudget(budget.Config{})
	at := func(tick int) { clk.Set(time.Duration(tick) * time.Second) }
	r := simulate(
		func(tick int) { at(tick); b.Deposit() },
		func(tick int) bool { at(tick); return b.Withdraw() },
	)
	s := b.Stats()
	t.Logf("default budget: attempts per tick %v, peak %d, served %d; %+v", r.attempts, r.peak, r.served, s)
	if r.peak > 1000 {
		t.Errorf("peak %d attempts per tick, want ≤ 1000", r.peak)
	}
	if r.served != 15900 {
		t.Errorf("served %d, want 15900 (what no budget serves)", r.served)
	}
	// The clock stands still within a tick, and the ratio's first ten grants
	// take the floor's ten tokens, so the floor funds nothing: the same
	// 900 + 90 as with a floor of 1/s.
	if r.peak != 990 || s.Granted != 3*90 || s.FromFloor != 0 {
		t.Errorf("peak %d, granted %d (%d from the floor), want 990, 3 × 90 (0)", r.peak, s.Granted, s.FromFloor)
	}
}
