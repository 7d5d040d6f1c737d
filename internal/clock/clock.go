// Package clock is the time seam of the interceptors: a reading of the
// current time and stoppable timers, real or fake. The fake moves only when
// a test advances it, so that backoff and hedging are tested without
// asserting on the wall clock.
package clock

import (
	"sync"
	"time"
)

// Timer is a stoppable one-shot timer, like *time.Timer.
type Timer interface {
	// C returns the channel the timer sends its time on when it fires.
	C() <-chan time.Time
	// Stop prevents the timer from firing; it reports whether it stopped
	// it (false: it had fired or was stopped).
	Stop() bool
}

// NewTimer returns a real Timer that fires after d.
func NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

type realTimer struct{ t *time.Timer }

func (r realTimer) C() <-chan time.Time { return r.t.C }
func (r realTimer) Stop() bool          { return r.t.Stop() }

// Fake is a clock that moves only when Advance is called. Its timers fire,
// in deadline order, when Advance moves the clock to or past their
// deadlines. The zero Fake is not usable; create one with NewFake. A Fake is
// safe for concurrent use.
type Fake struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
	added  *sync.Cond // signalled when a timer is created
}

// NewFake returns a Fake standing at start.
func NewFake(start time.Time) *Fake {
	f := &Fake{now: start}
	f.added = sync.NewCond(&f.mu)
	return f
}

// Now returns the fake time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// NewTimer returns a Timer that fires when the clock reaches Now()+d. A
// timer of d ≤ 0 fires at once.
func (f *Fake) NewTimer(d time.Duration) Timer {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := &fakeTimer{f: f, at: f.now.Add(d), c: make(chan time.Time, 1)}
	if d <= 0 {
		t.c <- f.now
		t.fired = true
		return t
	}
	f.timers = append(f.timers, t)
	f.added.Broadcast()
	return t
}

// Advance moves the clock forward by d and fires the timers that are due.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = f.now.Add(d)
	kept := f.timers[:0]
	for _, t := range f.timers {
		if !t.at.After(f.now) {
			t.fired = true
			t.c <- f.now
			continue
		}
		kept = append(kept, t)
	}
	clear(f.timers[len(kept):])
	f.timers = kept
}

// Pending returns the number of timers that have neither fired nor been
// stopped.
func (f *Fake) Pending() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.timers)
}

// Next returns how far the clock must advance to fire the earliest pending
// timer, and false when none is pending.
func (f *Fake) Next() (time.Duration, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.timers) == 0 {
		return 0, false
	}
	next := f.timers[0].at
	for _, t := range f.timers[1:] {
		if t.at.Before(next) {
			next = t.at
		}
	}
	return next.Sub(f.now), true
}

// WaitPending blocks until at least n timers are pending, or until timeout
// of real time has passed (it then reports false): a test calls it to know
// that the code under test has armed its timers before it advances the
// clock.
func (f *Fake) WaitPending(n int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	stop := time.AfterFunc(timeout, func() {
		f.mu.Lock()
		f.added.Broadcast()
		f.mu.Unlock()
	})
	defer stop.Stop()
	f.mu.Lock()
	defer f.mu.Unlock()
	for len(f.timers) < n {
		if !time.Now().Before(deadline) {
			return false
		}
		f.added.Wait()
	}
	return true
}

type fakeTimer struct {
	f     *Fake
	at    time.Time
	c     chan time.Time
	fired bool
}

func (t *fakeTimer) C() <-chan time.Time { return t.c }

func (t *fakeTimer) Stop() bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	for i, x := range t.f.timers {
		if x == t {
			t.f.timers = append(t.f.timers[:i], t.f.timers[i+1:]...)
			return true
		}
	}
	return false
}

// ClientOption returns an interceptor.ClientOption (as an any) that runs a
// Client on now and newTimer instead of the monotonic clock and real
// timers. It is the seam through which this repository's simulators (the
// storm lab's virtual clock, the metrics example's simulated ticks) drive a
// Client's time; it is not part of the suite's API, and package
// interceptor sets it when it is initialised. Tests use testing/synctest
// instead.
var ClientOption func(now func() time.Time, newTimer func(time.Duration) Timer) any
