package budget_test

import (
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stormguard/stormguard/budget"
)

// clocked drives a Budget on explicit times, as a simulation or an
// interceptor does: at is the offset from base of every call it makes.
type clocked struct {
	*budget.Budget
	at time.Duration
}

func newClocked(c budget.Config) *clocked { return &clocked{Budget: budget.New(c)} }

func (c *clocked) now() time.Time { return base.Add(c.at) }

func (c *clocked) deposit(n int) {
	for range n {
		c.DepositAt(c.now())
	}
}

// withdraw calls WithdrawAt n times and returns how many were granted.
func (c *clocked) withdraw(n int) int {
	got := 0
	for range n {
		if c.WithdrawAt(c.now()) {
			got++
		}
	}
	return got
}

func (c *clocked) stats() budget.Stats { return c.StatsAt(c.now()) }

// TestCreditAndLoanInFixedPoint: N deposits at once credit min(N × Ratio,
// MaxCredit) and let the Budget lend N × Ratio more (Burst off), both
// exactly: back to back, floor(min(N·Ratio, 2) + N·Ratio) retries.
func TestCreditAndLoanInFixedPoint(t *testing.T) {
	tests := []struct {
		ratio    float64
		deposits int
		want     int
	}{
		{0, 50, 7}, // the default, 0.1: 2 + 5
		{0.1, 50, 7},
		{0.1, 10, 2},
		{0.1, 9, 1}, // 0.9 + 0.9
		{0.1, 19, 3},
		{0.1, 1000, 102},
		{0.2, 50, 12},
		{0.3, 10, 5}, // 10 × 0.3 is 2.9999999999999996 in float64
		{0.7, 10, 9},
		{0.05, 20, 2},
		{0.001, 1000, 2},
		{0.000001, 1_000_000, 2},
		{1, 7, 9},
		{2.5, 4, 12},
	}
	for _, tt := range tests {
		b := newClocked(budget.Config{Ratio: tt.ratio, Burst: -1})
		b.deposit(tt.deposits)
		if got := b.withdraw(tt.want + 10); got != tt.want {
			t.Errorf("Ratio %v, %d deposits: %d withdrawals granted, want %d", tt.ratio, tt.deposits, got, tt.want)
		}
		if tt.ratio == 0.3 {
			// The float sum the fixed point avoids: the case tests something.
			sum := 0.0
			for range tt.deposits {
				sum += tt.ratio
			}
			if math.Floor(sum) == 3 {
				t.Errorf("float sum %v would also lend 3; the case proves nothing", sum)
			}
		}
	}
}

// TestCreditHoldsMaxCredit: healthy traffic banks nothing beyond MaxCredit.
func TestCreditHoldsMaxCredit(t *testing.T) {
	b := newClocked(budget.Config{Burst: -1})
	for s := range 600 { // ten minutes at 100 calls a second
		b.at = time.Duration(s) * time.Second
		b.deposit(100)
	}
	// Two seconds of silence: nothing lent from the requests of the last
	// second, only the credit of MaxCredit retries.
	b.at += 2 * time.Second
	if s := b.stats(); s.Credit != budget.MaxCredit || s.Balance != budget.MaxCredit {
		t.Fatalf("after ten healthy minutes: %+v, want credit and balance %d", s, budget.MaxCredit)
	}
	if got := b.withdraw(10); got != budget.MaxCredit {
		t.Fatalf("%d granted, want %d", got, budget.MaxCredit)
	}
}

// TestRefusedWithdrawTakesNothing: a refusal changes neither the credit nor
// the grants.
func TestRefusedWithdrawTakesNothing(t *testing.T) {
	b := newClocked(budget.Config{Burst: -1})
	b.deposit(19) // credit 1.9, loan limit 1.9
	if got := b.withdraw(3); got != 3 {
		t.Fatalf("19 deposits: %d granted, want 3 (the credit, then loans)", got)
	}
	if got := b.withdraw(100); got != 0 {
		t.Fatalf("after the loan: %d granted, want 0", got)
	}
	want := budget.Stats{Requests: 19, Granted: 3, Lent: 2, Refused: 100, Credit: -1.1, Lending: false, Balance: 0}
	if s := b.stats(); s != want {
		t.Fatalf("Stats = %+v, want %+v", s, want)
	}
	// The refusals took nothing: 21 deposits repay the loan and credit one
	// retry, no more.
	b.deposit(21)
	if got := b.withdraw(5); got != 1 {
		t.Fatalf("after 21 more deposits: %d granted, want 1", got)
	}
}

