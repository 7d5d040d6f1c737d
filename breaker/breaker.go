package breaker

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stormguard/stormguard/internal/satmath"
	"github.com/stormguard/stormguard/internal/window"
)

// ErrOpen is returned by Allow and Admit when the breaker refuses an attempt:
// it is open, or half-open with all probe slots taken. Compare with
// errors.Is.
var ErrOpen = errors.New("breaker: circuit open")

// Breaker is a circuit breaker for one target.
//
// Create one with New or Registry.For. The zero value is a closed Breaker
// with the default Config (and no name, no callback). A Breaker must not be
// copied after first use. All methods are safe for concurrent use; none
// starts a goroutine.
//
// The methods without a time read the monotonic clock; the At forms take
// the time from the caller (a simulator, or a caller that has just read the
// clock). Times a Breaker is given should come from one clock: its time
// line starts at the first time it sees.
type Breaker struct {
	// word is gen<<2 | state. It is written only under mu and read without
	// a lock by the closed-state fast paths.
	word atomic.Uint64
	// consec is the run of failures while closed: written under mu, reset
	// by lock-free successes.
	consec atomic.Int64
	// openUntil is when the open period ends, on the breaker's time line:
	// written under mu before the state word, read without a lock to refuse
	// quickly.
	openUntil atomic.Int64
	// rejected counts attempts refused with ErrOpen.
	rejected atomic.Uint64
	// origin is instant 0 of the breaker's time line: the first time it
	// sees, as an offset from procEpoch; its window's buckets start then.
	origin window.Origin
	// win counts the attempts and failures of the closed state, in
	// windowBuckets buckets; a success is counted without mu. With a
	// FailureRatio below 1 it is made by init; with 1 (lazy), at the first
	// failure (under mu), since until then the only thing the breaker
	// needs to know is its latest success, lastOK (the instant plus one; 0:
	// none), with which the window starts.
	win    atomic.Pointer[window.Counter]
	lazy   atomic.Bool
	lastOK atomic.Int64

	// Set by New before the Breaker is shared; never written afterwards.
	target string

	mu     sync.Mutex
	inited bool
	s      settings

	// open
	rounds int // consecutive failed probe rounds: the open period's growth

	// half-open
	inflight  int           // probes admitted in this generation, not yet reported
	probeOK   int           // probes that succeeded in this generation
	lastProbe time.Duration // since epoch, when the newest probe was admitted

	opened uint64 // transitions to open

	// OnStateChange delivery: transitions queued under mu, delivered in
	// order by whichever goroutine holds dispatching.
	pending     []transition
	dispatching bool
}

type transition struct{ from, to State }

const stateMask = 3

// The kinds of outcome the window counts.
const (
	kindAttempt = iota
	kindFailure
)

// New returns a closed Breaker configured by c (see Config for defaults).
// Its target is "": a Registry names its breakers.
func New(c Config) *Breaker { return newNamed(c.name, c) }

// newNamed returns a closed Breaker for target configured by c.
func newNamed(target string, c Config) *Breaker {
	b := &Breaker{target: target}
	b.init(c)
	return b
}

// procEpoch is the origin of the offsets times are converted to: reading
// time.Since of a monotonic instant costs one clock read, time.Now two.
var procEpoch = time.Now()

// init applies c. Called by New, or under mu on first use of a zero Breaker.
func (b *Breaker) init(c Config) {
	b.s = c.settings()
	if b.s.ratio < 1 {
		b.win.Store(window.New(windowBuckets, 2, b.s.width))
	} else {
		b.lazy.Store(true)
	}
	b.inited = true
}

// noteOK records a success at now while the breaker has no window (see
// win): the start of now's bucket, which is all the window would have
// kept of it, so that the successes of one bucket after the first cost a
// load each.
func (b *Breaker) noteOK(now time.Duration) {
	w := b.s.width
	bucket := now / w
	if now < 0 && bucket*w != now {
		bucket-- // round towards −∞, as the window does
	}
	v := int64(bucket*w) + 1
	for old := b.lastOK.Load(); old < v && !b.lastOK.CompareAndSwap(old, v); old = b.lastOK.Load() {
	}
}

