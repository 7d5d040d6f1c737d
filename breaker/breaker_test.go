package breaker

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeClock is the time a test drives a Breaker at, through its At forms:
// it moves only when told to.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// harness drives one Breaker through a script of steps.
type harness struct {
	t       *testing.T
	step    int
	clk     *fakeClock
	b       *Breaker
	held    []*Ticket
	mu      sync.Mutex
	changes []string
}

func newHarness(t *testing.T, c Config) *harness {
	h := &harness{t: t, clk: newClock()}
	c.OnStateChange = func(target string, from, to State) {
		if target != "t" {
			t.Errorf("OnStateChange target = %q", target)
		}
		h.mu.Lock()
		h.changes = append(h.changes, from.String()+">"+to.String())
		h.mu.Unlock()
	}
	h.b = newNamed("t", c)
	return h
}

func (h *harness) fatalf(format string, args ...any) {
	h.t.Helper()
	h.t.Fatalf("step %d: %s", h.step, fmt.Sprintf(format, args...))
}

type step func(h *harness)

// ok and fail make n attempts through AdmitAt and report them.
func ok(n int) step   { return outcomes(n, false) }
func fail(n int) step { return outcomes(n, true) }

func outcomes(n int, failed bool) step {
	return func(h *harness) {
		h.t.Helper()
		for i := range n {
			tk, err := h.b.AdmitAt(h.clk.Now())
			if err != nil {
				h.fatalf("attempt %d of %d refused: %v (state %v)", i+1, n, err, h.b.StateAt(h.clk.Now()))
			}
			tk.DoneAt(failed, h.clk.Now())
		}
	}
}

func tick(d time.Duration) step { return func(h *harness) { h.clk.Advance(d) } }

func want(s State) step {
	return func(h *harness) {
		h.t.Helper()
		if got := h.b.StateAt(h.clk.Now()); got != s {
			h.fatalf("State() = %v, want %v (stats %+v)", got, s, h.b.StatsAt(h.clk.Now()))
		}
	}
}

// refused checks that an attempt is refused with ErrOpen.
func refused() step {
	return func(h *harness) {
		h.t.Helper()
		tk, err := h.b.AdmitAt(h.clk.Now())
		if !errors.Is(err, ErrOpen) {
			h.fatalf("Admit() err = %v, want ErrOpen (state %v)", err, h.b.StateAt(h.clk.Now()))
		}
		tk.DoneAt(true, h.clk.Now()) // a no-op
	}
}

// hold admits n attempts through AdmitAt and keeps their tickets.
func hold(n int) step {
	return func(h *harness) {
		h.t.Helper()
		for i := range n {
			t := new(Ticket)
			var err error
			if *t, err = h.b.AdmitAt(h.clk.Now()); err != nil {
				h.fatalf("hold %d of %d refused: %v", i+1, n, err)
			}
			h.held = append(h.held, t)
		}
	}
}

type outcome int

const (
	success outcome = iota
	failure
	ignore
)

// release reports the outcome of held ticket i.
func release(i int, o outcome) step {
	return func(h *harness) {
		switch o {
		case success:
			h.held[i].DoneAt(false, h.clk.Now())
		case failure:
			h.held[i].DoneAt(true, h.clk.Now())
		case ignore:
			h.held[i].Ignore()
		}
	}
}

func retryAfter(d time.Duration) step {
	return func(h *harness) {
		h.t.Helper()
		if got := h.b.RetryAfterAt(h.clk.Now()); got != d {
			h.fatalf("RetryAfter() = %v, want %v", got, d)
		}
	}
}

// stats checks the fields of Stats that check sets.
func stats(check func(Stats) bool, what string) step {
	return func(h *harness) {
		h.t.Helper()
		if s := h.b.StatsAt(h.clk.Now()); !check(s) {
			h.fatalf("Stats() = %+v, want %s", s, what)
		}
	}
}

func counted(attempts, failures int64) step {
	return stats(func(s Stats) bool { return s.Attempts == attempts && s.Failures == failures },
		fmt.Sprintf("Attempts=%d Failures=%d", attempts, failures))
}

func inflight(n int) step {
	return stats(func(s Stats) bool { return s.ProbesInFlight == n }, fmt.Sprintf("ProbesInFlight=%d", n))
}

func seq(steps ...[]step) []step {
	var all []step
	for _, s := range steps {
		all = append(all, s...)
	}
	return all
}