// TestFreshBudgetLendsItsBurst: a fresh Budget lends Burst retries before
// its first deposit, then stops; its requests repay the loan before they
// fund a retry.
func TestFreshBudgetLendsItsBurst(t *testing.T) {
	b := newClocked(budget.Config{})
	if got := b.withdraw(100); got != budget.DefaultBurst {
		t.Fatalf("fresh Budget, no deposit: %d of 100 granted, want %d", got, budget.DefaultBurst)
	}
	s := b.stats()
	if s.Lent != budget.DefaultBurst || s.Credit != -budget.DefaultBurst || s.Lending {
		t.Fatalf("Stats = %+v, want %d lent, credit %d, not lending", s, budget.DefaultBurst, -budget.DefaultBurst)
	}
	b.at = time.Millisecond
	b.deposit(59) // repays 5.9
	if got := b.withdraw(10); got != 0 {
		t.Fatalf("after 59 deposits: %d granted, want 0 (the loan comes first)", got)
	}
	b.deposit(1)
	if got := b.withdraw(10); got != 1 {
		t.Fatalf("after 60 deposits: %d granted, want 1", got)
	}
}

// TestFirstCallersAreRescued: a fresh client's first callers fail once at
// 10%, one after the other or all at once; every one is retried.
func TestFirstCallersAreRescued(t *testing.T) {
	t.Run("one by one, the first five of fifty", func(t *testing.T) {
		b := newClocked(budget.Config{})
		for i := range 50 {
			b.at = time.Duration(i) * time.Millisecond
			b.deposit(1)
			if i < 5 && b.withdraw(1) != 1 {
				t.Fatalf("call %d: its retry was refused", i+1)
			}
		}
	})
	t.Run("one by one, every tenth of a hundred", func(t *testing.T) {
		b := newClocked(budget.Config{})
		for i := range 100 {
			b.at = time.Duration(i) * time.Millisecond
			b.deposit(1)
			if i%10 == 0 && b.withdraw(1) != 1 {
				t.Fatalf("call %d: its retry was refused", i+1)
			}
		}
	})
	t.Run("all at once, ten of a hundred", func(t *testing.T) {
		b := newClocked(budget.Config{})
		b.deposit(100)
		if got := b.withdraw(10); got != 10 {
			t.Fatalf("%d of 10 retried", got)
		}
	})
}

// TestBusyClientRescuesADroppedBurst: a client at 1,000 calls a second
// whose connection drops 50 calls at once retries all 50, repays them
// within half a second, and keeps lending.
func TestBusyClientRescuesADroppedBurst(t *testing.T) {
	b := newClocked(budget.Config{})
	for ms := range 10_000 {
		b.at = time.Duration(ms) * time.Millisecond
		b.deposit(1)
	}
	if got := b.withdraw(50); got != 50 {
		t.Fatalf("%d of 50 dropped calls retried", got)
	}
	for ms := 10_000; ms < 10_500; ms++ {
		b.at = time.Duration(ms) * time.Millisecond
		b.deposit(1)
	}
	if s := b.stats(); s.Credit < 0 || !s.Lending {
		t.Fatalf("half a second later: %+v, want the loan repaid and the Budget lending", s)
	}
}