// window returns the closed state's window, making it (from the latest
// success) if it is not made yet. b.mu is held.
func (b *Breaker) window() *window.Counter {
	if win := b.win.Load(); win != nil {
		return win
	}
	win := window.New(windowBuckets, 2, b.s.width)
	if ok := b.lastOK.Load(); ok != 0 {
		win.Add(ok-1, kindAttempt, 1)
	}
	b.win.Store(win)
	return win
}

// lock takes mu and initialises a zero Breaker on first use.
func (b *Breaker) lock() {
	b.mu.Lock()
	if !b.inited {
		b.init(Config{})
	}
}

// clock returns the current instant on b's time line, from the monotonic
// clock.
func (b *Breaker) clock() time.Duration { return b.line(time.Since(procEpoch)) }

// at converts a Time to an instant on b's time line.
func (b *Breaker) at(t time.Time) time.Duration { return b.line(t.Sub(procEpoch)) }

// line converts an offset from procEpoch to an instant on b's time line.
func (b *Breaker) line(off time.Duration) time.Duration {
	return time.Duration(b.origin.Since(int64(off)))
}

// toTime converts an instant on b's time line to a Time.
func (b *Breaker) toTime(d time.Duration) time.Time {
	first, _ := b.origin.First()
	return procEpoch.Add(satmath.Add(time.Duration(first), d))
}

// Target returns the target Registry.For made the breaker for ("" for one
// made by New).
func (b *Breaker) Target() string { return b.target }

// Ticket is the admission of one attempt by Admit. Report its outcome with
// Done or Ignore, once: later reports through the same Ticket are no-ops,
// even concurrent ones. A Ticket is a small value that may be stored where
// the caller likes (a struct field, a slice), but keep one copy and report
// through it: the once-only guarantee holds per copy. The zero Ticket, which
// Admit returns with ErrOpen, ignores reports.
type Ticket struct {
	b        *Breaker
	gen      uint64
	reported uint32 // atomic; 1 once reported
}

// Admit asks the breaker for one attempt. If it is refused, Admit returns
// ErrOpen and a zero Ticket, and the attempt must not be made. Otherwise the
// caller makes the attempt and reports its outcome on the Ticket.
//
// Admit and Ticket.Done never allocate. On a closed breaker, Admit and the
// report of a success take no lock (a failure does), and Admit does not
// read the clock. Admit is the fast path under Allow.
func (b *Breaker) Admit() (Ticket, error) {
	if w := b.word.Load(); w&stateMask == uint64(StateClosed) {
		return Ticket{b: b, gen: w >> 2}, nil
	}
	return b.admitSlow(b.clock())
}

// AdmitAt is Admit at time now.
func (b *Breaker) AdmitAt(now time.Time) (Ticket, error) {
	if w := b.word.Load(); w&stateMask == uint64(StateClosed) {
		return Ticket{b: b, gen: w >> 2}, nil
	}
	return b.admitSlow(b.at(now))
}

// Done reports the attempt's outcome: failed says whether it counts
// against the target. It is ignored if the breaker changed state since
// Admit, or if the Ticket was already reported.
func (t *Ticket) Done(failed bool) {
	if t.b != nil && atomic.CompareAndSwapUint32(&t.reported, 0, 1) {
		t.b.report(t.gen, failed, false, t.b.clock())
	}
}

// DoneAt is Done at time now, for a simulator or a caller that has just
// read the clock (it saves a clock read on the hot path).
func (t *Ticket) DoneAt(failed bool, now time.Time) {
	if t.b != nil && atomic.CompareAndSwapUint32(&t.reported, 0, 1) {
		t.b.report(t.gen, failed, false, t.b.at(now))
	}
}

// Ignore reports that the attempt says nothing about the target (for
// example, its caller cancelled it): it is not counted, and if it was a
// half-open probe, its slot is freed for another.
func (t *Ticket) Ignore() {
	if t.b != nil && atomic.CompareAndSwapUint32(&t.reported, 0, 1) {
		t.b.report(t.gen, false, true, 0)
	}
}

