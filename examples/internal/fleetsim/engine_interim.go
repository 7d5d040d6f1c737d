package fleetsim

import (
	"math/rand/v2"
	"time"
)

// INTERIM: the pieces of the suite's client below are transcribed from
// the interceptor's unexported attempt engine (interceptor/engine.go:
// decide, fundable, servedNothing, deadForSure, backoff; the defaults of
// RetryPolicy in interceptor/options.go), because they are not callable
// without grpc yet. The extraction of that engine into a grpc-free
// package driven with explicit times replaces this whole file: suiteClient
// then calls the engine's decision (retry or not, after what delay, paid
// how) and its endpoint choice instead of interimEngine, and nothing else
// in the model changes. What the interim engine does not do at all is
// fail over: the engine's per-endpoint table (interceptor/endpoint.go),
// which makes a retry after a failure on an outlier backend go to
// another one without paying the budget and makes later attempts avoid
// it, is not transcribed; the suite's client picks backends round robin
// as the rivals do, and the figures that depend on fail-over (one backend
// of M dead) are the suite without it until the engine is wired. Only a
// retry after a server's stormguard-budget-dry re-picks away from the
// backends that failed lately (suiteClient.Pick), as the engine's does.

// The suite's RetryPolicy defaults (interceptor/options.go) and the
// engine's thresholds (interceptor/engine.go, interceptor/endpoint.go).
const (
	defaultAttempts  = 3
	defaultBase      = 50 * time.Millisecond
	defaultMax       = time.Second
	minServedNothing = 3  // engine.go: failed attempts, none served, that refuse a retry when due
	minDeadForSure   = 10 // engine.go: ... that refuse it before its backoff
	epSlots          = 4  // endpoint.go: the outcomes of the last 3 to 4 s
	epSlotWidth      = time.Second
	epFailedMemory   = 10 * time.Second // endpoint.go: failedLately
	maxRepicks       = 3                // endpoint.go: an attempt's re-picks away from endpoints it avoids
)

// interimEngine is one client's share of the engine: its retry rules,
// its backoff, and the target's recent outcomes (the engine's endpoint
// table, summed over the endpoints: all servedNothing reads).
type interimEngine struct {
	roundRobin
	rand        *rand.Rand
	maxAttempts int
	base, cap   time.Duration
	// outcomes counts the target's attempts served and failed in the
	// last epSlots slots of epSlotWidth (the endpoint table's windows,
	// summed): slot[i] counts for second secs[i].
	ok, failed [epSlots]int32
	secs       [epSlots]int64
}

func newInterimEngine(e *Env, maxAttempts int) interimEngine {
	return interimEngine{roundRobin: newRoundRobin(e), rand: e.Rand, maxAttempts: maxAttempts,
		base: defaultBase, cap: defaultMax, secs: [epSlots]int64{-1, -1, -1, -1}}
}

// failure reports whether a code counts against the target (the
// Client's failure codes: Unavailable, DeadlineExceeded,
// ResourceExhausted and Internal by default).
func failure(c Code) bool { return c != OK }

// record counts an attempt's outcome in the target's table.
func (g *interimEngine) record(now time.Time, failed bool) {
	sec := now.UnixNano() / int64(epSlotWidth)
	i := sec % epSlots
	if g.secs[i] != sec {
		g.secs[i], g.ok[i], g.failed[i] = sec, 0, 0
	}
	if failed {
		g.failed[i]++
	} else {
		g.ok[i]++
	}
}

// servedNothing is the engine's servedNothing: the target's last 3 to 4 s
// hold at least minServedNothing attempts, all failed.
func (g *interimEngine) servedNothing(now time.Time, least int32) bool {
	sec := now.UnixNano() / int64(epSlotWidth)
	var ok, failed int32
	for i := range epSlots {
		if s := g.secs[i]; s > sec-epSlots && s <= sec {
			ok, failed = ok+g.ok[i], failed+g.failed[i]
		}
	}
	return ok == 0 && failed >= least
}

// rules is decide's order of rules up to the payment: the server's "do
// not retry", the retryable codes (Unavailable by default), the attempt
// limit, then the delay (pushback, or the backoff) and the deadline.
func (g *interimEngine) rules(c *Call, now time.Time, o Outcome) (time.Duration, bool) {
	if o.Pushback != NoPushback && o.Pushback < 0 {
		return 0, false
	}
	if o.Code != Unavailable || c.Attempts >= g.maxAttempts {
		return 0, false
	}
	var d time.Duration
	if o.Pushback != NoPushback {
		d, c.backoffN = o.Pushback, 0
	} else {
		d = g.backoff(c)
	}
	return d, now.Add(d).Before(c.Deadline)
}

// backoff is the engine's backoff: a random time in [d/2, d] with
// d = min(max, base·2ⁿ).
func (g *interimEngine) backoff(c *Call) time.Duration {
	d := g.base << min(c.backoffN, 30)
	if d <= 0 || d > g.cap {
		d = g.cap
	}
	c.backoffN++
	return d/2 + time.Duration(g.rand.Int64N(int64(d/2)+1))
}
