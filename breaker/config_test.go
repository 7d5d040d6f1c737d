package breaker

import (
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stormguard/stormguard/internal/satmath"
)

// The defaults: a default breaker opens only when every attempt in its
// window failed, and its open periods stay short, so that it never refuses
// a dependency that still serves some calls, nor one that has healed.

// TestDefaultBreakerStaysClosedAtPartialFailure: one success in a hundred
// keeps a default breaker closed, however many attempts there are, as long
// as its window holds a hundred or more.
func TestDefaultBreakerStaysClosedAtPartialFailure(t *testing.T) {
	for _, tc := range []struct {
		attempts int
		every    time.Duration // clock step between attempts
	}{
		{100, 0},
		{1000, 0},
		{20_000, 0},
		{10_000, time.Millisecond},       // 10 s: the window slides throughout
		{10_000, 50 * time.Millisecond},  // 100 attempts per 5 s: 200 in a window
		{20_000, 500 * time.Microsecond}, // 10 s at 2,000 per second
	} {
		t.Run(fmt.Sprintf("%d every %v", tc.attempts, tc.every), func(t *testing.T) {
			h := newHarness(t, Config{})
			failures := 0
			for i := range tc.attempts {
				h.clk.Advance(tc.every)
				failed := i%100 != 0 // 99% fail, the first attempt succeeds
				outcomes(1, failed)(h)
				if failed {
					failures++
				}
				if i%97 == 0 || i == tc.attempts-1 {
					h.step = i
					want(StateClosed)(h)
				}
			}
			if s := h.b.StatsAt(h.clk.Now()); s.Opened != 0 || s.Attempts < DefaultMinAttempts {
				t.Fatalf("after %d attempts, %d failed: %+v", tc.attempts, failures, s)
			}
			if len(h.changes) != 0 {
				t.Fatalf("transitions %v", h.changes)
			}
		})
	}
}

// TestDefaultBreakerOpensWhenEveryAttemptFailed: a default breaker opens
// once MinAttempts attempts in its window all failed, and not before; a
// single success in the window holds it closed until the success slides
// out.
func TestDefaultBreakerOpensWhenEveryAttemptFailed(t *testing.T) {
	s := time.Second
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"MinAttempts failures open", []step{
			fail(DefaultMinAttempts - 1), want(StateClosed), fail(1), want(StateOpen), refused(),
		}},
		{"one success holds 1,000 failures", []step{
			ok(1), fail(1000), want(StateClosed), counted(1001, 1000),
			tick(9 * s), fail(1), want(StateClosed), // the success is still in the window
			tick(1 * s), counted(1, 1), fail(18), want(StateClosed), fail(1), want(StateOpen),
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, Config{})
			for i, st := range tc.steps {
				h.step = i
				st(h)
			}
		})
	}
}

// TestDefaultBreakerOpenPeriod: a default breaker that opened lets a probe
// through after 1s plus up to 20% jitter, and failed probes grow the period
// to at most 4s (plus jitter); a successful probe resets it to 1s.
func TestDefaultBreakerOpenPeriod(t *testing.T) {
	for _, u := range []float64{0, 0.5, 0.999999} {
		t.Run(fmt.Sprintf("rand %v", u), func(t *testing.T) {
			h := newHarness(t, Config{rand: func() float64 { return u }})
			jittered := func(d time.Duration) time.Duration { return d + time.Duration(float64(d)*0.2*u) }
			var got []string
			// openFor checks that the breaker is open for exactly d, then
			// half-open.
			openFor := func(d time.Duration) {
				h.t.Helper()
				retryAfter(d)(h)
				tick(d - 1)(h)
				refused()(h)
				tick(1)(h)
				want(StateHalfOpen)(h)
				got = append(got, d.String())
			}
			fail(DefaultMinAttempts)(h)
			want(StateOpen)(h)
			openFor(jittered(time.Second))
			for _, base := range []time.Duration{2, 4, 4, 4} { // failed probe rounds
				fail(1)(h) // the probe
				openFor(jittered(base * time.Second))
			}
			ok(1)(h)
			want(StateClosed)(h)
			fail(DefaultMinAttempts)(h)
			openFor(jittered(time.Second)) // reset by the close
			t.Logf("open periods: %s", strings.Join(got, " "))
		})
	}
	t.Run("default rand", func(t *testing.T) {
		for range 100 {
			h := newHarness(t, Config{})
			fail(DefaultMinAttempts)(h)
			for _, base := range []time.Duration{1, 2, 4, 4} {
				d := h.b.RetryAfterAt(h.clk.Now())
				if d < base*time.Second || d >= base*time.Second*12/10 {
					t.Fatalf("open period %v, want [%v, %v)", d, base*time.Second, base*time.Second*12/10)
				}
				tick(d)(h)
				want(StateHalfOpen)(h)
				fail(1)(h)
			}
		}
	})
}

func TestStateString(t *testing.T) {
	for s, want := range map[State]string{
		StateClosed: "closed", StateOpen: "open", StateHalfOpen: "half-open", 7: "State(7)",
	} {
		if got := s.String(); got != want {
			t.Errorf("State(%d).String() = %q, want %q", s, got, want)
		}
	}
	var zero State
	if zero != StateClosed {
		t.Error("zero State is not StateClosed")
	}
}

