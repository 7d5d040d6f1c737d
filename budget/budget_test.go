package budget_test

import (
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/stormguard/stormguard/budget"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// base is the fake clock's zero; any fixed time will do.
var base = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// fakeClock is a concurrency-safe injected clock; tests move it, never sleep.
type fakeClock struct{ ns atomic.Int64 }

func (c *fakeClock) Now() time.Time          { return base.Add(time.Duration(c.ns.Load())) }
func (c *fakeClock) Set(d time.Duration)     { c.ns.Store(int64(d)) }
func (c *fakeClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// newBudget returns a Budget on a fake clock at offset 0.
func newBudget(c budget.Config) (*budget.Budget, *fakeClock) {
	clk := new(fakeClock)
	c.Now = clk.Now
	return budget.New(c), clk
}

func deposit(b *budget.Budget, n int) {
	for range n {
		b.Deposit()
	}
}

// withdraw calls Withdraw n times and returns how many were granted.
func withdraw(b *budget.Budget, n int) int {
	got := 0
	for range n {
		if b.Withdraw() {
			got++
		}
	}
	return got
}

func TestExactFixedPoint(t *testing.T) {
	tests := []struct {
		ratio    float64
		deposits int
		want     int
	}{
		{0, 50, 5}, // the default, 0.1
		{0.1, 50, 5},
		{0.1, 10, 1},
		{0.1, 9, 0},
		{0.1, 19, 1},
		{0.1, 1000, 100},
		{0.2, 50, 10},
		{0.3, 10, 3}, // 10 × 0.3 is 2.9999999999999996 in float64
		{0.7, 10, 7},
		{0.05, 20, 1},
		{0.001, 1000, 1},
		{0.000001, 1_000_000, 1},
		{1, 7, 7},
		{2.5, 4, 10},
	}
	for _, tt := range tests {
		// Floor off, so only the ratio counts.
		b, _ := newBudget(budget.Config{Ratio: tt.ratio, MinPerSecond: -1})
		deposit(b, tt.deposits)
		if got := withdraw(b, tt.want+10); got != tt.want {
			t.Errorf("Ratio %v, %d deposits: %d withdrawals granted, want %d", tt.ratio, tt.deposits, got, tt.want)
		}
		// The float sum the fixed point avoids: make sure the case tests something.
		if tt.ratio == 0.3 {
			sum := 0.0
			for range tt.deposits {
				sum += tt.ratio
			}
			if math.Floor(sum) == float64(tt.want) {
				t.Errorf("float sum %v would also give %d; the case proves nothing", sum, tt.want)
			}
		}
	}
}

func TestRefusedWithdrawTakesNothing(t *testing.T) {
	b, _ := newBudget(budget.Config{MinPerSecond: -1})
	deposit(b, 19)
	if got := withdraw(b, 1); got != 1 {
		t.Fatalf("19 deposits: %d granted, want 1", got)
	}
	if got := withdraw(b, 100); got != 0 {
		t.Fatalf("after the one retry: %d granted, want 0", got)
	}
	// The 100 refusals took nothing: one more deposit completes the second retry.
	deposit(b, 1)
	if got := withdraw(b, 5); got != 1 {
		t.Fatalf("20th deposit: %d granted, want 1", got)
	}
	s := b.Stats()
	want := budget.Stats{Requests: 20, Granted: 2, Refused: 104, Balance: 0}
	if s != want {
		t.Fatalf("Stats = %+v, want %+v", s, want)
	}
}

// step is one scripted moment: at offset at, make deposits, then withdrawals.
type step struct {
	at        time.Duration
	deposits  int
	withdraws int
	want      int // withdrawals granted
}

func runSteps(t *testing.T, name string, b *budget.Budget, clk *fakeClock, steps []step) {
	t.Helper()
	for i, s := range steps {
		clk.Set(s.at)
		deposit(b, s.deposits)
		if got := withdraw(b, s.withdraws); got != s.want {
			t.Errorf("%s: step %d (at %v, %d deposits): %d of %d withdrawals granted, want %d",
				name, i, s.at, s.deposits, got, s.withdraws, s.want)
		}
	}
}

func TestTTLExpiry(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name  string
		cfg   budget.Config
		steps []step
	}{
		{
			// TTL 500ms: 100 slots of 5ms. A deposit counts for less than TTL, never more.
			name: "short TTL, just before",
			cfg:  budget.Config{TTL: 500 * ms, MinPerSecond: -1},
			steps: []step{
				{at: 0, deposits: 50},
				{at: 499 * ms, withdraws: 10, want: 5},
			},
		},
		{
			name: "short TTL, at TTL",
			cfg:  budget.Config{TTL: 500 * ms, MinPerSecond: -1},
			steps: []step{
				{at: 0, deposits: 50},
				{at: 500 * ms, withdraws: 10, want: 0},
			},
		},
		{
			// A deposit made 3ms into its slot leaves with the slot: early, not late.
			name: "short TTL, expiry is early by at most a slot",
			cfg:  budget.Config{TTL: 500 * ms, MinPerSecond: -1},
			steps: []step{
				{at: 3 * ms, deposits: 50},
				{at: 499 * ms, withdraws: 1, want: 1},
				{at: 500 * ms, withdraws: 10, want: 0},
			},
		},
		{
			// Traffic from long ago funds nothing.
			name: "long ago",
			cfg:  budget.Config{MinPerSecond: -1},
			steps: []step{
				{at: 0, deposits: 10_000},
				{at: 10 * time.Second, withdraws: 10, want: 0},
				{at: time.Hour, withdraws: 10, want: 0},
			},
		},
		{
			// The TTL window remembers retries for TTL: 10 retries at 0.9s were
			// funded by deposits at 0s; at 10s those deposits have expired but
			// the retries still count, so the new deposits at 10s fund nothing
			// until 10.9s, although the last second alone would allow 10.
			name: "TTL window binds",
			cfg:  budget.Config{MinPerSecond: -1},
			steps: []step{
				{at: 0, deposits: 100},
				{at: 900 * ms, withdraws: 11, want: 10},
				{at: 10 * time.Second, deposits: 100, withdraws: 5, want: 0},
				{at: 10*time.Second + 899*ms, withdraws: 5, want: 0},
				{at: 10*time.Second + 900*ms, withdraws: 11, want: 10},
			},
		},
	}
	for _, tt := range tests {
		b, clk := newBudget(tt.cfg)
		runSteps(t, tt.name, b, clk, tt.steps)
	}
}

func TestFloor(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name  string
		rate  float64
		steps []step
	}{
		{"default is 10/s, burst 10", 0, []step{
			{at: 0, withdraws: 15, want: 10},
			{at: 99 * ms, withdraws: 15, want: 0},
			{at: 100 * ms, withdraws: 15, want: 1},
			{at: 999 * ms, withdraws: 15, want: 8},
			{at: time.Second, withdraws: 15, want: 1},
			{at: 10 * time.Second, withdraws: 15, want: 10}, // a rate, not a reserve
		}},
		{"1/s, burst 1", 1, []step{
			{at: 0, withdraws: 5, want: 1},
			{at: 999 * ms, withdraws: 5, want: 0},
			{at: time.Second, withdraws: 5, want: 1},
			{at: 10 * time.Second, withdraws: 5, want: 1}, // a rate, not a reserve
		}},
		{"5/s, burst 5", 5, []step{
			{at: 0, withdraws: 10, want: 5},
			{at: 200 * ms, withdraws: 10, want: 1},
			{at: 399 * ms, withdraws: 10, want: 0},
			{at: 400 * ms, withdraws: 10, want: 1},
			{at: time.Hour, withdraws: 10, want: 5},
		}},
		{"3/s, burst 3 despite 1/3 s not being whole nanoseconds", 3, []step{
			{at: 0, withdraws: 10, want: 3},
			// The interval is rounded up to 333333334ns (never faster than
			// the rate), so 3 tokens take 1s + 2ns to come back.
			{at: time.Second + 1, withdraws: 10, want: 2},
			{at: 2*time.Second + 4, withdraws: 10, want: 3},
		}},
		{"2.5/s, burst 2.5", 2.5, []step{
			{at: 0, withdraws: 10, want: 2}, // half a token left
			{at: 199 * ms, withdraws: 10, want: 0},
			{at: 200 * ms, withdraws: 10, want: 1},
			{at: 10 * time.Second, withdraws: 10, want: 2},
		}},
		{"0.5/s, burst 1", 0.5, []step{
			{at: 0, withdraws: 5, want: 1},
			{at: 1999 * ms, withdraws: 5, want: 0},
			{at: 2 * time.Second, withdraws: 5, want: 1},
		}},
		{"negative: no floor", -1, []step{
			{at: 0, withdraws: 5, want: 0},
			{at: time.Hour, withdraws: 5, want: 0},
		}},
	}
	for _, tt := range tests {
		b, clk := newBudget(budget.Config{Ratio: -1, MinPerSecond: tt.rate})
		runSteps(t, tt.name, b, clk, tt.steps)
	}
}

