package budget

import (
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stormguard/stormguard/internal/satmath"
	"github.com/stormguard/stormguard/internal/window"
)

// Defaults applied to zero (or NaN/±Inf) Config fields.
const (
	DefaultRatio = 0.1
	DefaultBurst = 5
)

// Limits applied to large Config values.
const (
	// MaxRatio is the largest Ratio honoured; larger values are lowered to it.
	MaxRatio = 1000.0
	// MaxBurst is the largest Burst honoured; larger values are lowered to it.
	MaxBurst = 1_000_000
)

// The times a Budget works with. They are fixed: the bounds in the package
// documentation are stated in them.
const (
	// ShortWindow is the window whose requests set how much a Budget lends
	// at most: Ratio × the requests of the last ShortWindow, or Burst if
	// that is more.
	ShortWindow = time.Second
	// LendFor is how long a Budget lends in a failure: from the first
	// retry or hedge it is asked for while it lends, for LendFor.
	LendFor = 3 * time.Second
	// JudgeWindow is the window a Budget that stopped lending looks back
	// over before it lends again: it does once it is owed nothing and the
	// retries and hedges asked for in the last JudgeWindow were at most
	// Ratio × its requests.
	JudgeWindow = 10 * time.Second
)

// MaxCredit is the most a Budget's requests bank, in retries: healthy
// traffic leaves at most this much credit for a failure to spend. It is
// two, not one, so that the calls that come while a failure waits to ask
// for its retry (the next failure, or its backoff) are not credited for
// nothing: with one, a client failing half its calls one after the other
// would get 9% retries, not 10%.
const MaxCredit = 2

const (
	unit       = 1_000_000 // micro-retries per retry: the fixed-point unit
	shortSlots = 10        // slots in ShortWindow
	judgeSlots = 20        // slots in JudgeWindow
	// bias keeps a Budget's times positive for any time within about 126
	// years of its first; it is a whole number of seconds, so that slots
	// start at the first time a Budget sees, whichever clock it is driven
	// by (a simulation's runs are then the same).
	bias = int64(4e18)
)

// The kinds the judge window counts.
const (
	kindDeposit = iota
	kindAsk
)

// Config configures a Budget. The zero Config is valid and means the
// defaults: 10% retries, lent ahead up to 5 at a time (or up to 10% of the
// last second's requests, if more) for at most LendFor (3 s) of a failure.
//
// Fields are read once, by New (or NewRegistry); later changes to the Config
// have no effect on Budgets already made.
type Config struct {
	// Ratio is the number of retries plus hedges allowed per request
	// (Deposit). Every Deposit credits Ratio of a retry; every granted
	// Withdraw costs one.
	//
	// 0, NaN and ±Inf mean DefaultRatio (0.1). A negative Ratio means none:
	// requests credit nothing, so only what the Budget lends is granted,
	// and, never repaid, it is lent once. Values above MaxRatio are lowered
	// to it. Ratio is used in units of 1e-6 (rounded to the nearest), so
	// 0.1 is exact and 50 deposits credit exactly 5 retries; a Ratio below
	// 5e-7 rounds to none.
	Ratio float64

	// Burst is the least the Budget lends ahead of its credit: a fresh or
	// quiet client may retry up to Burst failures before its requests have
	// paid for them; later requests repay the loan before they fund
	// anything else. A busy client may borrow more: up to Ratio × the
	// requests of the last ShortWindow.
	//
	// 0 means DefaultBurst (5). A negative Burst means the Budget lends only
	// what the last ShortWindow's requests cover. Values above MaxBurst are
	// lowered to it.
	Burst int
}

// Stats is a snapshot of a Budget, for telemetry.
type Stats struct {
	Requests uint64 // Deposit calls since the Budget was made
	Granted  uint64 // Withdraw and Hedge calls that returned true, Lent included
	Lent     uint64 // of Granted, those lent: granted while the credit was below one retry
	Refused  uint64 // Withdraw and Hedge calls that returned false

	// Credit is what the requests have paid for and not yet spent, in
	// retries: at most MaxCredit (nothing more is banked), and negative
	// while the Budget is owed what it lent.
	Credit float64
	// Lending reports whether the Budget would lend to a withdrawal made
	// now (see the package documentation for when it stops and starts
	// again).
	Lending bool
	// Balance is the number of Withdraw calls that would return true if they
	// were made back to back at the time of the snapshot, with no Deposit in
	// between. It is always a whole number; it is a float64 because it is
	// meant for gauges.
	Balance float64
}