func TestTransitions(t *testing.T) {
	// The mechanisms, with explicit values pinned (half the attempts
	// failed, a 5 s open period up to 40 s, no jitter) rather than the
	// defaults: the TestDefaultBreaker tests in config_test.go cover those.
	base := Config{
		FailureRatio: 0.5, MinAttempts: 20, Window: 10 * time.Second,
		OpenTimeout: 5 * time.Second, MaxOpenTimeout: 40 * time.Second, Jitter: -1,
	}
	with := func(f func(*Config)) Config { c := base; f(&c); return c }
	s := time.Second
	open20 := []step{fail(20), want(StateOpen)}                       // opens a base breaker
	halfOpen := seq(open20, []step{tick(5 * s), want(StateHalfOpen)}) // ... and lets probes in

	cases := []struct {
		name    string
		cfg     Config
		steps   []step
		changes string
	}{
		{"5 failures in 50 stays closed, interleaved", base, []step{
			ok(9), fail(1), ok(9), fail(1), ok(9), fail(1), ok(9), fail(1), ok(9), fail(1),
			want(StateClosed), counted(50, 5),
		}, ""},
		{"5 failures in 50 stays closed, failures last", base, []step{
			ok(45), fail(5), want(StateClosed), counted(50, 5),
		}, ""},
		{"ratio reached opens", base, []step{
			ok(10), fail(9), want(StateClosed), fail(1), want(StateOpen), refused(),
		}, "closed>open"},
		{"MinAttempts respected", base, []step{
			fail(19), want(StateClosed), counted(19, 19), fail(1), want(StateOpen),
		}, "closed>open"},
		{"MinAttempts 5", with(func(c *Config) { c.MinAttempts = 5 }), []step{
			fail(4), want(StateClosed), fail(1), want(StateOpen),
		}, "closed>open"},
		{"FailureRatio 0.9 is exact", with(func(c *Config) { c.FailureRatio = 0.9; c.MinAttempts = 10 }), []step{
			ok(1), fail(8), want(StateClosed), fail(1), want(StateOpen),
		}, "closed>open"},
		{"FailureRatio 0.3 is exact", with(func(c *Config) { c.FailureRatio = 0.3; c.MinAttempts = 10 }), []step{
			ok(7), fail(2), want(StateClosed), fail(1), want(StateOpen),
		}, "closed>open"},
		{"successes do not open", base, []step{ok(1000), want(StateClosed), counted(1000, 0)}, ""},
		{"outcomes older than Window slide out", base, []step{
			fail(19), tick(10 * s), counted(0, 0), fail(1), want(StateClosed), counted(1, 1),
		}, ""},
		{"window slides in tenths: 9.99s later still counts", base, []step{
			fail(10), tick(9990 * time.Millisecond), fail(10), want(StateOpen),
		}, "closed>open"},
		{"window slides in tenths: a tenth drops out at once", base, []step{
			fail(10), tick(1 * s), fail(5), tick(9 * s), counted(5, 5), fail(14), want(StateClosed), fail(1), want(StateOpen),
		}, "closed>open"},
		{"ConsecutiveFailures opens before MinAttempts", with(func(c *Config) { c.ConsecutiveFailures = 3; c.MinAttempts = 100 }), []step{
			fail(2), ok(1), fail(2), want(StateClosed),
			stats(func(s Stats) bool { return s.ConsecutiveFailures == 2 }, "2 in a row"),
			fail(1), want(StateOpen),
		}, "closed>open"},
		{"ConsecutiveFailures is off by default", with(func(c *Config) { c.MinAttempts = 1000 }), []step{
			fail(999), want(StateClosed),
		}, ""},
		{"open refuses until OpenTimeout, then half-open", base, seq(open20, []step{
			refused(), retryAfter(5 * s), tick(5*s - 1), refused(), retryAfter(1), tick(1),
			retryAfter(0), want(StateHalfOpen),
			stats(func(s Stats) bool { return s.Rejected == 2 && s.Opened == 1 }, "Rejected=2 Opened=1"),
		}), "closed>open open>half-open"},
		{"successful probe closes with fresh counts", base, seq(halfOpen, []step{
			ok(1), want(StateClosed), counted(0, 0), fail(19), want(StateClosed), fail(1), want(StateOpen),
			retryAfter(5 * s),
		}), "closed>open open>half-open half-open>closed closed>open"},
		{"failed probe reopens; open period doubles up to MaxOpenTimeout (8x), resets on close", base, seq(halfOpen, []step{
			fail(1), want(StateOpen), retryAfter(10 * s), tick(10*s - 1), refused(), tick(1), want(StateHalfOpen),
			fail(1), retryAfter(20 * s), tick(20 * s),
			fail(1), retryAfter(40 * s), tick(40 * s),
			fail(1), retryAfter(40 * s), tick(40 * s),
			stats(func(s Stats) bool { return s.FailedProbeRounds == 4 }, "FailedProbeRounds=4"),
			ok(1), want(StateClosed),
			stats(func(s Stats) bool { return s.FailedProbeRounds == 0 }, "FailedProbeRounds=0"),
			fail(20), retryAfter(5 * s),
		}), "closed>open open>half-open" + strings.Repeat(" half-open>open open>half-open", 4) +
			" half-open>closed closed>open"},
		{"MaxOpenTimeout caps growth", with(func(c *Config) { c.MaxOpenTimeout = 12 * s }), seq(halfOpen, []step{
			fail(1), retryAfter(10 * s), tick(10 * s), fail(1), retryAfter(12 * s),
		}), "closed>open open>half-open half-open>open open>half-open half-open>open"},
		{"MaxOpenTimeout below OpenTimeout disables growth", with(func(c *Config) { c.MaxOpenTimeout = 1 }), seq(halfOpen, []step{
			fail(1), retryAfter(5 * s), tick(5 * s), fail(1), retryAfter(5 * s),
		}), "closed>open open>half-open half-open>open open>half-open half-open>open"},
		{"half-open admits exactly HalfOpenProbes concurrent probes", with(func(c *Config) { c.HalfOpenProbes = 3 }), seq(halfOpen, []step{
			hold(3), inflight(3), refused(), refused(),
			release(0, success), want(StateHalfOpen), inflight(2),
			hold(1), refused(), // the freed slot, and no more
			release(1, success), want(StateHalfOpen), release(2, success), want(StateClosed),
			release(3, success), // stale now: admitted in the half-open generation
			want(StateClosed), counted(0, 0),
		}), "closed>open open>half-open half-open>closed"},
		{"one failed probe of several reopens", with(func(c *Config) { c.HalfOpenProbes = 3 }), seq(halfOpen, []step{
			hold(3), release(0, success), release(1, failure), want(StateOpen),
			release(2, success), want(StateOpen), // stale
		}), "closed>open open>half-open half-open>open"},
		{"an ignored probe frees its slot without counting", base, seq(halfOpen, []step{
			hold(1), refused(), release(0, ignore), want(StateHalfOpen), inflight(0),
			stats(func(s Stats) bool { return s.ProbeSuccesses == 0 }, "ProbeSuccesses=0"),
			hold(1), release(1, success), want(StateClosed),
		}), "closed>open open>half-open half-open>closed"},
		{"ignored outcomes are not counted while closed", base, []step{
			hold(20), func(h *harness) {
				for _, t := range h.held {
					t.Ignore()
				}
			}, want(StateClosed), counted(0, 0),
		}, ""},
		{"a probe silent for a whole Window is presumed failed", base, seq(halfOpen, []step{
			hold(1), tick(10*s - 1), want(StateHalfOpen), refused(), tick(1), want(StateOpen), retryAfter(10 * s),
			release(0, success), want(StateOpen), // stale
		}), "closed>open open>half-open half-open>open"},
		{"stale closed-generation outcomes are ignored while open and half-open", base, seq([]step{hold(3)}, halfOpen, []step{
			release(0, failure), want(StateHalfOpen), inflight(0),
			hold(1), inflight(1),
			release(1, failure), want(StateHalfOpen), inflight(1),
			release(2, success), want(StateHalfOpen), inflight(1),
			stats(func(s Stats) bool { return s.ProbeSuccesses == 0 }, "ProbeSuccesses=0"),
			release(3, success), want(StateClosed),
		}), "closed>open open>half-open half-open>closed"},
		{"stale probe outcomes are ignored in the next half-open round", with(func(c *Config) { c.HalfOpenProbes = 2 }), seq(halfOpen, []step{
			hold(2), release(0, failure), want(StateOpen), tick(10 * s), want(StateHalfOpen),
			release(1, success), want(StateHalfOpen), inflight(0),
			release(1, failure), want(StateHalfOpen), // reported twice: still nothing
		}), "closed>open open>half-open half-open>open open>half-open"},
		{"stale outcomes from before a close are ignored", base, seq([]step{hold(20)}, halfOpen, []step{
			ok(1), want(StateClosed),
			func(h *harness) {
				for _, t := range h.held[:20] {
					t.DoneAt(true, h.clk.Now())
				}
			},
			want(StateClosed), counted(0, 0),
		}), "closed>open open>half-open half-open>closed"},
		{"done called twice counts once", base, []step{
			func(h *harness) {
				tk, err := h.b.AdmitAt(h.clk.Now())
				if err != nil {
					h.fatalf("Admit: %v", err)
				}
				tk.DoneAt(true, h.clk.Now())
				tk.DoneAt(true, h.clk.Now())
				tk.DoneAt(false, h.clk.Now())
			},
			counted(1, 1),
			hold(1), release(0, failure), release(0, failure), release(0, ignore), counted(2, 2),
		}, ""},
		{"jitter lengthens the open period by Jitter*Rand", with(func(c *Config) {
			c.Jitter = 0.2
			c.rand = func() float64 { return 0.5 }
		}), seq(open20, []step{
			retryAfter(5500 * time.Millisecond), tick(5500*time.Millisecond - 1), refused(), tick(1), want(StateHalfOpen),
			fail(1), retryAfter(11 * s),
		}), "closed>open open>half-open half-open>open"},
		{"Rand out of range is clamped", with(func(c *Config) {
			c.Jitter = 0.5
			c.rand = func() float64 { return 7 }
		}), seq(open20, []step{retryAfter(7500 * time.Millisecond)}), "closed>open"},
		{"NaN Rand means no jitter", with(func(c *Config) {
			c.rand = func() float64 { return math.NaN() }
		}), seq(open20, []step{retryAfter(5 * s)}), "closed>open"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, tc.cfg)
			for i, s := range tc.steps {
				h.step = i
				s(h)
			}
			if got := strings.Join(h.changes, " "); got != tc.changes {
				t.Errorf("transitions:\n got %q\nwant %q", got, tc.changes)
			}
		})
	}
}