// Allow asks the breaker for one attempt. If it is refused, err is ErrOpen
// and the attempt must not be made (done is then a no-op, never nil).
// Otherwise the caller makes the attempt and calls done once with whether it
// failed; a second call is a no-op, and an outcome reported after the
// breaker changed state is ignored.
//
// Allow is small enough to be inlined, so when the caller does not let done
// escape (calls it, or defers it, in the same function), done lives on the
// caller's stack and an Allow+done pair does not allocate. A done that
// escapes (stored, or passed to a function the compiler cannot see through)
// costs two small allocations; use Admit and Ticket where that matters.
func (b *Breaker) Allow() (done func(failed bool), err error) {
	t, err := b.Admit()
	if err != nil {
		return noop, err
	}
	return t.Done, nil
}

func noop(bool) {}

// admitSlow is Admit at now when the breaker is not (or was not, a moment
// ago) closed.
func (b *Breaker) admitSlow(now time.Duration) (t Ticket, err error) {
	if b.word.Load()&stateMask == uint64(StateOpen) && now < b.openUntilD() {
		// Open and not due to change: refuse without the lock.
		b.rejected.Add(1)
		return Ticket{}, ErrOpen
	}
	b.lock()
	b.advance(now)
	w := b.word.Load()
	err = ErrOpen
	switch State(w & stateMask) {
	case StateClosed:
		t, err = Ticket{b: b, gen: w >> 2}, nil
	case StateHalfOpen:
		if b.inflight < b.s.probes {
			b.inflight++
			b.lastProbe = now
			t, err = Ticket{b: b, gen: w >> 2}, nil
		} else {
			b.rejected.Add(1)
		}
	default:
		b.rejected.Add(1)
	}
	if !b.release() {
		return t, err
	}
	// A callback that panics here must not take the admitted attempt (a
	// half-open probe's slot) with it: the caller gets the panic and no
	// Ticket, so the slot is freed for the next caller.
	defer func() {
		if v := recover(); v != nil {
			t.Ignore()
			panic(v)
		}
	}()
	b.deliver()
	return t, err
}

// report records an outcome for an attempt admitted in generation gen, at
// now (unused for an ignored one).
func (b *Breaker) report(gen uint64, failed, ignored bool, now time.Duration) {
	w := b.word.Load()
	if w>>2 != gen {
		return // stale: no lock needed
	}
	closed := State(w&stateMask) == StateClosed
	if closed && ignored {
		return
	}
	if closed && !failed && b.countOK(now) {
		return
	}
	b.lock()
	w = b.word.Load()
	if w>>2 != gen {
		b.unlock()
		return
	}
	switch State(w & stateMask) {
	case StateClosed:
		if !failed {
			b.countOK(now)
			break
		}
		win := b.window()
		win.Add(int64(now), kindAttempt, 1)
		win.Add(int64(now), kindFailure, 1)
		b.consec.Add(1)
		if b.tripped(now) {
			b.toOpen(now, false)
		}
	case StateHalfOpen:
		b.inflight--
		switch {
		case ignored:
		case failed:
			b.toOpen(now, true)
		default:
			b.probeOK++
			if b.probeOK >= b.s.probes {
				b.toClosed()
			}
		}
	}
	b.unlock()
}

// countOK counts a success of the closed state at now, without the lock,
// and reports whether it could (not on a zero Breaker's first report). The
// common case takes no lock. (Were the breaker to go through a whole
// open/half-open/closed cycle between the check of the generation and this
// count, the stale success would land in the new window: a benign race
// that can only delay opening by one success. So can a success counted
// twice, once as the latest and once in the window made meanwhile.)
func (b *Breaker) countOK(now time.Duration) bool {
	win := b.win.Load()
	if win == nil {
		if !b.lazy.Load() {
			return false
		}
		b.noteOK(now)
		win = b.win.Load() // made meanwhile by a failure: count it there too
	}
	if win != nil {
		win.Add(int64(now), kindAttempt, 1)
	}
	if b.consec.Load() != 0 {
		b.consec.Store(0)
	}
	return true
}