// TestLendingStopsAfterLendFor: a quiet client whose every call fails is
// lent to for LendFor from its first loan, then funded by its own requests
// alone, once it has repaid.
func TestLendingStopsAfterLendFor(t *testing.T) {
	b := newClocked(budget.Config{})
	granted := make([]int, 60)
	for s := range granted {
		b.at = time.Duration(s) * time.Second
		b.deposit(1)
		granted[s] = b.withdraw(2) // attempts 2 and 3
	}
	t.Logf("retries granted per second: %v", granted)
	lent := 0
	for s := range int(budget.LendFor / time.Second) {
		lent += granted[s]
	}
	// Seconds 0-2: up to Burst, limited by the loan limit of 5.
	if lent != budget.DefaultBurst {
		t.Errorf("first %v: %d retries, want the burst %d", budget.LendFor, lent, budget.DefaultBurst)
	}
	// Then nothing until the loan is repaid (credit 0.3 - 5 at 3 s: 47
	// more seconds), then one retry per 10 calls.
	after := 0
	for s := int(budget.LendFor / time.Second); s < len(granted); s++ {
		after += granted[s]
	}
	if after > 1 {
		t.Errorf("from %v to 60 s: %d retries, want at most 1 (the loan is repaid at about 50 s)", budget.LendFor, after)
	}
	if s := b.stats(); float64(s.Granted) > 0.1*float64(s.Requests)+budget.MaxCredit {
		t.Errorf("granted %d for %d requests: more than the ratio plus MaxCredit", s.Granted, s.Requests)
	}
}

// TestLendsAgainWhenJudgedUnderTheRatio: after a failure, a Budget that has
// been repaid lends again once the last JudgeWindow asked for at most Ratio
// × its requests, and not before.
func TestLendsAgainWhenJudgedUnderTheRatio(t *testing.T) {
	b := newClocked(budget.Config{})
	// One second at 100 calls a second, every call asking for two retries.
	for ms := 0; ms < 1000; ms += 10 {
		b.at = time.Duration(ms) * time.Millisecond
		b.deposit(1)
		b.withdraw(2)
	}
	if s := b.stats(); s.Lending {
		t.Fatalf("after a second of failures: %+v, want the Budget not lending", s)
	}
	// Healthy again at 100 calls a second: it lends only once the failure
	// has left the JudgeWindow (its 200 asks need 2,000 requests beside
	// them in the window, more than it holds).
	firstLending := time.Duration(-1)
	for ms := 1000; ms < 30_000 && firstLending < 0; ms += 10 {
		b.at = time.Duration(ms) * time.Millisecond
		b.deposit(1)
		if s := b.stats(); s.Lending {
			firstLending = b.at
		}
	}
	t.Logf("lending again at %v", firstLending)
	// The window is 20 slots of 500 ms: the failure's asks leave it 9.5 to
	// 11 s after they were made.
	if firstLending < budget.JudgeWindow-500*time.Millisecond || firstLending > budget.JudgeWindow+time.Second+500*time.Millisecond {
		t.Fatalf("lending again at %v, want about %v (when the failure leaves the window)", firstLending, budget.JudgeWindow)
	}
}

// TestLendingStartsAtAWithdrawalNotAtStats: reading the Stats does not
// start the LendFor of a failure; the first withdrawal does.
func TestLendingStartsAtAWithdrawalNotAtStats(t *testing.T) {
	b := newClocked(budget.Config{})
	for s := range 10 {
		b.at = time.Duration(s) * time.Second
		if st := b.stats(); !st.Lending || st.Balance != budget.DefaultBurst {
			t.Fatalf("at %v: %+v, want a fresh Budget lending its burst", b.at, st)
		}
	}
	if got := b.withdraw(2); got != 2 {
		t.Fatalf("at %v: %d of 2 lent, want 2", b.at, got)
	}
	b.at += budget.LendFor - time.Millisecond
	if got := b.withdraw(1); got != 1 {
		t.Fatalf("within LendFor of the first withdrawal: %d of 1 lent", got)
	}
	b.at += time.Millisecond
	if got := b.withdraw(1); got != 0 {
		t.Fatalf("LendFor after the first withdrawal: %d of 1 lent, want 0", got)
	}
}

// TestFailuresBelowTheRatioKeepLending: a busy client whose calls fail at
// 5%, each asking for a retry at once, is never refused one.
func TestFailuresBelowTheRatioKeepLending(t *testing.T) {
	b := newClocked(budget.Config{})
	refused := 0
	for ms := range 60_000 {
		b.at = time.Duration(ms) * time.Millisecond
		b.deposit(1)
		if ms%20 == 7 && b.withdraw(1) == 0 {
			refused++
		}
		if ms%1000 == 500 && ms%20 == 0 { // and a burst of 20 every few seconds
			if ms%7000 == 500 {
				refused += 20 - b.withdraw(20)
			}
		}
	}
	if s := b.stats(); refused != 0 || !s.Lending {
		t.Fatalf("%d retries refused; %+v", refused, s)
	}
}

