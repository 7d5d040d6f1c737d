// Package clock is the suite's one time seam, for the code that waits on
// its own: a reading of the current time, stoppable timers and functions
// run after a delay, real or fake. The fake moves only when a test
// advances it, so that the interceptor's backoff and hedging, and the
// outlier policy's ejection timers, are tested without asserting on the
// wall clock. (The packages that only count over time take the time from
// their callers instead: see internal/window.)
package clock

import (
	"slices"
	"sync"
	"time"
)

// Clock reads the time and runs functions after a delay. Real is the real
// one; *Fake is one a test advances.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f after d (in its own goroutine on the real clock;
	// in Advance's on a Fake); stop cancels it and reports whether it
	// did.
	AfterFunc(d time.Duration, f func()) (stop func() bool)
}

// Real is the real clock: time.Now and time.AfterFunc.
type Real struct{}

// Now returns time.Now().
func (Real) Now() time.Time { return time.Now() }

// AfterFunc calls f in its own goroutine after d, as time.AfterFunc.
func (Real) AfterFunc(d time.Duration, f func()) func() bool { return time.AfterFunc(d, f).Stop }

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
// deadlines; its functions (AfterFunc) run in Advance's goroutine, in
// deadline order, the clock standing at each one's deadline while it runs.
// The zero Fake is not usable; create one with NewFake. A Fake is safe for
// concurrent use.
type Fake struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
	funcs  []*fakeFunc
	seq    int        // functions made, for their order among equal deadlines
	added  *sync.Cond // signalled when a timer or function is made
}

// fakeFunc is a function AfterFunc scheduled.
type fakeFunc struct {
	at  time.Time
	seq int
	f   func()
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

// AfterFunc schedules fn to run when the clock reaches Now()+d (at the
// next Advance for d ≤ 0), in the goroutine that advances it; stop
// cancels it and reports whether it did.
func (f *Fake) AfterFunc(d time.Duration, fn func()) (stop func() bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seq++
	ff := &fakeFunc{at: f.now.Add(d), seq: f.seq, f: fn}
	f.funcs = append(f.funcs, ff)
	f.added.Broadcast()
	return func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		if i := slices.Index(f.funcs, ff); i >= 0 {
			f.funcs = slices.Delete(f.funcs, i, i+1)
			return true
		}
		return false
	}
}

// Advance moves the clock forward by d: it runs the functions that fall
// due on the way, each at its own deadline (a function may schedule more,
// which run too if they fall due by the end), and fires the timers that
// are due.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	end := f.now.Add(d)
	for {
		i := f.nextFunc(end)
		if i < 0 {
			break
		}
		ff := f.funcs[i]
		f.funcs = slices.Delete(f.funcs, i, i+1)
		if ff.at.After(f.now) {
			f.now = ff.at
			f.fire()
		}
		f.mu.Unlock()
		ff.f()
		f.mu.Lock()
	}
	defer f.mu.Unlock()
	f.now = end
	f.fire()
}

// nextFunc returns the index of the function due first by end (the first
// made among equal deadlines), or -1; f.mu is held.
func (f *Fake) nextFunc(end time.Time) int {
	next := -1
	for i, ff := range f.funcs {
		if ff.at.After(end) {
			continue
		}
		if next < 0 || ff.at.Before(f.funcs[next].at) || (ff.at.Equal(f.funcs[next].at) && ff.seq < f.funcs[next].seq) {
			next = i
		}
	}
	return next
}

// fire fires the timers due by now; f.mu is held.
func (f *Fake) fire() {
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

// Pending returns the number of timers and functions that have neither
// fired (run) nor been stopped.
func (f *Fake) Pending() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.timers) + len(f.funcs)
}

// Next returns how far the clock must advance to fire the earliest pending
// timer or function, and false when none is pending.
func (f *Fake) Next() (time.Duration, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var next time.Time
	found := false
	for _, t := range f.timers {
		if !found || t.at.Before(next) {
			next, found = t.at, true
		}
	}
	for _, ff := range f.funcs {
		if !found || ff.at.Before(next) {
			next, found = ff.at, true
		}
	}
	if !found {
		return 0, false
	}
	return next.Sub(f.now), true
}

// WaitPending blocks until at least n timers and functions are pending,
// or until timeout of real time has passed (it then reports false): a test
// calls it to know that the code under test has armed its timers before it
// advances the clock.
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
	for len(f.timers)+len(f.funcs) < n {
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
