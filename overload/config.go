package overload

import (
	"math"
	"time"
)

// Defaults applied by New to zero (or invalid) Config fields.
const (
	DefaultQuantile      = 0.1
	DefaultWindow        = time.Second
	DefaultMinSamples    = 20
	DefaultMinLimit      = 4
	DefaultTolerance     = 2.0
	DefaultDeadlineShare = 0.5
	DefaultRetryShare    = 0.5
	DefaultLimitWindow   = 100 * time.Millisecond
	DefaultRetryAfter    = 100 * time.Millisecond
	DefaultMaxMethods    = 1024
	DefaultMaxDeadline   = 10 * time.Second
)

// Config configures a Guard. The zero value is valid: deadline-aware
// admission and adaptive, retry-aware shedding, both with the defaults
// below. New reads it once; later changes have no effect.
type Config struct {
	// MaxDeadline is the longest remaining deadline the Guard believes
	// (grpc-timeout, or the suite's stormguard-deadline-ms): a request that
	// claims more is treated in every way as one without a deadline, so
	// that a forged long deadline buys nothing. A deadline within it is
	// believed. Set it to the longest deadline the server's honest callers
	// use. ≤ 0 → 10s.
	MaxDeadline time.Duration

	// NoAdmission turns deadline-aware admission off.
	NoAdmission bool
	// Quantile is the share of recent requests of a method that were
	// faster than what admission expects a new one to need: a request is
	// refused when its remaining deadline is shorter than both this
	// quantile of the method's recent latencies and the time the requests
	// already in flight need to drain (see the package documentation).
	// 0, NaN or out of (0, 1) → 0.1.
	Quantile float64
	// Window is how long a handler latency counts for admission: the
	// latencies of the last Window (kept in 4 slots of Window/4, so the
	// last 3/4 to all of it) are the method's recent history. ≤ 0 → 1s;
	// otherwise rounded down to a multiple of 4 ns, and at least 4 ns.
	Window time.Duration
	// MinSamples is the least number of latencies in Window before
	// admission refuses anything for the method. ≤ 0 → 20.
	MinSamples int

	// NoShedding turns shedding off.
	NoShedding bool
	// MaxConcurrency, when > 0, is a fixed limit on the requests in flight
	// over all methods: at it, first attempts are shed; at RetryShare of
	// it, retries and hedges are (and sheddable requests at half that).
	// It is exact; the adaptive per-method limits (which NoAdaptive turns
	// off), which apply besides, may be passed by the few requests that
	// arrive at the same instant. Critical first attempts (see
	// Method.AdmitAt) are shed only when the critical requests in
	// flight alone reach it: with them, up to twice MaxConcurrency may be
	// in flight.
	MaxConcurrency int
	// NoAdaptive turns the adaptive per-method concurrency limits off
	// (MaxConcurrency, if set, still applies).
	NoAdaptive bool
	// MinLimit is the floor of an adaptive limit. ≤ 0 → 4.
	MinLimit int
	// Tolerance is how many times its baseline (the least latency learned
	// over time) a method's latency may be before its adaptive limit may
	// engage (it engages only when the method also fails to keep up: see
	// the package documentation). < 1, NaN or Inf → 2.
	Tolerance float64
	// DeadlineShare is the share of the deadline left to the requests of
	// a method (their 10th percentile on arrival) that its latency may take
	// before its adaptive limit may engage: the latency must be above both.
	// Negative: deadlines are not considered. 0, NaN or above 1 → 0.5.
	DeadlineShare float64
	// RetryShare is the share of a limit at which retries and hedges
	// (attempts with grpc-previous-rpc-attempts > 0, see IsRetry) are
	// shed, while first attempts are still admitted up to the whole limit.
	// Sheddable requests (see Method.AdmitAt) are shed at half of
	// it. ≤ 0, NaN or > 1 → 0.5.
	RetryShare float64
	// LimitWindow is how often an adaptive limit is updated, from the
	// latencies of the requests that ended in it (at least 5 of them).
	// ≤ 0 → 100ms.
	LimitWindow time.Duration
	// RetryAfter is the pushback given with a shed first attempt: the
	// caller may retry after this long (a shed retry, and a request
	// refused for its deadline, are told not to retry). ≤ 0 → 100ms.
	RetryAfter time.Duration

	// MaxMethods bounds the methods tracked one by one; further methods
	// share one state. ≤ 0 → 1024.
	MaxMethods int
}

// settings is a Config with defaults applied.
type settings struct {
	maxDeadline   time.Duration
	admission     bool
	quantile      float64
	window        time.Duration
	minSamples    int
	shedding      bool
	maxConc       int64
	adaptive      bool
	minLimit      int64
	tolerance     float64
	deadlineShare float64
	retryShare    float64
	limitWindow   time.Duration
	retryAfter    time.Duration
	maxMethods    int
}

func (c Config) settings() settings {
	s := settings{
		maxDeadline:   c.MaxDeadline,
		admission:     !c.NoAdmission,
		quantile:      c.Quantile,
		window:        c.Window,
		minSamples:    c.MinSamples,
		shedding:      !c.NoShedding,
		maxConc:       int64(max(c.MaxConcurrency, 0)),
		adaptive:      !c.NoAdaptive,
		minLimit:      int64(c.MinLimit),
		tolerance:     c.Tolerance,
		deadlineShare: c.DeadlineShare,
		retryShare:    c.RetryShare,
		limitWindow:   c.LimitWindow,
		retryAfter:    c.RetryAfter,
		maxMethods:    c.MaxMethods,
	}
	if s.maxDeadline <= 0 {
		s.maxDeadline = DefaultMaxDeadline
	}
	if !(s.quantile > 0 && s.quantile < 1) {
		s.quantile = DefaultQuantile
	}
	if s.window <= 0 {
		s.window = DefaultWindow
	}
	s.window = max(s.window/numSlots*numSlots, numSlots)
	if s.minSamples <= 0 {
		s.minSamples = DefaultMinSamples
	}
	if s.minLimit <= 0 {
		s.minLimit = DefaultMinLimit
	}
	if !(s.tolerance >= 1) || math.IsInf(s.tolerance, 0) {
		s.tolerance = DefaultTolerance
	}
	switch {
	case s.deadlineShare < 0:
		s.deadlineShare = 0
	case !(s.deadlineShare > 0 && s.deadlineShare <= 1):
		s.deadlineShare = DefaultDeadlineShare
	}
	if !(s.retryShare > 0 && s.retryShare <= 1) {
		s.retryShare = DefaultRetryShare
	}
	if s.limitWindow <= 0 {
		s.limitWindow = DefaultLimitWindow
	}
	if s.retryAfter <= 0 {
		s.retryAfter = DefaultRetryAfter
	}
	if s.maxMethods <= 0 {
		s.maxMethods = DefaultMaxMethods
	}
	return s
}
