package breaker

import (
	"math"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/stormguard/stormguard/internal/breakername"
	"github.com/stormguard/stormguard/internal/breakerrand"
	"github.com/stormguard/stormguard/internal/satmath"
)

// State is the state of a Breaker. The zero value is StateClosed.
type State uint8

// The states of a Breaker.
const (
	StateClosed   State = iota // attempts pass; outcomes are counted
	StateOpen                  // attempts are refused with ErrOpen
	StateHalfOpen              // up to HalfOpenProbes trial attempts pass
)

// String returns "closed", "open" or "half-open" ("State(n)" for any other
// value).
func (s State) String() string {
	switch s {
	case StateClosed:
		return "closed"
	case StateOpen:
		return "open"
	case StateHalfOpen:
		return "half-open"
	}
	return "State(" + strconv.Itoa(int(s)) + ")"
}

// Defaults applied by New for zero (or invalid) Config fields.
const (
	DefaultFailureRatio   = 1.0
	DefaultMinAttempts    = 20
	DefaultWindow         = 10 * time.Second
	DefaultOpenTimeout    = time.Second
	DefaultHalfOpenProbes = 1
	DefaultJitter         = 0.2
	// DefaultMaxOpenFactor is MaxOpenTimeout's default as a multiple of
	// OpenTimeout: two consecutive failed probe rounds reach it.
	DefaultMaxOpenFactor = 4
)

// windowBuckets is the number of time buckets the sliding Window is cut into.
const windowBuckets = 10

// Config configures a Breaker. The zero value is valid: every zero field
// takes its documented default. Invalid values (negative, NaN, infinite, a
// ratio above 1) are defaulted or clamped as documented per field; New never
// panics on a Config.
type Config struct {
	// FailureRatio opens the breaker when this share of the attempts in
	// Window failed. 0, negative or NaN → 1: only when every attempt
	// failed, so a target that still serves some calls keeps its breaker
	// closed. Above 1 (or +Inf) → 1.
	FailureRatio float64
	// MinAttempts is the least number of attempts that must have been seen
	// in Window before FailureRatio can open the breaker. ≤ 0 → 20.
	MinAttempts int
	// Window is the sliding window for FailureRatio, kept as 10 buckets of
	// Window/10 each (so it slides in steps of Window/10, and the last
	// 9 to 10 tenths are counted). It is also how long a half-open probe may
	// go without reporting before it is presumed failed. ≤ 0 → 10s; otherwise
	// rounded down to a multiple of 10ns, and at least 10ns.
	Window time.Duration
	// ConsecutiveFailures also opens the breaker after this many failures in
	// a row, whatever the window says. ≤ 0 → off.
	ConsecutiveFailures int
	// OpenTimeout is the base open period, after which the breaker lets
	// probes through (half-open). The actual period is jittered (see Jitter)
	// and grows on failed probes (see MaxOpenTimeout). ≤ 0 → 1s.
	OpenTimeout time.Duration
	// HalfOpenProbes is how many trial attempts may be in flight at once
	// while half-open, and how many must succeed to close. ≤ 0 → 1.
	HalfOpenProbes int
	// OnStateChange, if not nil, is called after each state change, outside
	// any lock, one call at a time per breaker, in the order of the
	// transitions. It may call back into the breaker. It may run on the
	// goroutine of a later call, after the call that caused the transition
	// has returned. Breakers of one Registry share it and may call it
	// concurrently. If it panics, the panic reaches the caller of the
	// method that delivered the change (Admit, a Ticket's Done, State,
	// ...) once the breaker's state is consistent: an attempt that Admit
	// was admitting is not made (its caller gets the panic, not a Ticket)
	// and its half-open probe slot is freed; changes not yet delivered go
	// to the next caller.
	OnStateChange func(target string, from, to State)

	// MaxOpenTimeout caps the open period, which doubles for each
	// consecutive failed probe round (OpenTimeout, 2×, 4×, ...) and returns
	// to OpenTimeout once the breaker closes. ≤ 0 → 4×OpenTimeout; below
	// OpenTimeout → OpenTimeout (the period never grows).
	MaxOpenTimeout time.Duration
	// Jitter lengthens each open period by a random share in
	// [0, Jitter) of it, so that clients that opened together do not probe
	// together. The period is never shortened: OpenTimeout is a minimum.
	// 0 or NaN → 0.2; negative → no jitter; above 1 → 1.
	Jitter float64

	// rand returns the random number in [0, 1) used for jitter; values
	// outside [0, 1] are clamped (NaN → 0). It is called once per opening,
	// and must be safe for concurrent use if breakers share it (a Registry
	// does). nil → math/rand/v2's Float64. It is no configuration: the
	// module's tests and simulators seed it (internal/breakerrand), so that
	// a half-open instant is exact or a run repeats.
	rand func() float64

	// name is the Target of the Breaker New makes; "" by default. It is no
	// configuration: the module's client names its routes' breakers
	// (internal/breakername); a Registry names its own.
	name string
}