func TestFloorOneRequestAMinute(t *testing.T) {
	b, clk := newBudget(budget.Config{MinPerSecond: 1})
	for i := range 60 {
		clk.Set(time.Duration(i) * time.Minute)
		b.Deposit() // 0.1 of a retry: the ratio alone never funds one
		if !b.Withdraw() {
			t.Fatalf("minute %d: retry refused", i)
		}
		if b.Withdraw() {
			t.Fatalf("minute %d: second retry granted", i)
		}
	}
	s := b.Stats()
	if s.Granted != 60 || s.FromFloor != 60 || s.Refused != 60 {
		t.Fatalf("Stats = %+v, want 60 granted, all from the floor, 60 refused", s)
	}
}

func TestFloorBurstOfFailures(t *testing.T) {
	tests := []struct {
		rate     float64
		deposits int
		want     int
	}{
		{0, 0, 10},    // the default floor's burst only
		{0, 100, 10},  // max(10 from the ratio, default burst 10): a minimum, not an addition
		{0, 200, 20},  // max(20, default burst 10)
		{1, 0, 1},     // floor burst only
		{1, 100, 10},  // max(10 from the ratio, burst 1): a minimum, not an addition
		{5, 100, 10},  // max(10, burst 5)
		{20, 100, 20}, // max(10, burst 20)
		{-1, 100, 10}, // ratio only
		{0.2, 0, 1},   // burst is at least 1
		{100, 0, 100}, // burst = rate
		{-1, 0, 0},    // nothing funds anything
		{0.2, 1000, 100},
	}
	for _, tt := range tests {
		b, _ := newBudget(budget.Config{MinPerSecond: tt.rate})
		deposit(b, tt.deposits)
		if got := withdraw(b, 10_000); got != tt.want {
			t.Errorf("MinPerSecond %v, %d deposits, 10000 failures at once: %d granted, want %d",
				tt.rate, tt.deposits, got, tt.want)
		}
	}
}