// unlock releases mu and delivers any queued state changes.
func (b *Breaker) unlock() {
	if b.release() {
		b.deliver()
	}
}

// release releases mu and reports whether the caller must deliver the
// queued state changes (deliver), having become their dispatcher.
func (b *Breaker) release() bool {
	deliver := len(b.pending) > 0 && !b.dispatching
	if deliver {
		b.dispatching = true
	}
	b.mu.Unlock()
	return deliver
}

// deliver calls OnStateChange for each queued transition, in order, outside
// the lock, until the queue is empty. Only the goroutine that set
// dispatching runs it, so callbacks never run concurrently; transitions
// queued meanwhile (also by the callbacks themselves) are delivered by the
// same loop.
func (b *Breaker) deliver() {
	finished := false
	defer func() {
		if !finished { // a callback panicked: let the next caller deliver
			b.mu.Lock()
			b.dispatching = false
			b.mu.Unlock()
		}
	}()
	for {
		b.mu.Lock()
		if len(b.pending) == 0 {
			b.pending = b.pending[:0]
			b.dispatching = false
			b.mu.Unlock()
			finished = true
			return
		}
		tr := b.pending[0]
		b.pending = b.pending[1:]
		b.mu.Unlock()
		b.s.onChange(b.target, tr.from, tr.to)
	}
}

// tripped reports whether the closed-state evidence at now calls for
// opening. b.mu is held.
func (b *Breaker) tripped(now time.Duration) bool {
	if b.s.consecutive > 0 && b.consec.Load() >= b.s.consecutive {
		return true
	}
	a, f := b.window().Counts(int64(now))
	return a >= b.s.minAttempts && float64(f)/float64(a) >= b.s.ratio
}

// advance applies the transitions that are due by time alone.
func (b *Breaker) advance(now time.Duration) {
	switch State(b.word.Load() & stateMask) {
	case StateOpen:
		if now >= b.openUntilD() {
			b.setState(StateHalfOpen)
			b.inflight, b.probeOK = 0, 0
		}
	case StateHalfOpen:
		// A probe that has not reported for a whole window is presumed
		// failed, so a lost Ticket cannot wedge the breaker half-open.
		if b.inflight > 0 && now-b.lastProbe >= b.s.window {
			b.toOpen(now, true)
		}
	}
}

func (b *Breaker) openUntilD() time.Duration { return time.Duration(b.openUntil.Load()) }

// toOpen opens the breaker. probeFailed says it was a failed half-open
// probe round, which lengthens the next open period.
func (b *Breaker) toOpen(now time.Duration, probeFailed bool) {
	if probeFailed {
		if b.rounds < 62 {
			b.rounds++
		}
	} else {
		b.rounds = 0
	}
	b.openUntil.Store(int64(satmath.Add(now, b.s.jittered(b.s.openPeriod(b.rounds)))))
	b.opened++
	b.setState(StateOpen)
}

// toClosed closes the breaker with fresh counts.
func (b *Breaker) toClosed() {
	if win := b.win.Load(); win != nil {
		win.Reset()
	}
	b.lastOK.Store(0)
	b.consec.Store(0)
	b.rounds = 0
	b.setState(StateClosed)
}

// setState moves to state to in a new generation and queues the callback.
func (b *Breaker) setState(to State) {
	w := b.word.Load()
	from := State(w & stateMask)
	b.word.Store((w>>2+1)<<2 | uint64(to))
	if b.s.onChange != nil {
		b.pending = append(b.pending, transition{from, to})
	}
}

// State returns the current state, after applying any transition that is
// due by the clock (which may run OnStateChange).
func (b *Breaker) State() State {
	if w := b.word.Load(); w&stateMask == uint64(StateClosed) {
		return StateClosed
	}
	return b.state(b.clock())
}

// StateAt is State at time now.
func (b *Breaker) StateAt(now time.Time) State {
	if w := b.word.Load(); w&stateMask == uint64(StateClosed) {
		return StateClosed
	}
	return b.state(b.at(now))
}

func (b *Breaker) state(now time.Duration) State {
	b.lock()
	b.advance(now)
	s := State(b.word.Load() & stateMask)
	b.unlock()
	return s
}

