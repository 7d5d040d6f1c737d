package budget_test

import (
	"math"
	"testing"
	"time"

	"github.com/stormguard/stormguard/budget"
)

// The capacity-drop simulation of "Implementing Retry Budgets to Prevent
// Retry Storms": 20 ticks of one second; 900 requests
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

func TestCapacityDropWithoutBudget(t *testing.T) {
	r := simulate(nil, nil)
	t.Logf("no budget: attempts per tick %v, peak %d, served %d", r.attempts, r.peak, r.served)
	if r.peak != 2300 || r.served != 15900 {
		t.Fatalf("no budget: peak %d, served %d; the article's model gives 2300 and 15900", r.peak, r.served)
	}
}

// TestCapacityDropWithDefaultBudget: with the default Budget, each tick of
// the drop sends its first attempts and about a tenth of its failed
// requests as retries (a loan, repaid within the tick, then the ratio of
// the requests that failed: the healthy requests before them banked
// nothing), and no tick exceeds the upstream's 1,000 attempts. The same
// requests are served as with no budget.
func TestCapacityDropWithDefaultBudget(t *testing.T) {
	b := newClocked(budget.Config{})
	at := func(tick int) { b.at = time.Duration(tick) * time.Second }
	r := simulate(
		func(tick int) { at(tick); b.deposit(1) },
		func(tick int) bool { at(tick); return b.withdraw(1) == 1 },
	)
	s := b.stats()
	t.Logf("default budget: attempts per tick %v, peak %d, served %d; %+v", r.attempts, r.peak, r.served, s)
	if r.peak > 1000 {
		t.Errorf("peak %d attempts per tick, want ≤ 1000", r.peak)
	}
	if r.served != 15900 {
		t.Errorf("served %d, want 15900 (what no budget serves)", r.served)
	}
	for _, tick := range []int{5, 6, 7} {
		if n := r.attempts[tick]; n < 900+70 || n > 900+90 {
			t.Errorf("tick %d: %d attempts, want 900 + a tenth of the 700 failed requests (70) to 90", tick, n)
		}
	}
	if limit := uint64(0.1*float64(s.Requests)) + 1; s.Granted > limit {
		t.Errorf("granted %d, want at most Ratio × %d requests + 1", s.Granted, s.Requests)
	}
}

// articleBucket is that article's RetryBudget, transcribed: tokens decay
// exponentially with a 10s time constant, each request adds 0.1 (up to
// 10,000) and a retry takes a whole token. It banks healthy deposits, which
// is what the two windows of package budget prevent.
type articleBucket struct {
	tokens, last float64
}

func (s *articleBucket) decay(now float64) {
	elapsed := now - s.last
	s.last = now
	s.tokens = math.Max(0, s.tokens-elapsed*s.tokens/10)
}

func (s *articleBucket) onRequest(now float64) {
	s.decay(now)
	s.tokens = math.Min(s.tokens+0.1, 10_000)
}

func (s *articleBucket) allowRetry(now float64) bool {
	s.decay(now)
	if s.tokens >= 1 {
		s.tokens--
		return true
	}
	return false
}

// TestCapacityDropCatchesABank checks the model itself: the article's
// banking bucket, run through the same simulation, overshoots 1000.
func TestCapacityDropCatchesABank(t *testing.T) {
	var s articleBucket
	r := simulate(
		func(tick int) { s.onRequest(float64(tick)) },
		func(tick int) bool { return s.allowRetry(float64(tick)) },
	)
	t.Logf("article bucket: attempts per tick %v, peak %d, served %d", r.attempts, r.peak, r.served)
	if r.peak <= 1000 || r.served != 15900 {
		t.Fatalf("article bucket: peak %d, served %d; want a peak over 1000 (it banks) and 15900 served", r.peak, r.served)
	}
}