// TestAllowRefusedReturnsNoopDone, on the monotonic clock (the open period
// is an hour: the test does not race it).
func TestAllowRefusedReturnsNoopDone(t *testing.T) {
	b := New(Config{MinAttempts: 1, OpenTimeout: time.Hour, Jitter: -1})
	done, err := b.Allow()
	if err != nil {
		t.Fatal(err)
	}
	done(true)
	done, err = b.Allow()
	if err != ErrOpen || done == nil {
		t.Fatalf("Allow() = %v, %v; want a non-nil done and ErrOpen", done != nil, err)
	}
	done(false)
	tk, err := b.Admit()
	if !errors.Is(err, ErrOpen) || tk.b != nil {
		t.Fatalf("Admit() = %+v, %v; want a zero Ticket and ErrOpen", tk, err)
	}
	tk.Done(false)
	tk.Ignore()
	var zero Ticket
	zero.Done(true)
	zero.DoneAt(true, time.Now())
	if s := b.Stats(); s.State != StateOpen || s.Rejected != 2 {
		t.Fatalf("Stats = %+v", s)
	}
}

// TestAllowDoneTwiceCountsOnce: the done func Allow returns counts one
// outcome however often it is called (on the monotonic clock; the window
// is 10 s, which the test does not race).
func TestAllowDoneTwiceCountsOnce(t *testing.T) {
	b := New(Config{})
	done, err := b.Allow()
	if err != nil {
		t.Fatal(err)
	}
	done(true)
	done(true)
	done(false)
	if s := b.Stats(); s.Attempts != 1 || s.Failures != 1 {
		t.Fatalf("Stats = %+v, want 1 attempt, 1 failure", s)
	}
}