func TestConfigDefaultsAndClamping(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	def := settings{
		ratio: 1, minAttempts: 20, width: time.Second, window: 10 * time.Second,
		consecutive: 0, openTimeout: time.Second, maxOpen: 4 * time.Second, probes: 1, jitter: 0.2,
	}
	cases := []struct {
		name string
		c    Config
		want func(*settings)
	}{
		{"zero", Config{}, func(*settings) {}},
		{"negative", Config{
			FailureRatio: -1, MinAttempts: -1, Window: -1, ConsecutiveFailures: -1,
			OpenTimeout: -1, HalfOpenProbes: -1, MaxOpenTimeout: -1,
		}, func(*settings) {}},
		{"NaN", Config{FailureRatio: nan, Jitter: nan}, func(*settings) {}},
		{"+Inf and above 1 clamp to 1", Config{FailureRatio: inf, Jitter: inf}, func(s *settings) { s.ratio, s.jitter = 1, 1 }},
		{"-Inf", Config{FailureRatio: math.Inf(-1), Jitter: math.Inf(-1)}, func(s *settings) { s.jitter = 0 }},
		{"ratio 1.5", Config{FailureRatio: 1.5}, func(s *settings) { s.ratio = 1 }},
		{"negative jitter disables it", Config{Jitter: -0.1}, func(s *settings) { s.jitter = 0 }},
		{"tiny window", Config{Window: 3}, func(s *settings) { s.width, s.window = 1, 10 }},
		{"window rounded to tenths", Config{Window: 1234 * time.Millisecond}, func(s *settings) {
			s.width, s.window = 123400*time.Microsecond, 1234*time.Millisecond
		}},
		{"max open defaults to 4x", Config{OpenTimeout: time.Minute}, func(s *settings) {
			s.openTimeout, s.maxOpen = time.Minute, 4*time.Minute
		}},
		{"max open saturates", Config{OpenTimeout: math.MaxInt64 / 3}, func(s *settings) {
			s.openTimeout, s.maxOpen = math.MaxInt64/3, math.MaxInt64
		}},
		{"max open below open timeout", Config{OpenTimeout: 5 * time.Second, MaxOpenTimeout: time.Second}, func(s *settings) {
			s.openTimeout, s.maxOpen = 5*time.Second, 5*time.Second
		}},
		{"explicit", Config{
			FailureRatio: 0.25, MinAttempts: 3, Window: time.Minute, ConsecutiveFailures: 4,
			OpenTimeout: time.Second, HalfOpenProbes: 2, MaxOpenTimeout: 3 * time.Second, Jitter: 0.5,
		}, func(s *settings) {
			*s = settings{ratio: 0.25, minAttempts: 3, width: 6 * time.Second, window: time.Minute, consecutive: 4,
				openTimeout: time.Second, maxOpen: 3 * time.Second, probes: 2, jitter: 0.5}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			want := def
			tc.want(&want)
			got := tc.c.settings()
			if got.rand == nil {
				t.Error("rand is nil")
			}
			got.rand, got.onChange = nil, nil
			if !reflect.DeepEqual(got, want) {
				t.Errorf("settings()\n got %+v\nwant %+v", got, want)
			}
		})
	}
}

func TestOpenPeriodSaturates(t *testing.T) {
	s := Config{OpenTimeout: math.MaxInt64 / 3, Jitter: 1, rand: func() float64 { return 0.99 }}.settings()
	for rounds := range 70 {
		d := s.openPeriod(rounds)
		if d < s.openTimeout || d > s.maxOpen {
			t.Fatalf("openPeriod(%d) = %v outside [%v, %v]", rounds, d, s.openTimeout, s.maxOpen)
		}
		if j := s.jittered(d); j < d {
			t.Fatalf("jittered(%v) = %v, overflowed", d, j)
		}
	}
	if got := satmath.Add(time.Duration(math.MaxInt64-1), 5); got != math.MaxInt64 {
		t.Fatalf("satmath.Add = %v", got)
	}
}

// TestInvalidConfigNeverPanics drives breakers with hostile configs through
// every state.
func TestInvalidConfigNeverPanics(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	for i, tc := range []struct {
		c    Config
		want []State // states the run must reach
	}{
		{Config{FailureRatio: nan, MinAttempts: -5, Window: -1, ConsecutiveFailures: -3, OpenTimeout: -1, HalfOpenProbes: -2, Jitter: nan},
			[]State{StateOpen, StateHalfOpen}},
		{Config{FailureRatio: inf, Window: 1, OpenTimeout: 1, MaxOpenTimeout: math.MaxInt64, Jitter: inf, rand: func() float64 { return -inf }},
			nil}, // a 10ns window never holds MinAttempts
		{Config{FailureRatio: -inf, OpenTimeout: math.MaxInt64, Jitter: 1, rand: func() float64 { return nan }},
			[]State{StateOpen}},
		{Config{OpenTimeout: math.MaxInt64, Jitter: 1, rand: func() float64 { return inf }},
			[]State{StateOpen}},
	} {
		clk := newClock()
		c := tc.c
		reached := map[State]bool{}
		c.OnStateChange = func(_ string, _, to State) { reached[to] = true }
		b := New(c)
		for j := range 200 {
			if tk, err := b.AdmitAt(clk.Now()); err == nil {
				// The first 40 fail, so that the default FailureRatio
				// (every attempt failed) opens; then two in three.
				tk.DoneAt(j < 40 || j%3 != 0, clk.Now())
			}
			clk.Advance(time.Duration(j) * time.Millisecond)
			_ = b.StatsAt(clk.Now())
			_ = b.OpenUntilAt(clk.Now())
			if d := b.RetryAfterAt(clk.Now()); d < 0 {
				t.Fatalf("config %d: RetryAfter = %v", i, d)
			}
		}
		for _, s := range tc.want {
			if !reached[s] {
				t.Errorf("config %d never reached %v (reached %v)", i, s, reached)
			}
		}
	}
}