// RetryAfter returns how long the breaker will stay open: the time until
// it lets probes through. It is 0 when the breaker is not open (closed, or
// half-open, where a refused attempt may find a free probe slot at any
// time).
func (b *Breaker) RetryAfter() time.Duration {
	if b.word.Load()&stateMask == uint64(StateClosed) {
		return 0 // a closed breaker opens only on a report, never with time
	}
	return b.retryAfter(b.clock())
}

// RetryAfterAt is RetryAfter at time now.
func (b *Breaker) RetryAfterAt(now time.Time) time.Duration {
	if b.word.Load()&stateMask == uint64(StateClosed) {
		return 0
	}
	return b.retryAfter(b.at(now))
}

func (b *Breaker) retryAfter(now time.Duration) time.Duration {
	b.lock()
	b.advance(now)
	var d time.Duration
	if State(b.word.Load()&stateMask) == StateOpen {
		d = b.openUntilD() - now
	}
	b.unlock()
	return d
}

// OpenUntil returns when the open period ends (the breaker becomes
// half-open at that instant), or the zero Time if it is not open.
func (b *Breaker) OpenUntil() time.Time { return b.openUntilAt(b.clock()) }

// OpenUntilAt is OpenUntil at time now.
func (b *Breaker) OpenUntilAt(now time.Time) time.Time { return b.openUntilAt(b.at(now)) }

func (b *Breaker) openUntilAt(now time.Duration) time.Time {
	b.lock()
	b.advance(now)
	var t time.Time
	if State(b.word.Load()&stateMask) == StateOpen {
		t = b.toTime(b.openUntilD())
	}
	b.unlock()
	return t
}

// Stats is a snapshot of a Breaker for telemetry.
type Stats struct {
	State State
	// Attempts and Failures are the outcomes counted in the current Window
	// (only while closed: every state change clears them). A Breaker whose
	// FailureRatio is 1 (the default) counts, until its first failure, only
	// its latest success (Attempts 1 while it is in the Window): it opens
	// only when every attempt of its Window failed, for which the latest
	// success says all there is to know, and it keeps no Window until then.
	Attempts, Failures int64
	// ConsecutiveFailures is the current run of failures while closed.
	ConsecutiveFailures int64
	// ProbesInFlight and ProbeSuccesses describe the current half-open round.
	ProbesInFlight, ProbeSuccesses int
	// OpenUntil is when the open period ends; zero unless open.
	OpenUntil time.Time
	// FailedProbeRounds is the number of consecutive failed half-open rounds
	// that lengthen the open period; 0 after the breaker closes.
	FailedProbeRounds int
	// Opened counts transitions to open, Rejected the attempts refused with
	// ErrOpen, over the Breaker's life.
	Opened, Rejected uint64
}

// Stats returns a snapshot of b, after applying any transition that is due
// by the clock. Successes being reported at the same moment may or may not
// be included.
func (b *Breaker) Stats() Stats { return b.stats(b.clock()) }

// StatsAt is Stats at time now.
func (b *Breaker) StatsAt(now time.Time) Stats { return b.stats(b.at(now)) }

func (b *Breaker) stats(now time.Duration) Stats {
	b.lock()
	b.advance(now)
	st := State(b.word.Load() & stateMask)
	s := Stats{
		State:             st,
		FailedProbeRounds: b.rounds,
		Opened:            b.opened,
		Rejected:          b.rejected.Load(),
	}
	switch st {
	case StateClosed:
		if win := b.win.Load(); win != nil {
			s.Attempts, s.Failures = win.Counts(int64(now))
		} else if ok := b.lastOK.Load(); ok != 0 && now-time.Duration(ok-1) < b.s.window {
			s.Attempts = 1 // the latest success: all a breaker without failures keeps
		}
		s.ConsecutiveFailures = b.consec.Load()
	case StateOpen:
		s.OpenUntil = b.toTime(b.openUntilD())
	case StateHalfOpen:
		s.ProbesInFlight, s.ProbeSuccesses = b.inflight, b.probeOK
	}
	b.unlock()
	return s
}