// TestTheMonotonicFormsAgreeWithTheAtForms: the methods without a time
// read the monotonic clock, on the same time line as the At forms given
// time.Now: a breaker opened by one is seen open, for the same period, by
// the other.
func TestTheMonotonicFormsAgreeWithTheAtForms(t *testing.T) {
	b := New(Config{MinAttempts: 1, OpenTimeout: time.Hour, Jitter: -1})
	tk, err := b.AdmitAt(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	tk.DoneAt(true, before)
	if s := b.State(); s != StateOpen {
		t.Fatalf("State = %v", s)
	}
	if d := b.RetryAfter(); d > time.Hour || d < time.Hour-time.Since(before) {
		t.Fatalf("RetryAfter = %v, want just under an hour", d)
	}
	if u := b.OpenUntil(); !u.Equal(before.Add(time.Hour)) {
		t.Fatalf("OpenUntil = %v, want %v", u, before.Add(time.Hour))
	}
	if _, err := b.Admit(); err != ErrOpen {
		t.Fatalf("Admit = %v", err)
	}
	// And the other way: opened on the monotonic clock, seen by the At
	// forms at time.Now.
	b = New(Config{MinAttempts: 1, OpenTimeout: time.Hour, Jitter: -1})
	done, _ := b.Allow()
	before = time.Now()
	done(true)
	after := time.Now()
	if u := b.OpenUntilAt(time.Now()); u.Before(before.Add(time.Hour)) || u.After(after.Add(time.Hour)) {
		t.Fatalf("OpenUntilAt = %v, want within [%v, %v]", u, before.Add(time.Hour), after.Add(time.Hour))
	}
	if s := b.StateAt(after.Add(time.Hour)); s != StateHalfOpen {
		t.Fatalf("StateAt an hour on = %v, want half-open", s)
	}
}

func TestZeroValueBreaker(t *testing.T) {
	var b Breaker
	var before, after time.Time // around the failure that opens it
	for i := range 20 {
		done, err := b.Allow()
		if err != nil {
			t.Fatal(err)
		}
		if i == 19 {
			before = time.Now()
		}
		done(true)
	}
	after = time.Now()
	if s := b.Stats(); s.State != StateOpen || s.Opened != 1 {
		t.Fatalf("zero Breaker after 20 failures: %+v", s)
	}
	// The default open period: 1s plus up to 20% jitter, from the moment
	// it opened (bounds from the real clock read around that moment, not
	// from a sleep).
	until := b.OpenUntil()
	if lo, hi := before.Add(time.Second), after.Add(1200*time.Millisecond); until.Before(lo) || until.After(hi) {
		t.Fatalf("OpenUntil = %v, want within [%v, %v]: 1s plus up to 20%% jitter", until, lo, hi)
	}
	d := b.RetryAfter()
	if now := time.Now(); d < until.Sub(now) || d > until.Sub(after) {
		t.Fatalf("RetryAfter = %v, want the time left until OpenUntil", d)
	}
	if b.Target() != "" {
		t.Fatalf("Target = %q", b.Target())
	}
}

func TestOpenUntilAndTarget(t *testing.T) {
	clk := newClock()
	start := clk.Now()
	b := NewRegistry(Config{MinAttempts: 1, OpenTimeout: 5 * time.Second, Jitter: -1}).For("db:5432")
	if !b.OpenUntilAt(clk.Now()).IsZero() || b.RetryAfterAt(clk.Now()) != 0 {
		t.Fatal("closed breaker reports an open period")
	}
	clk.Advance(3 * time.Second)
	tk, _ := b.AdmitAt(clk.Now())
	tk.DoneAt(true, clk.Now())
	want := start.Add(8 * time.Second)
	if got := b.OpenUntilAt(clk.Now()); !got.Equal(want) {
		t.Fatalf("OpenUntil = %v, want %v", got, want)
	}
	if got := b.StatsAt(clk.Now()).OpenUntil; !got.Equal(want) {
		t.Fatalf("Stats().OpenUntil = %v, want %v", got, want)
	}
	clk.Advance(5 * time.Second)
	if !b.OpenUntilAt(clk.Now()).IsZero() {
		t.Fatal("half-open breaker reports an open period")
	}
	if b.Target() != "db:5432" {
		t.Fatalf("Target = %q", b.Target())
	}
}

// TestCallbackReentrancy: a callback that calls back into its breaker,
// including calls that cause further transitions, neither deadlocks nor
// reorders the notifications.
func TestCallbackReentrancy(t *testing.T) {
	clk := newClock()
	var b *Breaker
	var got []string
	b = New(Config{
		MinAttempts: 1, OpenTimeout: 5 * time.Second, Jitter: -1,
		OnStateChange: func(_ string, from, to State) {
			tr := from.String() + ">" + to.String()
			got = append(got, "enter "+tr)
			defer func() { got = append(got, "exit "+tr) }()
			// Every method, from inside the callback.
			_ = b.StateAt(clk.Now())
			_ = b.StatsAt(clk.Now())
			_ = b.RetryAfterAt(clk.Now())
			_ = b.OpenUntilAt(clk.Now())
			if to == StateOpen && len(got) == 1 { // the first callback
				// Cause open → half-open → closed from inside the
				// callback for closed → open.
				clk.Advance(5 * time.Second)
				tk, err := b.AdmitAt(clk.Now())
				if err != nil {
					t.Errorf("probe refused inside callback: %v", err)
					return
				}
				tk.DoneAt(false, clk.Now())
				if s := b.StateAt(clk.Now()); s != StateClosed {
					t.Errorf("State inside callback = %v, want closed", s)
				}
			}
		},
	})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		tk, _ := b.AdmitAt(clk.Now())
		tk.DoneAt(true, clk.Now())
	}()
	select {
	case <-finished:
	case <-time.After(10 * time.Second):
		t.Fatal("deadlock: callback calling into the breaker never returned")
	}
	// Nested transitions are delivered after the callback that caused
	// them returns: callbacks never overlap, and keep transition order.
	want := "enter closed>open, exit closed>open, enter open>half-open, exit open>half-open, " +
		"enter half-open>closed, exit half-open>closed"
	if s := strings.Join(got, ", "); s != want {
		t.Fatalf("transitions %q, want %q", s, want)
	}
}

