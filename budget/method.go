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

// The window over which a Method judges how its method fares.
const (
	// MethodWindow is how far back a Method looks at its method's
	// outcomes: an outcome counts for between 3 and 4 s (the window moves
	// in steps of a second).
	MethodWindow = 4 * time.Second
	// MethodMinCalls is the fewest outcomes in the window on which a
	// Method judges that its method fails: with fewer, it does not.
	MethodMinCalls = 10
)

// methodSlots is the number of slots of a Method's window.
const methodSlots = 4

// A Method is the retry budget a server applies to one of its methods:
// the retries and hedges it admits are paid for by the first attempts it
// admits, as a client's Budget pays for the retries it sends. It bounds
// the whole fleet of the method's callers, whatever their own budgets (or
// none, for callers the server does not control).
//
// It lends as the fleet's own Budgets would: at the start of a failure, a
// fresh or quiet client's Budget lends it Burst retries, so a fleet of N
// clients lends N × Burst, repaid by their next calls. The Method lends up
// to Burst for each client that sent it a first attempt in the last 1 to
// 2 s (told apart by the client number AdmitAt is given), and at most one
// retry per first attempt of the last ShortWindow; or what the Budget
// lends alone (Burst, or Ratio × the last ShortWindow's first attempts),
// if that is more. Were it to lend less, a fleet whose Budgets lent for
// their first failures would find those retries refused here, each
// charged twice. So the documented allowance of the fleet's start-up is
// the same whether the clients budget their retries or not.
//
// It refuses only while the method fails: while more than the Budget's
// Ratio of its recent outcomes (MethodWindow, at least MethodMinCalls of
// them) were failures. The retries it gets then are the ones its failures
// cause, and one the Budget cannot pay for is refused. While the method
// serves, the retries it gets are fail-overs from other servers or the
// odd retry of a transient failure: they are admitted, and cost nothing,
// since refusing them would cost the callers what a healthy server can
// give.
//
// Call AdmitAt once for each attempt that arrives, before the method runs
// it, and serve the attempt only if it returned true; call DoneAt once for
// each attempt AdmitAt admitted, when it has ended, and for an attempt the
// server refused before asking (an overload guard's refusal fails its
// caller too). Whether an attempt is a retry is the caller's word (gRFC
// A6's grpc-previous-rpc-attempts): a caller that hides it is taken for a
// first attempt, and pays for the retries of others.
//
// The zero value is a usable Method whose Budget has the default Config.
// A nil *Method admits every attempt and records nothing. All methods are
// safe for concurrent use; none starts a goroutine. A Method must not be
// copied after first use.
type Method struct {
	once     sync.Once
	made     bool // by NewMethod: b is as given (nil: no budget)
	b        *Budget
	per      int64           // b's ratio, in micro-retries per deposit
	outcomes *window.Counter // served, failed
	origin   window.Origin   // the first time the Method saw
	clients  clientSketch    // the clients that sent first attempts lately
}

// NewMethod returns a Method that pays for retries from b, one method's
// Budget (a Registry's For(method), say): its Config's Ratio is both what
// a first attempt credits and the failure share above which the Method
// refuses. A nil b imposes no budget: every attempt is admitted.
func NewMethod(b *Budget) *Method {
	m := &Method{b: b, made: true}
	m.once.Do(m.setup)
	return m
}

func (m *Method) setup() {
	if !m.made {
		m.b = New(Config{})
	}
	m.per = m.b.perDeposit()
	m.outcomes = window.New(methodSlots, 2, MethodWindow/methodSlots)
}