// TestNoBank: 10 minutes of healthy traffic at 900 requests a second, then
// 30 s in which every request fails and asks for two retries. Healthy
// traffic leaves a credit of MaxCredit, and the first second's loan is
// repaid by the next second's requests: over the outage, the retries are
// the ratio's plus MaxCredit.
func TestNoBank(t *testing.T) {
	b := newClocked(budget.Config{})
	const rps = 900
	at := func(sec, i int) time.Duration {
		return time.Duration(sec)*time.Second + time.Duration(i)*time.Second/rps
	}
	for sec := range 600 {
		for i := range rps {
			b.at = at(sec, i)
			b.deposit(1)
		}
	}
	var perSecond []int
	total := 0
	for sec := 600; sec < 630; sec++ {
		n := 0
		for i := range rps {
			b.at = at(sec, i)
			b.deposit(1)
			n += b.withdraw(2)
		}
		perSecond = append(perSecond, n)
		total += n
	}
	t.Logf("retries granted per second of the outage: %v", perSecond)
	// Second 0: the credit (2), a loan of up to 90 (a tenth of the last
	// second's 900 requests) and what the deposits made while it lent
	// credited. Then the loan is repaid, and the ratio funds 90 a second.
	if perSecond[0] > 2+90+10 {
		t.Errorf("first second: %d retries, want at most 102", perSecond[0])
	}
	for i, n := range perSecond[2:] {
		if n > 90 || n < 89 {
			t.Errorf("second %d: %d retries, want 89-90", i+2, n)
		}
	}
	if limit := rps*30/10 + budget.MaxCredit; total > limit {
		t.Errorf("outage: %d retries, want at most %d (Ratio × requests + MaxCredit)", total, limit)
	}
}

func TestInvalidConfigIsClampedNotPanicking(t *testing.T) {
	// Each case: 50 deposits at once, then 10,000 withdrawals at once.
	tests := []struct {
		name string
		cfg  budget.Config
		want int
	}{
		{"zero config", budget.Config{}, 7},                                    // credit 2 + loan max(5, 5)
		{"NaN ratio", budget.Config{Ratio: math.NaN(), Burst: -1}, 7},          // the default ratio
		{"+Inf ratio", budget.Config{Ratio: math.Inf(1), Burst: -1}, 7},        // the default ratio
		{"-Inf ratio", budget.Config{Ratio: math.Inf(-1), Burst: -1}, 7},       // the default ratio
		{"negative ratio: none", budget.Config{Ratio: -0.5, Burst: 2}, 2},      // the burst alone
		{"tiny ratio rounds to none", budget.Config{Ratio: 4e-7}, 5},           // the burst alone
		{"huge ratio lowered to MaxRatio", budget.Config{Ratio: 1e300}, 10000}, // loan limit 50 × 1000
		{"negative burst: none", budget.Config{Burst: -3}, 7},
		{"both none", budget.Config{Ratio: -1, Burst: -1}, 0},
		{"huge burst lowered to MaxBurst", budget.Config{Ratio: -1, Burst: math.MaxInt}, 10000},
	}
	for _, tt := range tests {
		b := newClocked(tt.cfg)
		b.deposit(50)
		if got := b.withdraw(10000); got != tt.want {
			t.Errorf("%s: %d granted, want %d", tt.name, got, tt.want)
		}
		// Time jumps do not panic either.
		for _, d := range []time.Duration{time.Hour, -time.Hour, math.MaxInt64, math.MinInt64, 0} {
			b.at = d
			b.deposit(1)
			b.withdraw(1)
			_ = b.stats()
			_ = b.Stats()
			b.Deposit()
			b.Withdraw()
		}
	}
}

func TestClockGoingBackwardsStandsStill(t *testing.T) {
	b := newClocked(budget.Config{Burst: -1})
	b.at = 10 * time.Second
	b.deposit(10) // credit 1, loan limit 1
	if got := b.withdraw(2); got != 2 {
		t.Fatalf("%d granted, want the credit and one loan", got)
	}
	b.at = 9 * time.Second // backwards: treated as 10 s
	b.deposit(10)          // repays the loan, in the slot of 10 s
	if s := b.stats(); s.Credit != 0 || s.Balance != 2 {
		t.Fatalf("after the clock went back: %+v, want credit 0, balance 2 (20 deposits in the last second)", s)
	}
	b.at = 10*time.Second + 850*time.Millisecond // a deposit counts for 0.9-1 s (slots of 100 ms)
	if s := b.stats(); s.Balance != 2 {
		t.Fatalf("within the second: %+v, want balance 2", s)
	}
	b.at = 11*time.Second + 100*time.Millisecond
	if s := b.stats(); s.Balance != 0 {
		t.Fatalf("a second later: %+v, want balance 0 (the deposits left the short window)", s)
	}
}