// TestCallbackPanicDoesNotWedgeDelivery: a panicking callback propagates to
// the caller whose call delivered it, and later transitions are still
// delivered.
func TestCallbackPanicDoesNotWedgeDelivery(t *testing.T) {
	clk := newClock()
	var calls []string
	b := New(Config{
		MinAttempts: 1, OpenTimeout: 5 * time.Second, Jitter: -1,
		OnStateChange: func(_ string, from, to State) {
			calls = append(calls, from.String()+">"+to.String())
			if len(calls) == 1 {
				panic("boom")
			}
		},
	})
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Fatalf("recovered %v, want boom", r)
			}
		}()
		tk, _ := b.AdmitAt(clk.Now())
		tk.DoneAt(true, clk.Now())
	}()
	clk.Advance(5 * time.Second)
	if s := b.StateAt(clk.Now()); s != StateHalfOpen {
		t.Fatalf("State = %v", s)
	}
	if got := strings.Join(calls, " "); got != "closed>open open>half-open" {
		t.Fatalf("calls %q", got)
	}
}

// TestCallbackPanicKeepsTheProbe: a callback that panics as the breaker
// goes half-open, in the Admit that let the probe through, does not lose
// the probe: the panic reaches that Admit's caller, which gets no Ticket,
// and the probe's slot is free for the next caller at once (it used to stay
// taken until the probe was presumed failed, a whole Window later, and the
// breaker then opened again).
func TestCallbackPanicKeepsTheProbe(t *testing.T) {
	clk := newClock()
	b := New(Config{
		MinAttempts: 1, OpenTimeout: time.Second, Jitter: -1,
		OnStateChange: func(_ string, _, to State) {
			if to == StateHalfOpen {
				panic("boom")
			}
		},
	})
	tk, err := b.AdmitAt(clk.Now())
	if err != nil {
		t.Fatal(err)
	}
	tk.DoneAt(true, clk.Now())
	clk.Advance(time.Second)
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Fatalf("recovered %v, want boom", r)
			}
		}()
		_, _ = b.AdmitAt(clk.Now())
	}()
	probe, err := b.AdmitAt(clk.Now())
	if err != nil {
		t.Fatalf("after the panic the probe's slot is lost: Admit = %v (%+v)", err, b.StatsAt(clk.Now()))
	}
	probe.DoneAt(false, clk.Now())
	if s := b.StateAt(clk.Now()); s != StateClosed {
		t.Fatalf("State after a good probe = %v", s)
	}
}

