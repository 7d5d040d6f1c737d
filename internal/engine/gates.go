package engine

import (
	"net"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/internal/breakerticket"
)

// The admission: may an attempt be sent now (peek), and send it (take).
// It alone asks the deadline, the breaker, the operator's throttle, the
// budget and the endpoint table, reads shadow mode, judges whether the
// target serves nothing, and learns from each attempt's end what it judges
// with. Its gates, in order: the target's load (hedges and retries beside
// a slow attempt yield to it), time left, the breaker (and whether the
// target serves nothing), the throttle, the budget.

// Admission is what the admission said of an attempt. The zero Admission
// admits it.
type Admission struct {
	// Refused is why the attempt may not be sent (0 when it may). Nothing
	// was taken for it.
	Refused Reason
	// Would is, in shadow mode, the refusal that did not stand: the
	// attempt is sent all the same, and its outcome kept from what the
	// admission judges with.
	Would Reason
	// Probe: a try that came back was refused for this reason, and is sent
	// all the same as a probe of its locked route (see Probes).
	Probe Reason
	// Fails: the refusal is the gate's own failure (time left, an open
	// breaker), which a call refused before it sent anything fails with,
	// rather than with its last attempt's status.
	Fails bool
	// RetryAfter is, for an open breaker's refusal, when it lets a probe
	// through.
	RetryAfter time.Duration
}

// gate is what the admission judges a call's attempts with: the route,
// and the plan's Deadline, Throttle and Resolved. A per-attempt timer
// judges on a copy, so that it reads nothing of the call (see Cut).
type gate struct {
	r        *Route
	Deadline time.Time // zero: none
	Throttle Throttle  // nil: none
	Resolved Resolved  // nil: not known
}

// stands reports whether refusal why stands: in shadow mode, the budget's
// and the breaker's do not.
func (r *Route) stands(why Reason) bool {
	return !r.Config.Shadow || (why != ReasonBudget && why != ReasonBreaker)
}

// budgetPays reports whether what the budget grants is paid for: there is
// a budget, and it enforces (no shadow mode).
func (r *Route) budgetPays() bool { return r.Budget != nil && !r.Config.Shadow }

// deposit counts a call into the budget.
func (g *gate) deposit(now time.Time) { g.r.Budget.DepositAt(now) } // a nil budget does nothing

// timeLeft reports whether an attempt sent at at has time enough before
// the deadline (none: always).
func (g *gate) timeLeft(at time.Time) bool {
	if g.Deadline.IsZero() {
		return true
	}
	left := g.Deadline.Sub(at)
	return left > 0 && left >= g.r.Config.MinRemaining
}

// throttled reports whether the operator's throttle holds retries and
// hedges back.
func (g *gate) throttled() bool { return g.Throttle != nil && g.Throttle.Throttled() }

// take runs the gates for attempt a at now, taking what it is sent with
// (the breaker's ticket, the budget's token), and says what it decided in
// *adm, which is zero on entry (it admits a); in shadow mode a refusal by
// the breaker or the budget does not stand, and a try that came back may
// be sent as a probe.
func (c *Call) take(a *Attempt, now time.Time, adm *Admission) {
	c.admit(a, now, adm)
	switch {
	case adm.Refused == 0:
		return
	case !c.r.stands(adm.Refused):
		a.ticket.Ignore()
		a.ticket, a.shadowed = breaker.Ticket{}, true
		*adm = Admission{Would: adm.Refused}
		return
	}
	a.ticket.Ignore()
	if c.probe(a, now, adm.Refused) {
		*adm = Admission{Probe: adm.Refused}
	}
}