func init() {
	breakerrand.Set = func(c any, f func() float64) { c.(*Config).rand = f }
	breakername.Set = func(c any, name string) { c.(*Config).name = name }
}

// settings is a Config with defaults applied and every value valid.
type settings struct {
	ratio       float64
	minAttempts int64
	width       time.Duration // Window / windowBuckets
	window      time.Duration // width * windowBuckets
	consecutive int64         // 0: off
	openTimeout time.Duration
	maxOpen     time.Duration
	probes      int
	jitter      float64 // 0: off
	rand        func() float64
	onChange    func(target string, from, to State)
}

func (c Config) settings() settings {
	s := settings{
		ratio:       c.FailureRatio,
		minAttempts: int64(c.MinAttempts),
		consecutive: int64(c.ConsecutiveFailures),
		openTimeout: c.OpenTimeout,
		maxOpen:     c.MaxOpenTimeout,
		probes:      c.HalfOpenProbes,
		jitter:      c.Jitter,
		rand:        c.rand,
		onChange:    c.OnStateChange,
	}
	switch {
	case math.IsNaN(s.ratio) || s.ratio <= 0:
		s.ratio = DefaultFailureRatio
	case s.ratio > 1:
		s.ratio = 1
	}
	if s.minAttempts <= 0 {
		s.minAttempts = DefaultMinAttempts
	}
	w := c.Window
	if w <= 0 {
		w = DefaultWindow
	}
	s.width = max(w/windowBuckets, 1)
	s.window = s.width * windowBuckets
	if s.consecutive < 0 {
		s.consecutive = 0
	}
	if s.openTimeout <= 0 {
		s.openTimeout = DefaultOpenTimeout
	}
	switch {
	case s.maxOpen <= 0:
		s.maxOpen = satmath.Mul(s.openTimeout, DefaultMaxOpenFactor)
	case s.maxOpen < s.openTimeout:
		s.maxOpen = s.openTimeout
	}
	if s.probes <= 0 {
		s.probes = DefaultHalfOpenProbes
	}
	switch {
	case math.IsNaN(s.jitter) || s.jitter == 0:
		s.jitter = DefaultJitter
	case s.jitter < 0:
		s.jitter = 0
	case s.jitter > 1:
		s.jitter = 1
	}
	if s.rand == nil {
		s.rand = rand.Float64
	}
	return s
}

// openPeriod returns the open period after rounds consecutive failed probe
// rounds, before jitter: OpenTimeout doubled per round, capped at maxOpen.
func (s *settings) openPeriod(rounds int) time.Duration {
	d := s.openTimeout
	for i := 0; i < rounds && d < s.maxOpen; i++ {
		d = satmath.Mul(d, 2)
	}
	return min(d, s.maxOpen)
}

// jittered lengthens d by a random share in [0, jitter) of it, saturating.
func (s *settings) jittered(d time.Duration) time.Duration {
	if s.jitter == 0 {
		return d
	}
	u := s.rand()
	if !(u > 0) { // also NaN
		return d
	}
	u = min(u, 1)
	extra := float64(d) * s.jitter * u
	if extra >= float64(math.MaxInt64-d) {
		return math.MaxInt64
	}
	return d + time.Duration(extra)
}