// A Budget decides whether a retry or a hedge may be sent to one target.
//
// Call Deposit once per logical call, before its first attempt, and
// Withdraw once per retry and once per hedge; send the retry or hedge only
// if Withdraw returned true.
//
// The zero value is a usable Budget with the default Config. A nil *Budget
// imposes no budget: Deposit does nothing, Withdraw always returns true and
// Stats returns the zero Stats. All methods are safe for concurrent use;
// none starts a goroutine. A Budget must not be copied after first use.
type Budget struct {
	// Deposit's fast path, without the lock: while its time is before edge
	// (the next slot boundary of either window, written under mu), a
	// Deposit only adds 1 to pending; holders of mu fold pending into the
	// credit and the current slots before the slots move.
	edge    atomic.Int64
	pending atomic.Uint64
	origin  window.Origin // the first offset the Budget saw
	_       [40]byte      // keep the fast path's line apart from the locked state

	// Everything below is guarded by mu.
	mu     sync.Mutex
	last   int64 // the latest offset seen; time never goes backwards
	ready  bool  // set up (false only in a zero Budget before first use)
	credit int64 // micro-retries; at most MaxCredit units, negative while owed
	per    int64 // micro-retries credited per Deposit; 0: none
	burst  int64 // micro-retries lent at least (0: none)

	// The Budget lends (lending) for LendFor from the first withdrawal
	// it was asked for while lending (began, once started is true).
	lending, started bool
	began            int64

	requests, granted, lent, refused uint64

	// fleet is, during a withdrawal a Method makes, the number of
	// clients it saw lately (see limit); 0 otherwise.
	fleet int64

	// promised counts the retries a Method promised (see
	// Method.PromiseAt), withdrawn when promised and not yet taken by a
	// retry, by the second of the Budget's time they were promised in:
	// promised[i] for second promisedSec[i].
	promised    [2]int64
	promisedSec [2]int64

	// short counts the deposits of the last ShortWindow; judge the
	// deposits and the withdrawals asked for of the last JudgeWindow. Both
	// are made by setup. The deposits and asks of the current slot (that
	// of last) are counted in dep and ask, and added to the windows when
	// the next slot starts; shortDep, judgeDep and judgeAsk are the
	// windows' sums as the current slot started. So a window's sum now is
	// its sum then plus dep (and ask), without reading its slots.
	short, judge                 *window.Counter
	shortDep, judgeDep, judgeAsk int64
	dep, ask                     int64
}

// processEpoch is the origin of offsets. Times are read through
// time.Since(processEpoch) by the methods without a time, which reads only
// the monotonic clock.
var processEpoch = time.Now()

// New returns a Budget configured by c (see Config for the defaults and for
// what invalid values mean).
func New(c Config) *Budget {
	b := &Budget{}
	b.setup(c)
	return b
}

// offset converts now to an offset: nanoseconds since processEpoch.
func offset(now time.Time) int64 { return int64(now.Sub(processEpoch)) }

// clock reads the monotonic clock as an offset.
func clock() int64 { return int64(time.Since(processEpoch)) }

// rel converts offset t to the Budget's time: nanoseconds since the first
// time it saw, plus bias.
func (b *Budget) rel(t int64) int64 {
	return max(0, satmath.Add(b.origin.Since(t), bias))
}

// setup applies c; b.mu must be held (or b not yet shared).
func (b *Budget) setup(c Config) {
	b.ready = true
	b.lending = true

	ratio := c.Ratio
	if ratio == 0 || math.IsNaN(ratio) || math.IsInf(ratio, 0) {
		ratio = DefaultRatio
	}
	if ratio > 0 {
		b.per = int64(math.Round(math.Min(ratio, MaxRatio) * unit))
	}
	burst := c.Burst
	if burst == 0 {
		burst = DefaultBurst
	}
	b.burst = int64(min(max(burst, 0), MaxBurst)) * unit

	b.short = window.New(shortSlots, 1, ShortWindow/shortSlots)
	b.judge = window.New(judgeSlots, 2, JudgeWindow/judgeSlots)
	b.edge.Store(0) // the first call takes the lock and places the edge
}