// admit asks, in order, time left, the breaker, whether the target serves
// nothing, the throttle and the budget whether attempt a may be sent at
// now, and takes what it is sent with. It writes a refusal to *adm, and
// leaves *adm as it is when a may be sent.
func (c *Call) admit(a *Attempt, now time.Time, adm *Admission) {
	if !c.Deadline.IsZero() && !c.timeLeft(now) {
		*adm = Admission{Refused: ReasonDeadline, Fails: true}
		return
	}
	r := c.r
	if b := r.Breaker; b != nil {
		t, err := b.AdmitAt(now)
		switch {
		case err == nil:
			a.ticket = t
		case a.Kind == First && c.guardPick(now):
			a.guarded = b // refused at the pick, if it picks an endpoint that served nothing
		default:
			*adm = Admission{Refused: ReasonBreaker, Fails: true, RetryAfter: b.RetryAfterAt(now)}
			return
		}
		if a.Kind != First && !a.probe && c.servesNothing(now, nothingWhenDue, nil) {
			*adm = Admission{Refused: ReasonBreaker}
			return
		}
	}
	switch {
	case a.Kind == First:
	case c.throttled():
		*adm = Admission{Refused: ReasonThrottle}
	case a.probe: // nobody pays
	case a.Kind == Retry && c.pay == payPrepaid:
		a.paid = r.budgetPays() // withdrawn at its per-attempt timeout (see Cut)
	case a.Kind == Retry && c.pay == payFailover:
		a.free = true // the budget pays at the pick if it cannot fail over
	case a.Kind == Retry && c.pay == payCredit:
		if !r.Budget.WithdrawNoNewLoanAt(now) { // a nil budget grants
			*adm = Admission{Refused: ReasonBudget}
			return
		}
		a.paid = r.budgetPays()
	case a.Kind == Hedge:
		if !r.Budget.HedgeAt(now) { // a nil budget grants
			*adm = Admission{Refused: ReasonBudget}
			return
		}
		a.paid = r.budgetPays()
	case !r.Budget.WithdrawAt(now): // a nil budget grants
		*adm = Admission{Refused: ReasonBudget}
	default:
		a.paid = r.budgetPays()
	}
}

// peek reports why an attempt of kind k could not be sent (its reason), or
// 0 when it could, taking nothing: at now, or, with after ≥ 0, once that
// long has passed (a backoff: time left is judged then). beside marks a
// retry sent beside a slow attempt, which, as a hedge does, yields to the
// target's load; least is the evidence that the target serves nothing
// (see servesNothing). The budget is asked of a retry it pays for (pay),
// not of a fail-over, nor of a hedge (take asks). In shadow mode the
// breaker's and the budget's refusals do not stand.
func (g *gate) peek(now time.Time, k Kind, beside bool, after time.Duration, least int64, pay payment) Reason {
	r := g.r
	if (k == Hedge || beside) && r.Yield.yields(now) {
		return ReasonOverload
	}
	if after >= 0 && !g.timeLeft(now.Add(after)) {
		return ReasonDeadline
	}
	b := r.Breaker
	if b != nil && (b.RetryAfterAt(now) > 0 || g.servesNothing(now, least, nil)) && r.stands(ReasonBreaker) {
		return ReasonBreaker
	}
	if g.throttled() {
		return ReasonThrottle
	}
	if k == Retry && r.Budget != nil && r.stands(ReasonBudget) &&
		(pay == payBudget && !r.Budget.PeekAt(now) || pay == payCredit && !r.Budget.PeekNoNewLoanAt(now)) {
		return ReasonBudget
	}
	return 0
}

// probe decides whether the first attempt a of a try that came back (a
// retry loop outside the client), refused at now for reason, is sent all
// the same, as a probe of its locked route (see Probes): the budget does
// not pay for it; time left, the breaker (when open) and the throttle
// still apply. It reports whether a was admitted so.
func (c *Call) probe(a *Attempt, now time.Time, reason Reason) bool {
	if c.prior == 0 || c.sent > 0 || (reason != ReasonBudget && reason != ReasonBreaker) {
		return false
	}
	if !c.r.Probes.probeDue(now, c.servedLately(now)) {
		return false
	}
	*a = Attempt{Kind: a.Kind, Start: a.Start, probe: true}
	var adm Admission
	if c.admit(a, now, &adm); adm.Refused != 0 {
		a.ticket.Ignore()
		return false
	}
	return true
}