func TestZeroValueUsesDefaults(t *testing.T) {
	var b budget.Budget
	for range 50 {
		b.Deposit()
	}
	got := 0
	for range 100 {
		if b.Withdraw() {
			got++
		}
	}
	if got != 7 {
		t.Fatalf("zero Budget: %d granted after 50 deposits, want credit 2 + loan 5 = 7", got)
	}
	if s := b.Stats(); s.Requests != 50 || s.Granted != 7 || s.Lent != 5 || s.Refused != 93 {
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
	if s, sa := b.Stats(), b.StatsAt(base); s != (budget.Stats{}) || sa != (budget.Stats{}) {
		t.Fatalf("nil Budget Stats = %+v, %+v", s, sa)
	}
}

func TestStatsBalanceIsWhatWithdrawGrants(t *testing.T) {
	b := newClocked(budget.Config{Burst: 2})
	steps := []struct {
		at       time.Duration
		deposits int
		ask      int
	}{
		{0, 0, 1}, {0, 57, 3}, {100 * time.Millisecond, 3, 10}, {3 * time.Second, 30, 1}, {20 * time.Second, 200, 40},
	}
	for i, s := range steps {
		b.at = s.at
		b.deposit(s.deposits)
		bal := b.stats().Balance
		got := b.withdraw(int(bal) + s.ask)
		if float64(got) != bal {
			t.Errorf("step %d: Balance said %v, %d granted", i, bal, got)
		}
	}
}

func TestConcurrentUse(t *testing.T) {
	const workers, calls = 8, 2000
	b := budget.New(budget.Config{})
	var clk atomic.Int64
	var granted atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range calls {
				if i%100 == 0 {
					clk.Add(int64(time.Millisecond))
				}
				now := base.Add(time.Duration(clk.Load()))
				b.DepositAt(now)
				for range 2 {
					if b.WithdrawAt(now) {
						granted.Add(1)
					}
				}
				_ = b.StatsAt(now)
			}
		}()
	}
	wg.Wait()
	s := b.StatsAt(base.Add(time.Duration(clk.Load())))
	if s.Requests != workers*calls || s.Granted+s.Refused != 2*workers*calls {
		t.Fatalf("Stats = %+v: lost updates", s)
	}
	if int64(s.Granted) != granted.Load() {
		t.Fatalf("Stats.Granted %d, callers saw %d", s.Granted, granted.Load())
	}
	// Ratio × requests + the credit + what it is owed.
	if limit := 0.1*float64(s.Requests) + budget.MaxCredit - math.Min(s.Credit, 0); float64(s.Granted) > limit {
		t.Fatalf("granted %d > %v", s.Granted, limit)
	}
	if s.Granted < 1000 {
		t.Fatalf("granted only %d of 0.1 × %d", s.Granted, s.Requests)
	}
}

// TestMonotonicForms: the methods without a time read the monotonic clock
// and agree with the At forms given time.Now.
func TestMonotonicForms(t *testing.T) {
	b := budget.New(budget.Config{Burst: -1})
	for range 10 {
		b.Deposit()
	}
	b.DepositAt(time.Now())
	if !b.Withdraw() || !b.Withdraw() || b.WithdrawAt(time.Now()) {
		t.Fatal("11 deposits: want the credit (1.1) and one loan (1.1), then a refusal")
	}
	if s := b.Stats(); s.Requests != 11 || s.Granted != 2 {
		t.Fatalf("Stats = %+v", s)
	}
}

// hedge calls HedgeAt n times and returns how many were granted.
func (c *clocked) hedge(n int) int {
	got := 0
	for range n {
		if c.HedgeAt(c.now()) {
			got++
		}
	}
	return got
}