// TestNoBank: 10 minutes of healthy traffic at 900 requests per second, then
// every request fails and is retried up to twice. A budget that banked the
// healthy deposits would grant up to 900 (0.1 × 9000 in the 10s TTL) at once.
func TestNoBank(t *testing.T) {
	b, clk := newBudget(budget.Config{MinPerSecond: 1})
	healthyTenMinutes(b, clk)
	clk.Set(600 * time.Second)
	if s := b.Stats(); s.Balance > 90 || s.Granted != 0 {
		t.Fatalf("after 10 healthy minutes: %+v, want a balance ≤ 90 (no bank)", s)
	}
	perSecond := outage(b, clk)
	t.Logf("retries granted per second of the outage: %v", perSecond)
	if perSecond[0] > 90+1 {
		t.Errorf("first second of the outage: %d retries granted, want ≤ 90 + floor burst 1", perSecond[0])
	}
	if perSecond[0] != 90 {
		t.Errorf("first second of the outage: %d retries granted, want exactly 90: the floor adds nothing when the ratio funds more", perSecond[0])
	}
	for i, n := range perSecond {
		// Not more than Ratio × that second's requests (the floor, rate 1
		// burst 1, is below it), and not much less either: the budget
		// still works.
		if n > 90 || n < 80 {
			t.Errorf("second %d of the outage: %d retries granted, want 80..90", i, n)
		}
	}
}