// guardPick decides, for a first attempt that an open breaker refuses,
// whether to refuse it at the pick instead: when the target's endpoints
// that served nothing lately are known, the attempt avoids them (picking
// again, as for outliers) and is refused only if it still picks one. An
// endpoint that serves (a healthy backend whose connection was not ready
// when the others failed, a new one) gets the call: an open breaker never
// refuses what no retries would have sent successfully. A target whose
// every endpoint has failed is refused as before, before anything is sent.
func (c *Call) guardPick(now time.Time) bool {
	if c.r.Config.NoFailover {
		return false
	}
	var silent []net.Addr
	for _, ep := range c.r.Endpoints.known() {
		if c.servesNothing(now, nothingAtEndpoint, ep) {
			silent = append(silent, ep)
		}
	}
	if len(silent) == 0 {
		return false
	}
	c.avoid = append(silent, c.avoid...)
	return true
}

// Cut is what a per-attempt timer decides with, when the attempt it
// watches runs past its timeout and a retry would be sent after cutting
// it: a copy of the call's admission, made when the attempt is sent, so
// that the timer, on a goroutine of its own, reads nothing of the call.
type Cut struct {
	g       gate
	backoff time.Duration // the longest the retry's backoff can be
	first   bool          // the call's first attempt
	// Paid: Take withdrew the retry's token, which the retry is then sent
	// with (Call.Prepaid). Read once the timer is known to be done.
	Paid bool
}

// Cut returns what the per-attempt timer of the attempt just opened
// decides with, and counts, for the call's first attempt, that a timer
// watches it (see Yield).
func (c *Call) Cut(now time.Time) Cut {
	first := c.sent == 1
	if first {
		c.r.Yield.watched(now)
	}
	return Cut{g: c.gate, backoff: c.backoffCeil(), first: first}
}

// Take decides, when the timer fires at now, whether a retry may follow
// the cut attempt: it is a retry beside a slow attempt (it yields to the
// target's load), sent after at most the backoff. It returns why not, or
// 0 when it may, with its token withdrawn (Paid).
func (t *Cut) Take(now time.Time) Reason {
	r := t.g.r
	if t.first {
		r.Yield.late(now)
	}
	if why := t.g.peek(now, Retry, true, t.backoff, nothingWhenDue, payPrepaid); why != 0 {
		return why
	}
	if r.budgetPays() {
		if !r.Budget.WithdrawAt(now) {
			return ReasonBudget
		}
		t.Paid = true
	}
	return 0
}

// Prepaid notes that the call's next retry was paid for when its attempt
// was cut (Cut.Take).
func (c *Call) Prepaid() { c.pay = payPrepaid }

// payAtPick pays, at now, for a fail-over retry whose picks all went to
// endpoints it avoids: the transport has nowhere else to send it, so it
// is no fail-over. It reports whether the budget paid (no budget pays).
func (r *Route) payAtPick(now time.Time) bool {
	r.Endpoints.nowhereElse(now)
	return r.Budget.WithdrawAt(now) // a nil budget pays
}

// Picked settles, once attempt a has been sent, what its pick decided:
// refused says whether the pick refused it for good (a guarded pick of an
// endpoint that served nothing, a fail-over retry with nowhere to go that
// the budget would not pay for). Such an attempt was never sent: Picked
// undoes Open for it, and says why. In shadow mode nothing is refused at
// the pick; what would have been is said.
func (c *Call) Picked(a *Attempt, refused bool, now time.Time) Admission {
	if !a.AtPick() {
		return Admission{}
	}
	why := ReasonBreaker
	if a.free {
		why = ReasonBudget
	}
	guarded := a.guarded
	a.guarded, a.free = nil, false
	switch {
	case !refused:
		return Admission{}
	case !c.r.stands(why):
		a.ticket.Ignore()
		a.ticket, a.shadowed = breaker.Ticket{}, true
		return Admission{Would: why}
	}
	a.ticket.Ignore()
	c.count(a.Kind, -1)
	if c.live--; c.live == 0 {
		c.idleFrom = now // it was never in flight
	}
	if guarded != nil {
		return Admission{Refused: why, Fails: true, RetryAfter: guarded.RetryAfterAt(now)}
	}
	return Admission{Refused: why}
}