// Deposit records one logical call; call it once per call, before the first
// attempt. It never refuses and never blocks for long. It reads the
// monotonic clock; use DepositAt if you already have the time.
func (b *Budget) Deposit() {
	if b == nil {
		return
	}
	b.deposit(b.rel(clock()))
}

// DepositAt is Deposit at time now. A now earlier than the latest time the
// Budget has seen counts as that latest time.
func (b *Budget) DepositAt(now time.Time) {
	if b == nil {
		return
	}
	b.deposit(b.rel(offset(now)))
}

func (b *Budget) deposit(t int64) {
	// Fast path: the slots need not move, so the deposit belongs to the
	// current slots. If they move between the check and the Add, the
	// deposit is counted in the new slots, as if it came at the latest time
	// seen, which the slow path would also do.
	if t < b.edge.Load() {
		b.pending.Add(1)
		return
	}
	b.mu.Lock()
	b.advance(t)
	b.pending.Add(1)
	b.mu.Unlock()
}

// Withdraw asks for one retry or one hedge and reports whether it may be
// sent. It is granted from the credit if the requests have paid for a whole
// retry, or else lent if the Budget lends (see the package documentation);
// on false nothing is withdrawn. It reads the monotonic clock; use
// WithdrawAt if you already have the time.
func (b *Budget) Withdraw() bool {
	if b == nil {
		return true
	}
	return b.withdraw(b.rel(clock()))
}

// WithdrawAt is Withdraw at time now. A now earlier than the latest time the
// Budget has seen counts as that latest time.
func (b *Budget) WithdrawAt(now time.Time) bool {
	if b == nil {
		return true
	}
	return b.withdraw(b.rel(offset(now)))
}

func (b *Budget) withdraw(t int64) bool { return b.withdrawFor(t, 0, true) }

// withdrawFor is withdraw on behalf of fleet clients (see limit; 0: one),
// and, without newLoan, for a retry that may not start a loan (see
// PeekNoNewLoanAt).
func (b *Budget) withdrawFor(t, fleet int64, newLoan bool) bool {
	b.mu.Lock()
	t = b.advance(t)
	b.fleet = fleet
	ok := b.grants(t, newLoan)
	b.fleet = 0
	b.ask++ // asked for in the current slot
	b.settle(ok)
	b.mu.Unlock()
	return ok
}

// PeekNoNewLoanAt is PeekAt for a retry the Budget is not to start a
// loan for: it reports whether the credit pays for one at now, or a loan
// already under way (lent within LendFor of its start) does; a false
// answer counts as the refused withdrawal it stands for. The suite's
// client asks it when the server said its own retry budget could not pay
// for the retry: the start-up loan is for a failure the fleet has not yet
// paid for, and the fleet's server, which sees every client, knows when it
// has (a quiet client's first failed call may come long after the
// fleet's). A nil *Budget always returns true.
func (b *Budget) PeekNoNewLoanAt(now time.Time) bool { return b.peekAt(now, false) }

// WithdrawNoNewLoanAt is WithdrawAt for a retry the Budget is not to
// start a loan for (see PeekNoNewLoanAt): granted from the credit, or lent
// by a loan already under way. A nil *Budget always returns true.
func (b *Budget) WithdrawNoNewLoanAt(now time.Time) bool {
	if b == nil {
		return true
	}
	return b.withdrawFor(b.rel(offset(now)), 0, false)
}

// grants is grantable, or, without newLoan, grantableNoNewLoan. b.mu must
// be held.
func (b *Budget) grants(t int64, newLoan bool) bool {
	if newLoan {
		return b.grantable(t)
	}
	return b.grantableNoNewLoan(t)
}

// grantableNoNewLoan is grantable for a withdrawal that may not start a
// loan: the credit pays for it, or the Budget is lending within LendFor of
// a loan's start. b.mu must be held.
func (b *Budget) grantableNoNewLoan(t int64) bool {
	if b.credit >= unit {
		return true
	}
	if !b.lending || !b.started || t-b.began >= int64(LendFor) {
		return false
	}
	return b.grantable(t)
}