func TestInvalidConfigIsClampedNotPanicking(t *testing.T) {
	// Each case: 50 deposits at once, then 10000 withdrawals at once. The
	// ratio and TTL cases pin a floor of 1/s (burst 1), below the ratio's 5,
	// so that what the ratio grants shows.
	tests := []struct {
		name string
		cfg  budget.Config
		want int
	}{
		{"zero config", budget.Config{}, 10}, // max(5 from the ratio, floor burst 10)
		{"NaN ratio", budget.Config{Ratio: math.NaN(), MinPerSecond: 1}, 5},
		{"+Inf ratio", budget.Config{Ratio: math.Inf(1), MinPerSecond: 1}, 5},
		{"-Inf ratio", budget.Config{Ratio: math.Inf(-1), MinPerSecond: 1}, 5},
		{"negative ratio: none", budget.Config{Ratio: -0.5, MinPerSecond: 1}, 0 + 1},
		{"tiny ratio rounds to none", budget.Config{Ratio: 4e-7, MinPerSecond: 1}, 0 + 1},
		{"huge ratio lowered to MaxRatio", budget.Config{Ratio: 1e300}, 10000},
		{"NaN floor", budget.Config{MinPerSecond: math.NaN()}, 10},
		{"+Inf floor", budget.Config{MinPerSecond: math.Inf(1)}, 10},
		{"-Inf floor", budget.Config{MinPerSecond: math.Inf(-1)}, 10},
		{"negative floor: none", budget.Config{MinPerSecond: -3}, 5},
		{"both none", budget.Config{Ratio: -1, MinPerSecond: -1}, 0},
		{"huge floor lowered to MaxMinPerSecond", budget.Config{Ratio: -1, MinPerSecond: 1e300}, 10000},
		{"negative TTL: default", budget.Config{TTL: -time.Second, MinPerSecond: 1}, 5},
		{"1ns TTL", budget.Config{TTL: 1, MinPerSecond: 1}, 5},
		{"7ns TTL", budget.Config{TTL: 7, MinPerSecond: 1}, 5},
		{"huge TTL", budget.Config{TTL: math.MaxInt64, MinPerSecond: 1}, 5},
	}
	for _, tt := range tests {
		b, clk := newBudget(tt.cfg)
		deposit(b, 50)
		if got := withdraw(b, 10000); got != tt.want {
			t.Errorf("%s: %d granted, want %d", tt.name, got, tt.want)
		}
		// Time jumps do not panic either.
		for _, d := range []time.Duration{time.Hour, -time.Hour, math.MaxInt64, math.MinInt64, 0} {
			clk.Set(d)
			b.Deposit()
			b.Withdraw()
			_ = b.Stats()
		}
	}
}

func TestClockGoingBackwardsStandsStill(t *testing.T) {
	b, clk := newBudget(budget.Config{Ratio: -1, MinPerSecond: 1}) // floor only: 1/s, burst 1
	clk.Set(10 * time.Second)
	if !b.Withdraw() {
		t.Fatal("first floor retry refused")
	}
	clk.Set(5 * time.Second) // backwards: treated as 10s, so no refill
	if b.Withdraw() {
		t.Fatal("granted after the clock went backwards")
	}
	clk.Set(10*time.Second + 999*time.Millisecond)
	if b.Withdraw() {
		t.Fatal("granted before a second had passed")
	}
	clk.Set(11 * time.Second)
	if !b.Withdraw() {
		t.Fatal("refused a second later")
	}
}

func TestAtFormsUseTheGivenTime(t *testing.T) {
	var calls atomic.Int32
	b := budget.New(budget.Config{MinPerSecond: -1, Now: func() time.Time { calls.Add(1); return base }})
	calls.Store(0)
	for range 10 {
		b.DepositAt(base.Add(time.Second))
	}
	if !b.WithdrawAt(base.Add(time.Second)) || b.WithdrawAt(base.Add(time.Second)) {
		t.Fatal("10 deposits should fund exactly one retry")
	}
	if b.WithdrawAt(base.Add(2 * time.Second)) {
		t.Fatal("a retry was granted after the deposits left the short window")
	}
	if n := calls.Load(); n != 0 {
		t.Fatalf("the At forms called Config.Now %d times", n)
	}
}

func TestZeroValueUsesDefaults(t *testing.T) {
	var b budget.Budget
	deposit(&b, 50)
	if got := withdraw(&b, 100); got != 10 {
		t.Fatalf("zero Budget: %d granted after 50 deposits, want max(5, floor burst 10) = 10", got)
	}
	if s := b.Stats(); s.Requests != 50 || s.Granted != 10 || s.FromFloor != 5 || s.Refused != 90 {
		t.Fatalf("zero Budget Stats = %+v", s)
	}
}

func TestNilBudgetImposesNoBudget(t *testing.T) {
	var b *budget.Budget
	b.Deposit()
	b.DepositAt(base)
	for range 100 {
		if !b.Withdraw() || !b.WithdrawAt(base) {
			t.Fatal("nil Budget refused")
		}
	}
	if s := b.Stats(); s != (budget.Stats{}) {
		t.Fatalf("nil Budget Stats = %+v", s)
	}
}