// learn reports how attempt a ended (o) to what the admission judges
// with: the breaker (by the attempt's ticket), the endpoint table, the
// throttle, the route's latency and its probes. abandoned is true for a
// hedge cancelled because another attempt won, which says nothing about
// the target. It runs once per attempt, on the goroutine that ends it: the
// ticket is reported without a compare-and-swap (breakerticket).
func (c *Call) learn(a *Attempt, o *Outcome, abandoned bool) {
	r := c.r
	switch {
	case abandoned || (o.Code == Canceled && o.CallerLeft):
		a.ticket.Ignore()
		if abandoned && r.Latency != nil {
			r.Latency.observe(o.At.Sub(a.Start)) // a lower bound: it was cut short
		}
	case a.shadowed:
		a.ticket.Ignore()
	case o.Code == OK:
		breakerticket.DoneAt(&a.ticket, false, o.At)
		if o.Endpoint != nil { // an unknown endpoint is not recorded
			r.Endpoints.Record(o.Endpoint, false, o.At)
		}
		if c.Throttle != nil {
			c.Throttle.Success()
		}
		if r.Latency != nil {
			r.Latency.observe(o.At.Sub(a.Start))
		}
	default:
		failed := r.Config.Failures.Has(o.Code)
		breakerticket.DoneAt(&a.ticket, failed, o.At)
		r.Probes.failed(o.At)
		r.Endpoints.Record(o.Endpoint, failed, o.At)
		if r.Latency != nil && !c.Rule.Retryable.Has(o.Code) {
			r.Latency.observe(o.At.Sub(a.Start))
		}
	}
}

// Serving nothing. A target that has served nothing lately gets no
// retries or hedges (a first attempt is never refused for it: refusing it
// would cost what no retries would have had). The breaker itself opens
// only when its whole window (10 s by default) holds failures; this stops
// the retries of a dead target's callers sooner, so that the hop next to
// it refuses, and says so to the hops above. The evidence, failed
// attempts and no success in the endpoint table's window (the last 3 to
// 4 seconds):
const (
	// nothingAtEndpoint: one endpoint of the target, judged alone (an open
	// breaker lets a first attempt through to its pick, avoiding such
	// endpoints: see guardPick).
	nothingAtEndpoint = 1
	// nothingWhenDue: a retry or a hedge is refused when it is due. While
	// no endpoint is known, the breaker's window stands in.
	nothingWhenDue = 3
	// nothingBeforeBackoff: a retry is refused before its backoff, so that
	// its caller does not wait for it. More than when it is due, because
	// a fresh client's first callers may see a few failures before any
	// success has come back, and their retries must then wait for the
	// successes, not be refused.
	nothingBeforeBackoff = 10
)

// servesNothing judges whether the target has served nothing lately, on
// the evidence least asks (one of the thresholds above), or, when at is
// not nil, whether its endpoint at has. While fewer endpoints have
// answered than the channel was given (unheard), the target has not
// served nothing for sure: a fresh channel's first failures may all come
// from the one endpoint that was ready first.
func (g *gate) servesNothing(now time.Time, least int64, at net.Addr) bool {
	if at != nil {
		ok, fail := g.r.Endpoints.countsOf(at, now)
		return ok == 0 && fail >= least
	}
	if g.unheard() {
		return false
	}
	if ok, fail, known := g.r.Endpoints.totals(now); known {
		return ok == 0 && fail >= least
	}
	b := g.r.Breaker
	if b == nil || least != nothingWhenDue {
		return false
	}
	st := b.StatsAt(now)
	return st.State == breaker.StateClosed && st.Attempts >= least && st.Failures == st.Attempts
}

// unheard reports whether some of the endpoints the channel was given
// have not answered an attempt yet, as far as the endpoint table knows.
func (g *gate) unheard() bool {
	return g.Resolved != nil && g.Resolved.Endpoints() > g.r.Endpoints.seen()
}

// servedLately reports whether the target answered an attempt with
// success lately: in the last one to two seconds of its endpoints'
// window, or, while no endpoint is known, in its breaker's window.
func (g *gate) servedLately(now time.Time) bool {
	if served, known := g.r.Endpoints.servedRecently(now); known {
		return served
	}
	if b := g.r.Breaker; b != nil {
		st := b.StatsAt(now)
		return st.Attempts > st.Failures
	}
	return false
}