// Hedge asks for one hedge and reports whether it may be sent. It is
// granted from the credit as Withdraw is, but lent only while the Budget is
// owed at most half its loan limit: a hedge is sent for latency, and the
// rest of the loan is kept for the retries that rescue failures. A refused
// hedge neither stops the Budget lending nor counts as demand when it
// judges whether to lend again (it shows a slow call, not a failed one); a
// granted one counts as a retry does. On false nothing is withdrawn. It
// reads the monotonic clock; use HedgeAt if you already have the time.
//
// So a burst of slow calls (a fresh client whose first calls are slower
// than the ones its hedging delay was learned from, a pause of the whole
// process) can neither leave the first failures after it without a retry
// nor stop hedges for the hundred calls it takes to repay a whole loan.
func (b *Budget) Hedge() bool {
	if b == nil {
		return true
	}
	return b.hedge(b.rel(clock()))
}

// HedgeAt is Hedge at time now. A now earlier than the latest time the
// Budget has seen counts as that latest time.
func (b *Budget) HedgeAt(now time.Time) bool {
	if b == nil {
		return true
	}
	return b.hedge(b.rel(offset(now)))
}

func (b *Budget) hedge(t int64) bool {
	b.mu.Lock()
	t = b.advance(t)
	lend := b.lends(t)
	ok := b.credit >= unit || (lend && b.credit-unit >= -b.limit()/2)
	if ok {
		b.ask++
	}
	b.settle(ok)
	b.mu.Unlock()
	return ok
}

// settle counts a withdrawal granted (ok) or refused, and takes a granted
// one from the credit. b.mu must be held.
func (b *Budget) settle(ok bool) {
	if !ok {
		b.refused++
		return
	}
	if b.credit < unit {
		b.lent++
	}
	b.credit -= unit
	b.granted++
}

// grantable decides a withdrawal at offset t: the credit pays for it, or
// the Budget lends it. b.mu must be held.
func (b *Budget) grantable(t int64) bool {
	lend := b.lends(t)
	switch {
	case b.credit >= unit:
		return true
	case !lend:
		return false
	case b.credit-unit >= -b.limit():
		return true
	}
	// It has lent all it may: it lends again only once repaid and judged
	// (lends), so that a failure that outlasts the loan is funded by the
	// ratio alone.
	b.lending = false
	return false
}

// lends reports whether the Budget lends at offset t to a withdrawal asked
// for then, and records what that withdrawal starts (see lending). b.mu
// must be held.
func (b *Budget) lends(t int64) bool {
	b.lending, b.started, b.began = b.lendingAt(t)
	return b.lending
}

// lendingAt is the lending state a withdrawal asked for at offset t finds,
// without changing b. The Budget lends for LendFor from the first
// withdrawal asked for while it lends; then, and after it has lent all it
// may, it lends again once it is owed nothing and the last JudgeWindow
// asked for at most Ratio × its requests (the withdrawal not counted): a
// client whose failures stay below the ratio lends again at once. b.mu
// must be held.
func (b *Budget) lendingAt(t int64) (lending, started bool, began int64) {
	lending, started, began = b.lending, b.started, b.began
	if lending && started && t-began >= int64(LendFor) {
		lending = false
	}
	if !lending && b.credit >= 0 && b.judgedUnder() {
		lending, started = true, false
	}
	if lending && !started {
		started, began = true, t
	}
	return lending, started, began
}

// judgedUnder reports whether the withdrawals asked for in the last
// JudgeWindow are at most Ratio × its deposits: ask × unit ≤ dep × per, in
// 128 bits. b.mu must be held.
func (b *Budget) judgedUnder() bool {
	ah, al := bits.Mul64(uint64(b.judgeAsk+b.ask), unit)
	dh, dl := bits.Mul64(uint64(b.judgeDep+b.dep), uint64(b.per))
	return ah < dh || (ah == dh && al <= dl)
}