func TestStatsBalance(t *testing.T) {
	b, clk := newBudget(budget.Config{MinPerSecond: 2})
	if s := b.Stats(); s.Balance != 2 {
		t.Fatalf("new Budget: Balance %v, want the floor burst 2", s.Balance)
	}
	deposit(b, 57)
	if s := b.Stats(); s.Balance != 5 {
		t.Fatalf("after 57 deposits: Balance %v, want max(5, 2)", s.Balance)
	}
	if got := withdraw(b, 7); got != 5 {
		t.Fatalf("Balance said 5, %d granted", got)
	}
	if s := b.Stats(); s.Balance != 0 || withdraw(b, 1) != 0 {
		t.Fatalf("drained: Balance %v", s.Balance)
	}
	clk.Set(500 * time.Millisecond) // the floor refills 1
	deposit(b, 3)                   // 60 deposits in the window: 6 retries, 5 used
	s := b.Stats()
	// The five ratio grants took the floor's two tokens; one has come
	// back. Ratio credit 1, floor 1: back to back, the ratio's grant takes
	// the floor's token, so one retry in all.
	want := budget.Stats{Requests: 60, Granted: 5, FromFloor: 0, Refused: 3, Balance: 1}
	if s != want {
		t.Fatalf("Stats = %+v, want %+v", s, want)
	}
	if got := withdraw(b, 5); got != 1 {
		t.Fatalf("Balance said 1, %d granted", got)
	}
}

func TestConcurrentUse(t *testing.T) {
	const workers, calls = 8, 2000
	b, clk := newBudget(budget.Config{MinPerSecond: 1})
	var granted atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range calls {
				if i%100 == 0 {
					clk.Advance(time.Millisecond)
				}
				b.Deposit()
				for range 2 {
					if b.Withdraw() {
						granted.Add(1)
					}
				}
				_ = b.Stats()
			}
		}()
	}
	wg.Wait()
	s := b.Stats()
	if s.Requests != workers*calls || s.Granted+s.Refused != 2*workers*calls {
		t.Fatalf("Stats = %+v: lost updates", s)
	}
	if int64(s.Granted) != granted.Load() {
		t.Fatalf("Stats.Granted %d, callers saw %d", s.Granted, granted.Load())
	}
	// All in well under a TTL: ratio 0.1 of the requests + floor burst 1 + 1/s.
	elapsed := time.Duration(clk.ns.Load()).Seconds()
	if limit := 0.1*float64(s.Requests) + 1 + elapsed; float64(s.Granted) > limit {
		t.Fatalf("granted %d > %v", s.Granted, limit)
	}
	if s.Granted < 100 {
		t.Fatalf("granted only %d of 0.1 × %d", s.Granted, s.Requests)
	}
}

// A burst of failures that begins before the burst's deposits have all
// arrived: the floor lets the first retry through, and the ratio does not
// grant it again. 50 calls, 5 retries in all, however they interleave.
func TestFloorGrantCountsAgainstTheRatio(t *testing.T) {
	b, _ := newBudget(budget.Config{MinPerSecond: 1})
	deposit(b, 1)
	if got := withdraw(b, 1); got != 1 {
		t.Fatalf("first failure: %d granted, want the floor's 1", got)
	}
	deposit(b, 49)
	if got := withdraw(b, 100); got != 4 {
		t.Fatalf("after 50 deposits: %d more granted, want 4 (5 in all)", got)
	}
	if s := b.Stats(); s.Granted != 5 || s.FromFloor != 1 {
		t.Fatalf("Stats = %+v", s)
	}
}

// noBankRPS is the request rate of the no-bank tests.
const noBankRPS = 900

// noBankAt is the time of request i of second sec.
func noBankAt(sec, i int) time.Duration {
	return time.Duration(sec)*time.Second + time.Duration(i)*time.Second/noBankRPS
}

// healthyTenMinutes deposits noBankRPS requests a second for 10 minutes.
func healthyTenMinutes(b *budget.Budget, clk *fakeClock) {
	for sec := range 600 {
		for i := range noBankRPS {
			clk.Set(noBankAt(sec, i))
			b.Deposit()
		}
	}
}

// outage follows healthyTenMinutes with 30 s in which every request fails
// and asks for up to two retries, and returns the retries granted in each
// second.
func outage(b *budget.Budget, clk *fakeClock) []int {
	var perSecond []int
	for sec := 600; sec < 630; sec++ {
		n := 0
		for i := range noBankRPS {
			clk.Set(noBankAt(sec, i))
			b.Deposit()
			for range 2 { // attempts 2 and 3
				if !b.Withdraw() {
					break
				}
				n++
			}
		}
		perSecond = append(perSecond, n)
	}
	return perSecond
}
