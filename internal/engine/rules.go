package engine

import (
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

// The rules: whether, and when, a failed attempt is retried or failed
// over, and when a hedge or a retry beside a slow attempt is due. They
// judge and change nothing: the step (Step) applies what they say, and the
// admission (gates.go) says whether what they allow may be sent or paid.

// ruling is what the rules make of a failed attempt.
type ruling struct {
	reason Reason        // why it is not retried ("" when it may be)
	delay  time.Duration // when it may: the backoff or the server's delay
	stop   bool          // the server said not to retry: no attempt follows any more
	// pushed: the delay is the server's, which restarts the backoff;
	// backedOff: the delay is the backoff, which grows.
	pushed, backedOff bool
}

// eligible applies the rules that say whether failure o may be retried at
// all: the server's "do not retry" comes first (it may come with any code,
// and it says the attempt was not run, not that the call is settled),
// then the code (DEADLINE_EXCEEDED of an attempt cut at its per-attempt
// timeout is retryable), then whether the method may be repeated.
func (c *Call) eligible(o *Outcome) ruling {
	switch {
	case o.Pushback.Stop || c.stopped:
		return ruling{reason: ReasonPushback, stop: true}
	case !c.Rule.Retryable.Has(o.Code) && !(o.TimedOut && o.Code == DeadlineExceeded):
		return ruling{reason: ReasonCode}
	case !c.Repeatable:
		return ruling{reason: ReasonNotIdempotent}
	}
	return ruling{}
}

// decide applies the rest of the rules, in order, to a failure that is
// eligible, once the operator's configuration has been read again: the
// transport's own retries, the attempt limit and the user's predicate
// (mayRetry), the server's RetryInfo, the delay (the longer of the
// server's two, or the backoff), and whether the retry would start before
// the deadline.
func (c *Call) decide(h Host, o *Outcome) ruling {
	if r := c.mayRetry(h, o); r != 0 {
		return ruling{reason: r}
	}
	ri := o.RetryInfo
	if ri.Stop {
		return ruling{reason: ReasonPushback, stop: true}
	}
	p := ruling{delay: o.Pushback.After, pushed: o.Pushback.Set}
	if ri.Set && (!p.pushed || ri.After > p.delay) {
		p.delay, p.pushed = ri.After, true
	}
	if !p.pushed {
		p.delay, p.backedOff = c.backoff(), true
	}
	if !c.Deadline.IsZero() && !o.At.Add(p.delay).Before(c.Deadline) {
		p.reason = ReasonDeadline
	}
	return p
}

// mayRetry asks the rules that every retry answers, the ones sent after a
// failure and the ones sent beside a slow attempt alike: the transport
// does not retry the method itself, attempts are left, and the user's
// predicate (Host.RetryIf, asked here only) agrees with failure o.
func (c *Call) mayRetry(h Host, o *Outcome) Reason {
	switch {
	case c.GRPCRetry:
		return ReasonGRPCRetry
	case c.sent >= c.MaxAttempts():
		return ReasonMaxAttempts
	case !h.RetryIf(*o):
		return ReasonRetryIf
	}
	return 0
}

// MayFollow returns why no retry may follow the latest attempt opened if
// it runs past its per-attempt timeout, as far as the rules know, or ""
// when one may: the method may be repeated, and mayRetry agrees with a
// timed-out attempt. The per-attempt timer and the hedger ask it; the
// admission is asked when the timeout fires.
func (c *Call) MayFollow(h Host) Reason {
	if !c.Repeatable {
		return ReasonNotIdempotent
	}
	return c.mayRetry(h, &Outcome{Code: DeadlineExceeded, TimedOut: true})
}

// Beside notes that the call's next retry is sent beside a slow attempt
// (its per-attempt timeout passed): it is no fail-over, and the budget
// pays for it.
func (c *Call) Beside() {
	if c.pay == payFailover {
		c.pay = payBudget
	}
}

// settles reports whether a refusal for r leaves the failed attempt's own
// answer as the call's, even while other attempts of a hedged call run:
// the code, the method, the user's predicate or the transport's own
// retries say no attempt of this call is to be retried.
func (r Reason) settles() bool {
	switch r {
	case ReasonNotIdempotent, ReasonCode, ReasonRetryIf, ReasonGRPCRetry:
		return true
	}
	return false
}

// failOver decides whether the retry after failure o is a fail-over: o
// failed on an endpoint that fails while the target's other endpoints
// serve (see Endpoints.outliers). Every attempt avoids such endpoints, so
// a fail-over retry goes to one that serves: it is not added load on a
// failing service, and the budget does not pay for it; the breaker and the
// attempt limit still apply. If its picks all go to endpoints it avoids
// (the transport has no other endpoint ready), it fails over to nothing:
// the budget pays for it at the pick, or it is not sent (see Pick), and
// attempts avoid nothing for a while.
//
// When endpoints the channel was given have not answered yet (a fresh
// channel whose first picks went to o's endpoint; a quiet client that
// has met few of them), the retry avoids o's endpoint too, but as an
// ordinary retry, which the budget pays for: nothing says that endpoint
// fails while the others serve, and a fleet whose target fails
// everywhere must not have each client's first failures retried for
// free (a client's budget lends for its first failures).
func (c *Call) failOver(o *Outcome) {
	if c.pay == payFailover || c.pay == payCredit {
		c.pay = payBudget
	}
	if c.r.Config.NoFailover {
		return
	}
	p, eps, now := o.Endpoint, c.r.Endpoints, o.At
	c.avoid = eps.Current(now)
	if p != nil && !slices.Contains(c.avoid, p) {
		c.avoid = eps.judge(now) // this failure may make it one
	}
	switch {
	case p == nil:
	case slices.Contains(c.avoid, p):
		if c.pay == payBudget {
			c.pay = payFailover
		}
	case c.unheard():
		c.avoid = append(slices.Clip(c.avoid), p)
	}
}

// dryEverywhere is the retry's answer to a server that said its retry
// budget could not pay for it (Outcome.BudgetDry): the server speaks for
// its own endpoint, which would refuse the retry, so the retry avoids it
// and every endpoint that failed an attempt lately (their servers are
// likely dry too; see Endpoints.failedLately), and is paid from the
// budget's credit alone (payCredit: a client's start-up loan is for a
// failure the fleet's servers have not paid for yet, and these have). It
// reports whether that leaves no endpoint to go to (none the target's
// table knows, and none the channel was given that has not answered yet):
// then the retry is not sent. With NoFailover the retry picks as any attempt
// does. A fail-over stays one: it goes to an endpoint that serves, and
// is free.
func (c *Call) dryEverywhere(o *Outcome) bool {
	avoid := slices.Clip(c.avoid)
	if p := o.Endpoint; p != nil && !slices.Contains(avoid, p) {
		avoid = append(avoid, p)
	}
	avoid, all := c.r.Endpoints.failedLately(avoid, o.At)
	if !c.r.Config.NoFailover {
		c.avoid = avoid
	}
	if c.pay == payBudget {
		c.pay = payCredit
	}
	return all && !c.unheard()
}

// backoff returns the next exponential backoff with jitter: a random time
// in [d/2, d] with d = backoffCeil.
func (c *Call) backoff() time.Duration {
	d := c.backoffCeil()
	return d/2 + time.Duration(c.r.Config.jitter(int64(d/2)+1))
}

// backoffCeil is the longest the next retry's backoff can be:
// min(max, base·multⁿ), n the retries since the last pushback.
func (c *Call) backoffCeil() time.Duration {
	r := c.Rule
	var d time.Duration
	if r.BackoffMult == 2 {
		d = r.BackoffBase << min(c.backoffN, 30)
	} else if f := float64(r.BackoffBase) * math.Pow(r.BackoffMult, float64(c.backoffN)); f < float64(r.BackoffMax) {
		d = time.Duration(f)
	}
	if d <= 0 || d > r.BackoffMax {
		d = r.BackoffMax
	}
	return d
}

// jitter returns a random number in [0, n).
func (cfg *Config) jitter(n int64) int64 {
	if cfg.Jitter != nil {
		return cfg.Jitter(n)
	}
	return rand.Int64N(n)
}

// NextTimer returns when a hedged call's next hedge, or retry beside a
// slow attempt, is due after its latest attempt, and which (0: none):
// hedging and timing say whether more of each may be sent. A hedge waits
// the rule's delay (or the route's adaptive one, once it is warm); a retry
// the per-attempt timeout; whichever is due first is armed.
func (c *Call) NextTimer(hedging, timing bool) (time.Duration, Kind) {
	if c.sent >= c.MaxAttempts() {
		return 0, Hedge
	}
	var d time.Duration
	if hedging && c.hedges < c.Rule.MaxHedges {
		d = c.Rule.HedgeDelay
		if lat := c.r.Latency; d == 0 && lat != nil {
			var ok bool
			if d, ok = lat.hedgeDelay(); !ok {
				d = 0 // adaptive, not warm yet: no hedge
			}
		}
	}
	if p := c.r.PerAttempt; timing && p > 0 && (d == 0 || p < d) {
		return p, Retry
	}
	return d, Hedge
}