// limit is the most the Budget may be owed: Burst, or Ratio × the deposits
// of the last ShortWindow if that is more; for a withdrawal on behalf of
// a fleet (b.fleet clients, see Method), Burst per client if that is more
// still, but at most one retry per deposit of the last ShortWindow. b.mu
// must be held.
func (b *Budget) limit() int64 {
	deps := b.shortDep + b.dep
	hi, lo := bits.Mul64(uint64(deps), uint64(b.per))
	if hi != 0 || lo > math.MaxInt64/2 {
		return math.MaxInt64 / 2
	}
	l := max(b.burst, int64(lo))
	if b.fleet > 1 {
		l = max(l, min(satmath.Mul(b.fleet, b.burst), satmath.Mul(deps, unit), math.MaxInt64/2))
	}
	return l
}

// PeekAt reports whether WithdrawAt(now) would be granted, without taking
// anything, so that a caller need not wait (a backoff) for a retry that
// would be refused. A false answer counts as the refused withdrawal it
// stands for (Stats.Refused, and the demand the Budget judges before it
// lends again). A nil *Budget always returns true.
func (b *Budget) PeekAt(now time.Time) bool { return b.peekAt(now, true) }

// peekAt is PeekAt, or, without newLoan, PeekNoNewLoanAt.
func (b *Budget) peekAt(now time.Time, newLoan bool) bool {
	if b == nil {
		return true
	}
	t := b.rel(offset(now))
	b.mu.Lock()
	defer b.mu.Unlock()
	t = b.advance(t)
	if b.grants(t, newLoan) {
		return true
	}
	b.ask++ // asked for in the current slot
	b.refused++
	return false
}

// Stats returns a snapshot of b's counters and balance now (on the
// monotonic clock). For a nil *Budget it returns the zero Stats.
func (b *Budget) Stats() Stats {
	if b == nil {
		return Stats{}
	}
	return b.stats(b.rel(clock()))
}

// StatsAt is Stats at time now. A now earlier than the latest time the
// Budget has seen counts as that latest time.
func (b *Budget) StatsAt(now time.Time) Stats {
	if b == nil {
		return Stats{}
	}
	return b.stats(b.rel(offset(now)))
}

func (b *Budget) stats(t int64) Stats {
	b.mu.Lock()
	defer b.mu.Unlock()
	t = b.advance(t)
	lend, _, _ := b.lendingAt(t) // as a withdrawal now would find it
	bal := b.credit / unit
	if lend {
		bal = (b.credit + b.limit()) / unit
	}
	return Stats{
		Requests: b.requests,
		Granted:  b.granted,
		Lent:     b.lent,
		Refused:  b.refused,
		Credit:   float64(b.credit) / unit,
		Lending:  lend,
		Balance:  float64(max(bal, 0)),
	}
}

// advance folds the pending deposits in and moves both windows to offset t,
// or to the latest offset seen if that is later, and returns the offset it
// moved to; b.mu must be held.
func (b *Budget) advance(t int64) int64 {
	if !b.ready {
		b.setup(Config{})
	}
	if p := b.pending.Swap(0); p != 0 {
		// Fold the pending deposits into the slot they were made in (that
		// of the latest time seen: a deposit at or after the edge takes
		// the lock) and into the credit, which holds at most MaxCredit.
		b.dep = satmath.Add(b.dep, int64(min(p, math.MaxInt64)))
		b.requests += p
		hi, lo := bits.Mul64(p, uint64(b.per))
		if hi != 0 || lo > math.MaxInt64/2 {
			b.credit = MaxCredit * unit // more than any debt: the credit is never below -MaxInt64/2
		} else {
			b.credit = min(b.credit+int64(lo), MaxCredit*unit)
		}
	}
	if t <= b.last {
		return b.last
	}
	if t >= b.edge.Load() {
		// A new slot: the current slot's counts go to the windows, whose
		// sums are read once for the slot that starts.
		b.short.Add(b.last, kindDeposit, b.dep)
		b.judge.Add(b.last, kindDeposit, b.dep)
		b.judge.Add(b.last, kindAsk, b.ask)
		b.dep, b.ask = 0, 0
		b.shortDep, _ = b.short.Counts(t)
		b.judgeDep, b.judgeAsk = b.judge.Counts(t)
		// The next slot boundary: the judge window's slots are whole
		// numbers of the short window's, both from time 0 (the first
		// time plus bias), so the short window's next boundary is the
		// nearer.
		w := int64(b.short.Width())
		b.edge.Store(satmath.Mul(satmath.Add(b.short.Slot(t), 1), w))
	}
	b.last = t
	return t
}
