package engine

import (
	"net"
	"time"

	"github.com/stormguard/stormguard/breaker"
)

// Host is what the engine asks of the adapter that runs a call on its RPC
// stack, on the call's goroutine, while it decides after a failed attempt.
type Host interface {
	// Refresh reads the operator's configuration of the call again at
	// now, and sets what it says (Call.Rule, Repeatable, GRPCRetry,
	// Deadline). Without force, only if it may have changed since the
	// call read it; with force, in any case (a failure the rules may
	// retry: the configuration a fresh channel gets late must stop or
	// bound the retry).
	Refresh(now time.Time, force bool)
	// RetryIf asks the user's predicate, if any, whether the failure o
	// may be retried (true when there is none). o is a timed-out
	// attempt, with no Err, when the question is asked before a retry is
	// sent beside a slow attempt.
	RetryIf(o Outcome) bool
}

// Throttle is the operator's retry throttling (a gRPC service config's
// retryThrottling): it counts every attempt's outcome and throttles
// retries and hedges. A nil Throttle throttles nothing; one must be safe
// for concurrent use.
type Throttle interface {
	Throttled() bool
	Failure()
	Success()
}

// Resolved tells how many endpoints the call's channel was given (its
// resolver's addresses): while fewer have answered, the target has not
// served nothing for sure. nil: not known.
type Resolved interface{ Endpoints() int }

// payment is how the next retry of a call is paid for.
type payment uint8

const (
	payBudget   payment = iota // a token from the budget
	payFailover                // a fail-over from an outlier endpoint: free, unless it cannot fail over (see Pick)
	payPrepaid                 // withdrawn when its attempt was cut at its per-attempt timeout (see Cut)
	// payCredit: a token from the budget's credit alone, starting no
	// loan: the server said its own retry budget could not pay for the
	// retry (Outcome.BudgetDry; see dryEverywhere).
	payCredit
)

// Call is the engine's state of one logical call: its plan (set by the
// adapter), what it has sent, and how its next retry is paid. It is used
// by the call's goroutine only; a per-attempt timer works on a copy (Cut),
// and a pick on its own state (Pick).
//
// The zero Call is reset, ready for the adapter to fill its plan and
// Begin it.
type Call struct {
	// The plan: set by the adapter before Begin, and again when it reads
	// the operator's configuration (Host.Refresh); and, in gate, its
	// Deadline (zero: none), Throttle (nil: none) and Resolved (nil: not
	// known).
	Rule       *Rule
	Repeatable bool // the method may be repeated: retried or hedged
	GRPCRetry  bool // the transport retries the method itself: one attempt of the engine's
	Asked      int  // the attempt limit of this call alone (0: none)
	gate

	start    time.Time
	pay      payment
	stopped  bool // a server said "do not retry": no attempt follows any more
	sent     int  // attempts sent
	retries  int
	hedges   int
	prior    int // attempts the logical call's earlier tries sent (a retry loop outside the client)
	backoffN int // retries since the last pushback
	// The time the call had no attempt in flight between two of its
	// attempts (gRFC A96's retry delay): live counts the attempts opened
	// and not yet settled, idleFrom is when the last of them was settled
	// (zero while one is in flight), and an attempt opened after it adds
	// the gap to idle.
	live     int
	idleFrom time.Time
	idle     time.Duration
	avoid    []net.Addr // the endpoints the next attempts avoid
}

// Begin starts the call on route r at now. prior is how many attempts the
// logical call's earlier tries sent, when this call is a try of it that
// came back through a retry loop outside the client (0: none): such a call
// deposits nothing, and its first attempt is a retry. Otherwise Begin
// deposits into the budget. The plan must be set before.
func (c *Call) Begin(r *Route, now time.Time, prior int) {
	c.r, c.start, c.prior = r, now, prior
	if !r.Config.NoFailover {
		c.avoid = r.Endpoints.Current(now)
	}
	if prior == 0 {
		c.deposit(now)
	}
}