// TestConcurrentUse hammers one breaker from many goroutines through every
// state, and checks that callbacks never overlap, form one chain of
// transitions, and that the half-open probe limit holds throughout.
func TestConcurrentUse(t *testing.T) {
	const probes = 2
	clk := newClock()
	var active, overlaps atomic.Int32
	var mu sync.Mutex
	var chain []transition
	b := New(Config{
		FailureRatio: 0.5, MinAttempts: 10, Window: time.Second,
		OpenTimeout: 10 * time.Millisecond, MaxOpenTimeout: 80 * time.Millisecond,
		HalfOpenProbes: probes, ConsecutiveFailures: 5,
		OnStateChange: func(_ string, from, to State) {
			if active.Add(1) != 1 {
				overlaps.Add(1)
			}
			mu.Lock()
			chain = append(chain, transition{from, to})
			mu.Unlock()
			active.Add(-1)
		},
	})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 2000 {
				if i%50 == 0 {
					clk.Advance(time.Millisecond)
				}
				tk, err := b.AdmitAt(clk.Now())
				if err != nil {
					continue
				}
				b.mu.Lock()
				if State(b.word.Load()&stateMask) == StateHalfOpen && (b.inflight > probes || b.inflight < 0) {
					t.Errorf("inflight = %d", b.inflight)
				}
				b.mu.Unlock()
				switch (i + g) % 7 {
				case 0, 1, 2:
					tk.DoneAt(true, clk.Now())
				case 3:
					tk.Ignore()
				default:
					tk.DoneAt(false, clk.Now())
				}
				tk.DoneAt(true, clk.Now()) // no effect
			}
		})
	}
	wg.Wait()
	_ = b.StateAt(clk.Now()) // flush any queued notifications
	if overlaps.Load() != 0 {
		t.Fatalf("%d callbacks overlapped", overlaps.Load())
	}
	mu.Lock()
	defer mu.Unlock()
	if len(chain) < 3 {
		t.Fatalf("only %d transitions: the test did not exercise the states", len(chain))
	}
	prev := StateClosed
	for i, tr := range chain {
		if tr.from != prev || tr.from == tr.to {
			t.Fatalf("transition %d %v>%v does not follow %v", i, tr.from, tr.to, prev)
		}
		prev = tr.to
	}
	if s := b.StateAt(clk.Now()); s != prev {
		t.Fatalf("last notified state %v, State() = %v", prev, s)
	}
}