// TestHedgesBorrowHalfTheLoan: hedges are lent only while at most half the
// loan limit is owed; refusing them does not stop the Budget lending, so
// retries get the rest of the loan.
func TestHedgesBorrowHalfTheLoan(t *testing.T) {
	b := newClocked(budget.Config{})
	if got := b.hedge(10); got != 2 { // owed 2 ≤ 2.5; a third would owe 3
		t.Fatalf("fresh Budget: %d of 10 hedges granted, want 2 (half the burst of %d)", got, budget.DefaultBurst)
	}
	if s := b.stats(); !s.Lending || s.Refused != 8 || s.Lent != 2 {
		t.Fatalf("after the hedges: %+v, want lending, 8 refused, 2 lent", s)
	}
	if got := b.withdraw(10); got != budget.DefaultBurst-2 {
		t.Fatalf("retries after the hedges: %d granted, want the rest of the loan, %d", got, budget.DefaultBurst-2)
	}
	// Paid for, a hedge needs no loan: the requests that repay the loan
	// and bank one retry more pay for one hedge, however much is owed.
	b.at = time.Millisecond
	b.deposit(60)
	if got := b.hedge(3); got != 1 {
		t.Fatalf("after 60 deposits: %d hedges granted, want 1 (from the credit)", got)
	}
}

// TestRefusedHedgesAreNotDemand: a client refused the hedges it asks for
// while it repays a loan is judged without them: it lends again after a
// failure when it would have without them.
func TestRefusedHedgesAreNotDemand(t *testing.T) {
	run := func(hedges int) (time.Duration, uint64) {
		b := newClocked(budget.Config{})
		b.withdraw(10) // a failure takes the whole loan: lending stops
		for ms := 0; ms < 60_000; ms += 10 {
			b.at = time.Duration(ms) * time.Millisecond
			b.deposit(1)
			if b.stats().Credit < 0 && b.hedge(hedges) != 0 {
				t.Fatalf("at %v: a hedge granted while the Budget is owed and not lending", b.at)
			}
			if s := b.stats(); s.Lending {
				return b.at, s.Refused
			}
		}
		return -1, 0
	}
	quiet, _ := run(0)
	asking, refused := run(5)
	if quiet < 0 || asking != quiet || refused < 100 {
		t.Fatalf("lending again at %v without hedges, at %v with %d refused: want the same time", quiet, asking, refused)
	}
}

// A withdrawal that may not start a loan (the server said its budget
// could not pay: WithdrawNoNewLoanAt) is granted from the credit, and lent
// only by a loan already under way: a quiet client whose first failure
// comes when the fleet's server is dry borrows nothing; one whose loan
// began with its first failures goes on borrowing until LendFor ends.
func TestNoNewLoan(t *testing.T) {
	quiet := newClocked(budget.Config{})
	quiet.deposit(1) // a tenth of a retry of credit
	if quiet.PeekNoNewLoanAt(quiet.now()) || quiet.WithdrawNoNewLoanAt(quiet.now()) {
		t.Fatal("a loan started for a retry the server's budget could not pay for")
	}
	if !quiet.WithdrawAt(quiet.now()) {
		t.Fatal("without the server's word, the start-up loan is lent")
	}
	if s := quiet.stats(); s.Refused != 2 || s.Granted != 1 {
		t.Fatalf("%+v: want the two refusals counted, one retry lent", s)
	}
	// Its loan is under way: a withdrawal that may not start one is lent
	// from it, until LendFor from its start.
	if !quiet.PeekNoNewLoanAt(quiet.now()) || !quiet.WithdrawNoNewLoanAt(quiet.now()) {
		t.Fatal("a loan under way refused")
	}
	quiet.at += budget.LendFor
	if quiet.WithdrawNoNewLoanAt(quiet.now()) {
		t.Fatal("lent after LendFor")
	}

	banked := newClocked(budget.Config{})
	banked.deposit(20) // two retries of credit
	if banked.withdrawNoNewLoan(3) != 2 {
		t.Fatal("want the credit (2 retries) granted, nothing lent")
	}
}

func (c *clocked) withdrawNoNewLoan(n int) int {
	got := 0
	for range n {
		if c.WithdrawNoNewLoanAt(c.now()) {
			got++
		}
	}
	return got
}