// Route returns the route Begin was given.
func (c *Call) Route() *Route { return c.r }

// FirstKind is the kind of the call's first attempt: a retry for a try
// that came back.
func (c *Call) FirstKind() Kind {
	if c.prior > 0 {
		return Retry
	}
	return First
}

// MaxAttempts is the call's attempt limit: one for a call that may not be
// repeated; else Asked, or its rule's.
func (c *Call) MaxAttempts() int {
	switch {
	case !c.Repeatable:
		return 1
	case c.Asked > 0:
		return c.Asked
	}
	return c.Rule.MaxAttempts
}

// Start returns when the call began.
func (c *Call) Start() time.Time { return c.start }

// Sent returns how many attempts the call has sent.
func (c *Call) Sent() int { return c.sent }

// Prior returns how many attempts the logical call's earlier tries sent.
func (c *Call) Prior() int { return c.prior }

// Retries and Hedges return how many retries and hedges the call sent.
func (c *Call) Retries() int { return c.retries }

// Hedges: see Retries.
func (c *Call) Hedges() int { return c.hedges }

// Idle returns how long the call had no attempt in flight between its
// attempts so far.
func (c *Call) Idle() time.Duration { return c.idle }

// Avoid returns the endpoints the call's next attempt avoids.
func (c *Call) Avoid() []net.Addr { return c.avoid }

// Failover reports whether the call's next retry is a fail-over.
func (c *Call) Failover() bool { return c.pay == payFailover }

// Attempt is the engine's state of one attempt. The zero Attempt is
// filled by Call.Open.
type Attempt struct {
	Kind  Kind
	Start time.Time

	ticket breaker.Ticket
	// guarded is the open breaker of a first attempt sent to its pick: it
	// is refused there if it picks an endpoint that served nothing (see
	// guardPick), and counted as sent otherwise.
	guarded *breaker.Breaker
	// shadowed marks, in shadow mode, an attempt the client would have
	// refused: sent anyway, but its outcome is kept from the breaker and
	// the endpoint table, so that they see what they would have seen.
	shadowed bool
	// probe marks the first attempt of a try that came back, sent as a
	// probe of its locked route although the budget or the breaker
	// refused it: nobody pays for it.
	probe bool
	// free marks a fail-over retry, which the budget did not pay for: if
	// its pick can go only to an endpoint it avoids, it is no fail-over,
	// and the budget pays then, or it is not sent (see Pick). It is
	// counted as sent after its pick.
	free bool
	// paid: an enforcing budget paid for this retry or hedge (not with no
	// budget, not in shadow mode): it may say so to the server.
	paid bool
}

// Paid reports whether an enforcing budget paid for the attempt, before
// it was sent.
func (a *Attempt) Paid() bool { return a.paid }

// AtPick reports whether the attempt is decided at its pick (Call.Picked):
// a first attempt an open breaker lets through to its pick, or a fail-over
// retry.
func (a *Attempt) AtPick() bool { return a.guarded != nil || a.free }

// Open opens attempt a of kind k at now: the admission, which says in
// *adm what it decided (adm must point to a zero Admission: the attempt
// admitted), then, if a may be sent, counts it. An attempt decided at its
// pick (Attempt.AtPick) is settled by Picked once it has been sent.
func (c *Call) Open(a *Attempt, k Kind, now time.Time, adm *Admission) {
	*a = Attempt{Kind: k, Start: now}
	if c.take(a, now, adm); adm.Refused != 0 {
		return
	}
	if c.pay == payPrepaid {
		c.pay = payBudget
	}
	if c.live == 0 && !c.idleFrom.IsZero() {
		c.idle += now.Sub(c.idleFrom)
		c.idleFrom = time.Time{}
	}
	c.live++
	c.count(k, 1)
}

// count adds n (±1) attempts of kind k to the tally.
func (c *Call) count(k Kind, n int) {
	c.sent += n
	switch k {
	case Retry:
		c.retries += n
	case Hedge:
		c.hedges += n
	}
}
