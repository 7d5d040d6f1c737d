package breaker

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// The defaults of issue 14 ("do no harm"): a default breaker opens only
// when every attempt in its window failed, and its open periods stay short.

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
			if s := h.b.Stats(); s.Opened != 0 || s.Attempts < DefaultMinAttempts {
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
			h := newHarness(t, Config{Rand: func() float64 { return u }})
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
				d := h.b.RetryAfter()
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