// AdmitAt decides an attempt of the method arriving at now from client,
// and reports whether the method may run it. A first attempt (retry false)
// is deposited into the Budget and admitted. A retry or hedge is admitted
// while the method does not fail (FailingAt); while it fails, it is
// withdrawn from the Budget, and admitted only if the Budget paid for it.
//
// client tells the method's callers apart, for the loans (see Method): a
// number per client connection, say (a hash of its address). Callers the
// server cannot tell apart share one number; they are lent as one client.
// A client that opens more connections is lent more, at most one retry
// per first attempt of the last ShortWindow, and repays it from the first
// attempts that follow.
func (m *Method) AdmitAt(now time.Time, retry bool, client uint64) bool {
	if m == nil {
		return true
	}
	m.once.Do(m.setup)
	t := m.at(now)
	if !retry {
		m.clients.add(t, client)
		m.b.DepositAt(now)
		return true
	}
	if !m.failing(t) {
		return true
	}
	return m.b.takePromised(now) || m.b.withdrawForFleet(now, m.clients.estimate(t))
}

// DoneAt records how an attempt of the method ended at now: failed says
// the method failed its caller (a failure a retry elsewhere might cure:
// unavailable, overloaded, timed out, internal), as opposed to success or
// the caller's own fault.
func (m *Method) DoneAt(now time.Time, failed bool) {
	if m == nil {
		return
	}
	m.once.Do(m.setup)
	kind := 0
	if failed {
		kind = 1
	}
	m.outcomes.Add(m.at(now), kind, 1)
}

// FailingAt reports whether the method fails at now: more than the
// Budget's Ratio of its outcomes in the last MethodWindow, at least
// MethodMinCalls of them, were failures. A nil *Method never fails.
func (m *Method) FailingAt(now time.Time) bool {
	if m == nil {
		return false
	}
	m.once.Do(m.setup)
	return m.failing(m.at(now))
}

// failing is FailingAt at t, on the Method's time line.
func (m *Method) failing(t int64) bool {
	ok, failed := m.outcomes.Counts(t)
	n := ok + failed
	return n >= MethodMinCalls && float64(failed)*unit > float64(m.per)*float64(n)
}

// at converts now to the Method's time line: nanoseconds since the first
// time it saw, so that its window's slots start then, whichever clock
// drives it.
func (m *Method) at(now time.Time) int64 { return m.origin.Since(offset(now)) }

