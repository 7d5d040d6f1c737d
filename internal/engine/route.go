package engine

import (
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
)

// Config is what the engine takes from a client's options. One serves
// every route of a client; it is not changed once a route uses it. The
// zero Config enforces, fails over, and counts no code as a failure.
type Config struct {
	// Shadow: the budget's and the breaker's refusals do not stand: what
	// they would refuse is sent all the same, and said (see Admission).
	Shadow bool
	// NoFailover: attempts avoid no endpoint, and every retry is paid
	// from the budget.
	NoFailover bool
	// MinRemaining: an attempt with less time left before its deadline
	// is not sent (0: only one whose deadline has passed).
	MinRemaining time.Duration
	// Failures are the codes the breakers and the endpoint tables count
	// as failures.
	Failures CodeSet
	// Jitter returns a random number in [0, n), for the backoff's jitter
	// (nil: math/rand/v2's); a simulator gives its seeded generator's.
	Jitter func(n int64) int64
}

// Route is what the engine knows of one method of one target: the client's
// config, the parts shared by the target's routes (budget, endpoint table,
// yield), the method's breaker, its rule and its latency. Its fields are
// set once, before the route's first call; its parts are safe for
// concurrent use.
type Route struct {
	Config    *Config
	Budget    *budget.Budget   // nil: none (every retry and hedge is granted)
	Breaker   *breaker.Breaker // nil: none
	Endpoints *Endpoints       // never nil
	Yield     *Yield           // nil: hedges yield to nothing (no budget)
	Latency   *Latency         // adaptive hedging; nil unless Rule.Hedge with no delay
	// Rule is how the route's calls retry and hedge, unless the
	// operator's config gives the call another (Call.SetRule).
	Rule Rule
	// PerAttempt is the per-attempt timeout (0: none).
	PerAttempt time.Duration
	// Probes are the tries of retry loops outside the client that the
	// route refuses (see Probes).
	Probes Probes
}

// The client's defaults: what its options start from, and what a
// simulator of a client as it comes takes as they are.
const (
	DefaultMaxAttempts = 3
	DefaultBackoffBase = 50 * time.Millisecond
	DefaultBackoffMax  = time.Second
)

// DefaultRetryable are the codes retried, and DefaultFailures the codes
// the breakers and endpoint tables count as failures, when the client's
// options name none.
var (
	DefaultRetryable = Codes(Unavailable)
	DefaultFailures  = Codes(Unavailable, DeadlineExceeded, ResourceExhausted, Internal)
)

// Rule is how the calls of one method retry and hedge, when they may be
// repeated. It is not changed once a call uses it.
type Rule struct {
	MaxAttempts             int // the attempt limit of a call that may be repeated
	Retryable               CodeSet
	BackoffBase, BackoffMax time.Duration
	BackoffMult             float64 // 2, unless the operator's config says otherwise
	Hedge                   bool
	HedgeDelay              time.Duration // 0: adaptive (Route.Latency)
	MaxHedges               int
	FromServiceConfig       bool // the operator's config gave it (the adapter says so)
}
