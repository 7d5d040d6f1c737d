package budget

import (
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults applied to zero (or NaN/±Inf) Config fields.
const (
	DefaultRatio        = 0.1
	DefaultTTL          = 10 * time.Second
	DefaultMinPerSecond = 10.0
)

// Limits applied to large Config values.
const (
	// MaxRatio is the largest Ratio honoured; larger values are lowered to it.
	MaxRatio = 1000.0
	// MaxMinPerSecond is the largest MinPerSecond honoured; larger values are
	// lowered to it.
	MaxMinPerSecond = 1e9
)

// ShortWindow is the no-bank window: when TTL is longer than ShortWindow, a
// retry funded by the ratio needs credit both in the last TTL and in the
// last ShortWindow. See the package documentation.
const ShortWindow = time.Second

const (
	unit       = 1_000_000 // micro-retries per retry: the fixed-point unit
	longSlots  = 100       // slots in the TTL window
	shortSlots = 10        // slots in the short window
	maxPeriod  = int64(1) << 62
)

// Config configures a Budget. The zero Config is valid and means the
// defaults: 10% retries, a 10 s TTL and a floor of ten retries per second
// (with a burst of ten, so a fresh client's first failures are retried).
//
// Fields are read once, by New (or NewRegistry); later changes to the Config
// have no effect on Budgets already made.
type Config struct {
	// Ratio is the number of retries plus hedges allowed per request
	// (Deposit), over the last TTL and, if TTL is longer, over the last
	// ShortWindow (one second).
	//
	// 0, NaN and ±Inf mean DefaultRatio (0.1). A negative Ratio means none:
	// only the floor funds retries. Values above MaxRatio are lowered to it.
	// Ratio is used in units of 1e-6 (rounded to the nearest), so 0.1 is
	// exact and 50 deposits fund exactly 5 retries; a Ratio below 5e-7 rounds
	// to none.
	Ratio float64

	// TTL is how long a request's deposit counts. Deposits are kept in 100
	// slots of TTL/100 each (TTL slots of 1ns if TTL < 100ns), and a deposit
	// stops counting when it is between TTL minus one slot and TTL old:
	// never later than TTL.
	//
	// 0 and negative values mean DefaultTTL (10 s).
	TTL time.Duration

	// MinPerSecond is the floor: a token bucket that refills at
	// MinPerSecond retries per second and holds at most max(1,
	// MinPerSecond), so a client sending one request a minute can still
	// retry. It is a minimum, not an addition: every granted retry takes a
	// token if there is one, and counts against the ratio's credit, whatever
	// funded it; a retry the ratio refuses is granted only on a token. So
	// the retries in a second are about max(Ratio × requests, MinPerSecond),
	// and a burst of failures gets at most the floor's burst. The bucket
	// starts full.
	//
	// 0, NaN and ±Inf mean DefaultMinPerSecond (10). A negative MinPerSecond
	// means no floor. Values above MaxMinPerSecond are lowered to it.
	MinPerSecond float64

	// Now is the clock; nil means time.Now (of which a Budget then reads
	// only the monotonic part). Now must be safe for concurrent use. Times
	// earlier than the latest one the Budget has seen are treated as that
	// latest time.
	Now func() time.Time
}

// Stats is a snapshot of a Budget, for telemetry.
type Stats struct {
	Requests  uint64 // Deposit calls since the Budget was made
	Granted   uint64 // Withdraw calls that returned true, FromFloor included
	FromFloor uint64 // of Granted, those funded by the floor, not the ratio
	Refused   uint64 // Withdraw calls that returned false

	// Balance is the number of Withdraw calls that would return true if they
	// were made back to back at the time of the snapshot, with no Deposit in
	// between: the larger of the ratio credit available in both windows, in
	// whole retries, and the whole tokens in the floor. It is always a whole number; it is
	// a float64 because it is meant for gauges.
	Balance float64
}

// A Budget decides whether a retry or a hedge may be sent to one target.
//
// Call Deposit once per logical call, before its first attempt, and
// Withdraw once per retry and once per hedge; send the retry or hedge only
// if Withdraw returned true.
//
// The zero value is a usable Budget with the default Config (time.Now as the
// clock). A nil *Budget imposes no budget: Deposit does nothing, Withdraw
// always returns true and Stats returns the zero Stats. All methods are safe
// for concurrent use; none starts a goroutine. A Budget must not be copied
// after first use.
type Budget struct {
	// now and epoch are written only by New, before b is shared, so they
	// are read without the lock. Times are handled as offsets: nanoseconds
	// since epoch (since processEpoch when now is nil).
	now   func() time.Time
	epoch time.Time
	_     [32]byte // keep the read-only line apart from the shared state

	// Deposit's fast path, without the lock: while its time is before edge
	// (the next slot boundary of either window, written under mu), a
	// Deposit only adds 1 to pending; holders of mu count pending as part of
	// the current slots and fold it into them before the slots move.
	edge    atomic.Int64
	pending atomic.Uint64

	// Everything below is guarded by mu, and ordered so that a call touches
	// few cache lines: the state every call uses, then the slots.
	mu       sync.Mutex
	last     int64  // the latest offset seen; time never goes backwards
	credit   uint64 // micro-retries credited per Deposit; 0: ratio off
	ready    bool   // set up (false only in a zero Budget before first use)
	useShort bool   // TTL > ShortWindow: the short window applies
	floor    bool   // floor on

	requests, granted, fromFloor, refused uint64

	sw, lw window // short and TTL ("long") windows

	interval int64 // floor: nanoseconds per token (rounded up)
	tau      int64 // floor: burst tolerance, (burst-1)*interval, rounded down
	tat      int64 // floor: theoretical arrival time (GCRA)

	short [shortSlots]slot
	long  [longSlots]slot
}

// slot counts the deposits and the ratio-funded withdrawals of one slot.
type slot struct{ dep, grant uint64 }

// window is a ring of n slots of width ns each, ending at slot cur (an
// absolute index: offset/width); dep and grant are the sums over the ring.
type window struct {
	width, n, cur, idx int64
	dep, grant         uint64
}

// processEpoch is the origin of offsets for Budgets on the default clock:
// with it, reading the clock is time.Since, which reads only the monotonic
// clock (time.Now reads two).
var processEpoch = time.Now()

// New returns a Budget configured by c (see Config for the defaults and for
// what invalid values mean). If c.Now is not nil, New calls it once, to
// start the clock.
func New(c Config) *Budget {
	b := &Budget{now: c.Now, epoch: processEpoch}
	if c.Now != nil {
		b.epoch = c.Now()
	}
	b.setup(c)
	return b
}

// clock reads the Budget's clock as an offset.
func (b *Budget) clock() int64 {
	if b.now == nil {
		return int64(time.Since(processEpoch))
	}
	return int64(b.now().Sub(b.epoch))
}

// offset converts now to an offset.
func (b *Budget) offset(now time.Time) int64 {
	if b.now == nil {
		return int64(now.Sub(processEpoch))
	}
	return int64(now.Sub(b.epoch))
}

// setup applies c; b.mu must be held (or b not yet shared).
func (b *Budget) setup(c Config) {
	b.ready = true

	ratio := c.Ratio
	if ratio == 0 || math.IsNaN(ratio) || math.IsInf(ratio, 0) {
		ratio = DefaultRatio
	}
	if ratio > 0 {
		b.credit = uint64(math.Round(math.Min(ratio, MaxRatio) * unit))
	}

	ttl := int64(c.TTL)
	if ttl <= 0 {
		ttl = int64(DefaultTTL)
	}
	b.lw = newWindow(ttl, longSlots)
	b.sw = newWindow(min(ttl, int64(ShortWindow)), shortSlots)
	b.useShort = ttl > int64(ShortWindow)
	b.edge.Store(min(b.lw.width, b.sw.width))

	rate := c.MinPerSecond
	if rate == 0 || math.IsNaN(rate) || math.IsInf(rate, 0) {
		rate = DefaultMinPerSecond
	}
	if rate > 0 {
		rate = math.Min(rate, MaxMinPerSecond)
		b.floor = true
		// Round the interval up and the tolerance down, so the floor never
		// grants more than MinPerSecond with a burst of max(1, MinPerSecond).
		iv := math.Ceil(1e9 / rate)
		if iv >= float64(maxPeriod) {
			iv = float64(maxPeriod)
		}
		b.interval = max(1, int64(iv))
		b.tau = int64(math.Floor((math.Max(1, rate) - 1) * float64(b.interval)))
	}
}

// newWindow splits span nanoseconds into at most n slots whose total is at
// most span, so a deposit never counts for longer than span.
func newWindow(span, n int64) window {
	if span < n {
		return window{width: 1, n: span}
	}
	return window{width: span / n, n: n}
}

// Deposit records one logical call; call it once per call, before the first
// attempt. It never refuses and never blocks for long. It reads the clock
// (Config.Now); use DepositAt if you already have the time.
func (b *Budget) Deposit() {
	if b == nil {
		return
	}
	b.deposit(b.clock())
}

// DepositAt is Deposit at time now, which should come from the same clock as
// Config.Now. A now earlier than the latest time the Budget has seen counts
// as that latest time.
func (b *Budget) DepositAt(now time.Time) {
	if b == nil {
		return
	}
	b.deposit(b.offset(now))
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
// sent. It is granted if the ratio has credit for it in both the TTL window
// and the short window, or else if the floor has a token (a grant of
// either kind takes a floor token when there is one); on false nothing is
// withdrawn. It reads the clock (Config.Now); use WithdrawAt if you
// already have the time.
func (b *Budget) Withdraw() bool {
	if b == nil {
		return true
	}
	return b.withdraw(b.clock())
}

// WithdrawAt is Withdraw at time now, which should come from the same clock
// as Config.Now. A now earlier than the latest time the Budget has seen
// counts as that latest time.
func (b *Budget) WithdrawAt(now time.Time) bool {
	if b == nil {
		return true
	}
	return b.withdraw(b.offset(now))
}

func (b *Budget) withdraw(t int64) bool {
	b.mu.Lock()
	t = b.advance(t)
	p := b.pending.Load()
	// The floor is a minimum, not an addition: every grant takes a floor
	// token if one is there, so the floor funds a retry only when the
	// ratio's own grants have fallen below its rate.
	floorToken := false
	if b.floor {
		tat := max(b.tat, t)
		if floorToken = tat-t <= b.tau; floorToken {
			b.tat = satAdd(tat, b.interval)
		}
	}
	ratio := b.credit != 0 && b.funded(&b.lw, p) && (!b.useShort || b.funded(&b.sw, p))
	if !ratio && !floorToken {
		b.refused++
		b.mu.Unlock()
		return false
	}
	// Every grant counts against the ratio's credit, including one the
	// floor funded: a retry the floor let through early (before the
	// deposits of a burst arrived) is not granted again by the ratio.
	b.short[b.sw.idx].grant++
	b.sw.grant++
	b.long[b.lw.idx].grant++
	b.lw.grant++
	b.granted++
	if !ratio {
		b.fromFloor++
	}
	b.mu.Unlock()
	return true
}

// Stats returns a snapshot of b's counters and balance at the time given by
// Config.Now. For a nil *Budget it returns the zero Stats.
func (b *Budget) Stats() Stats {
	if b == nil {
		return Stats{}
	}
	t := b.clock()
	b.mu.Lock()
	defer b.mu.Unlock()
	t = b.advance(t)
	p := b.pending.Load()
	bal := b.whole(&b.lw, p)
	if b.useShort {
		bal = min(bal, b.whole(&b.sw, p))
	}
	if b.floor {
		// Ratio grants use floor tokens too: back to back, the floor adds
		// only what it has beyond the ratio's credit.
		if d := max(b.tat, t) - t; d <= b.tau {
			bal = max(bal, uint64((b.tau-d)/b.interval)+1)
		}
	}
	return Stats{
		Requests:  b.requests + p,
		Granted:   b.granted,
		FromFloor: b.fromFloor,
		Refused:   b.refused,
		Balance:   float64(bal),
	}
}

// funded reports whether w, with p more deposits in its current slot, has
// the credit for one more ratio-funded withdrawal:
// (grant+1)*unit <= (dep+p)*credit, in 128 bits.
func (b *Budget) funded(w *window, p uint64) bool {
	dh, dl := bits.Mul64(w.dep+p, b.credit)
	gh, gl := bits.Mul64(w.grant+1, unit)
	return dh > gh || (dh == gh && dl >= gl)
}

// whole is the number of whole retries w's ratio credit funds, with p more
// deposits in its current slot.
func (b *Budget) whole(w *window, p uint64) uint64 {
	hi, lo := bits.Mul64(w.dep+p, b.credit)
	var c uint64 = math.MaxUint64
	if hi < unit {
		c, _ = bits.Div64(hi, lo, unit)
	}
	if c <= w.grant {
		return 0
	}
	return c - w.grant
}

// advance moves both windows to offset t, or to the latest offset seen if
// that is later, and returns the offset it moved to; b.mu must be held.
func (b *Budget) advance(t int64) int64 {
	if !b.ready {
		b.setup(Config{})
	}
	if t <= b.last {
		return b.last
	}
	b.last = t
	if t >= b.edge.Load() {
		// Fold the pending deposits into the slots they were made in.
		if p := b.pending.Swap(0); p != 0 {
			b.short[b.sw.idx].dep += p
			b.sw.dep += p
			b.long[b.lw.idx].dep += p
			b.lw.dep += p
			b.requests += p
		}
		b.sw.moveTo(t/b.sw.width, b.short[:])
		b.lw.moveTo(t/b.lw.width, b.long[:])
		b.edge.Store(min(satAdd(satMul(b.sw.cur, b.sw.width), b.sw.width),
			satAdd(satMul(b.lw.cur, b.lw.width), b.lw.width)))
	}
	return t
}

// moveTo makes slot s (>= w.cur) the current slot, emptying the slots that
// leave the window.
func (w *window) moveTo(s int64, slots []slot) {
	if s == w.cur {
		return
	}
	if s-w.cur >= w.n {
		clear(slots[:w.n])
		w.dep, w.grant = 0, 0
	} else {
		for c := w.cur + 1; c <= s; c++ {
			i := c % w.n
			w.dep -= slots[i].dep
			w.grant -= slots[i].grant
			slots[i] = slot{}
		}
	}
	w.cur, w.idx = s, s%w.n
}

func satAdd(a, b int64) int64 {
	if s := a + b; s >= a {
		return s
	}
	return math.MaxInt64
}

func satMul(a, b int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi != 0 || lo > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(lo)
}