// perDeposit returns what one Deposit credits, in micro-retries (0 for a
// nil Budget).
func (b *Budget) perDeposit() int64 {
	if b == nil {
		return 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.ready {
		b.setup(Config{})
	}
	return b.per
}

// withdrawForFleet is WithdrawAt on behalf of a Method that saw clients
// clients lately: it may lend Burst to each (see limit).
func (b *Budget) withdrawForFleet(now time.Time, clients int64) bool {
	if b == nil {
		return true
	}
	return b.withdrawFor(b.rel(offset(now)), clients, true)
}

// PromiseAt is asked when an attempt of the method that AdmitAt admitted
// has failed at now (after its DoneAt), retry saying whether it was a
// retry or hedge, and reports whether the Method would admit a retry of
// it: the answer to give its caller, who should not send a retry the
// Method would refuse. While the method does not fail it returns true
// and takes nothing (a retry is admitted then as any retry is).
//
// While it fails, a first attempt's retry is withdrawn from the Budget
// now, as AdmitAt would withdraw it (lent as AdmitAt lends), and if the
// Budget pays, the retry is promised: the next retry AdmitAt sees while
// the method fails takes the first promise still held instead of
// withdrawing again (retries are not told apart: a promise is the
// fleet's, as the credit is). A promise not taken by the end of the
// second after the one it was made in lapses, and the credit withdrawn
// for it is given back (up to the most the Budget banks). A retry's
// failure is not promised another (the server cannot tell whether its
// caller has attempts left, and a promise its caller does not take would
// hold credit others need): the answer is whether the Budget could pay
// for one now, and a retry that comes is charged when it arrives.
//
// A false answer counts as the refused withdrawal it stands for. A nil
// *Method returns true.
func (m *Method) PromiseAt(now time.Time, retry bool) bool {
	if m == nil {
		return true
	}
	m.once.Do(m.setup)
	t := m.at(now)
	if !m.failing(t) {
		return true
	}
	return m.b.promiseForFleet(now, m.clients.estimate(t), !retry)
}

// promiseForFleet is withdrawForFleet for a retry a Method promises (see
// Method.PromiseAt): granted, it is held for the retry to come; or, if
// not hold, only asked about (a refusal is counted, a grant takes
// nothing).
func (b *Budget) promiseForFleet(now time.Time, clients int64, hold bool) bool {
	if b == nil {
		return true
	}
	t := b.rel(offset(now))
	b.mu.Lock()
	defer b.mu.Unlock()
	t = b.advance(t)
	b.fleet = clients
	ok := b.grantable(t)
	b.fleet = 0
	switch {
	case !ok:
		b.ask++ // asked for in the current slot
		b.refused++
	case hold:
		b.ask++
		b.settle(true)
		sec := b.lapsePromises(t)
		b.promised[sec&1]++
	}
	return ok
}

// takePromised takes a retry a Method promised and reports whether there
// was one: the oldest promise still held pays for the retry arriving at
// now.
func (b *Budget) takePromised(now time.Time) bool {
	if b == nil {
		return false
	}
	t := b.rel(offset(now))
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.promised[0] == 0 && b.promised[1] == 0 {
		return false
	}
	sec := b.lapsePromises(b.advance(t))
	for _, s := range [2]int64{sec - 1, sec} {
		if i := s & 1; b.promisedSec[i] == s && b.promised[i] > 0 {
			b.promised[i]--
			return true
		}
	}
	return false
}

// lapsePromises ends the promises made before the second before t's,
// giving their credit back (up to MaxCredit, as a deposit's), readies
// the slot of t's second, and returns that second. b.mu must be held.
func (b *Budget) lapsePromises(t int64) int64 {
	sec := t / int64(time.Second)
	for i := range b.promisedSec {
		if b.promisedSec[i] < sec-1 {
			if n := b.promised[i]; n > 0 {
				b.credit = min(b.credit+satmath.Mul(n, unit), MaxCredit*unit)
				b.promised[i] = 0
			}
		}
	}
	b.promisedSec[sec&1] = sec
	return sec
}

// clientSketch estimates how many distinct clients were seen in the
// current and the previous second of a time line: a bitmap of
// sketchBits bits per second, read by linear counting (its estimate is
// within a few percent up to about 2,000 clients, and saturates at about
// 7,000). Lock-free; a client seen as its second starts may be missed.
type clientSketch struct {
	secs [2]sketchSecond
}

const (
	sketchBits  = 1024
	sketchWords = sketchBits / 64
)

type sketchSecond struct {
	n    atomic.Int64 // the second it counts, plus one (0: none yet)
	bits [sketchWords]atomic.Uint64
}

// add records client at t (nanoseconds on the Method's time line, ≥ 0).
func (s *clientSketch) add(t int64, client uint64) {
	n := t/int64(time.Second) + 1
	sec := &s.secs[n&1]
	for {
		old := sec.n.Load()
		if old == n {
			break
		}
		if old > n {
			return // a late add, for a second already gone
		}
		if sec.n.CompareAndSwap(old, n) {
			for i := range sec.bits {
				sec.bits[i].Store(0)
			}
			break
		}
	}
	h := mix(client) % sketchBits
	sec.bits[h/64].Or(1 << (h % 64))
}

// estimate returns the number of distinct clients added in t's second and
// the one before it.
func (s *clientSketch) estimate(t int64) int64 {
	n := t/int64(time.Second) + 1
	zeros := 0
	for i := range sketchWords {
		var w uint64
		for k := range s.secs {
			if sec := &s.secs[k]; sec.n.Load() == n || sec.n.Load() == n-1 {
				w |= sec.bits[i].Load()
			}
		}
		zeros += 64 - bits.OnesCount64(w)
	}
	switch zeros {
	case sketchBits:
		return 0
	case 0:
		return math.MaxInt32 // saturated: more than the sketch tells
	}
	return int64(math.Round(-sketchBits * math.Log(float64(zeros)/sketchBits)))
}

// mix spreads the bits of x (splitmix64's finaliser), so that client
// numbers that differ in a few bits land on different bits of the sketch.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}