// TestHalfOpenConcurrentAdmissions: of many goroutines asking at once, a
// half-open breaker admits exactly HalfOpenProbes.
func TestHalfOpenConcurrentAdmissions(t *testing.T) {
	const probes = 3
	for round := range 20 {
		clk := newClock()
		b := New(Config{MinAttempts: 1, OpenTimeout: 5 * time.Second, HalfOpenProbes: probes, Jitter: -1})
		tk, _ := b.AdmitAt(clk.Now())
		tk.DoneAt(true, clk.Now())
		clk.Advance(5 * time.Second)
		var admitted, refused atomic.Int32
		start := make(chan struct{})
		var wg sync.WaitGroup
		for range 50 {
			wg.Go(func() {
				<-start
				if _, err := b.AdmitAt(clk.Now()); err == nil {
					admitted.Add(1)
				} else if errors.Is(err, ErrOpen) {
					refused.Add(1)
				}
			})
		}
		close(start)
		wg.Wait()
		if admitted.Load() != probes || refused.Load() != 50-probes {
			t.Fatalf("round %d: admitted %d, refused %d; want %d and %d",
				round, admitted.Load(), refused.Load(), probes, 50-probes)
		}
	}
}

// DoneAt counts an outcome at the time it is given, like Done at that
// time, and only once.
func TestDoneAt(t *testing.T) {
	clk := newClock()
	b := New(Config{FailureRatio: 0.5, MinAttempts: 4, Window: 10 * time.Second, Jitter: -1})
	report := func(failed bool, at time.Time) {
		tk, err := b.AdmitAt(at)
		if err != nil {
			t.Fatal(err)
		}
		tk.DoneAt(failed, at)
		tk.DoneAt(failed, at) // counts once
	}
	start := clk.Now()
	// Two old failures fall out of the window by the time of the next two.
	report(true, start)
	report(true, start)
	clk.Advance(20 * time.Second)
	report(true, clk.Now())
	report(false, clk.Now())
	report(false, clk.Now())
	if s := b.StatsAt(clk.Now()); s.Attempts != 3 || s.Failures != 1 || b.StateAt(clk.Now()) != StateClosed {
		t.Fatalf("after old failures expired: %+v", s)
	}
	report(true, clk.Now())
	if s := b.StatsAt(clk.Now()); s.State != StateOpen || s.Opened != 1 {
		t.Fatalf("2 of 4 failed within the window, want open: %+v", s)
	}
}
