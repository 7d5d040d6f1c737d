package engine

import "time"

// Next is what a call does after an attempt.
type Next uint8

// What a call does next.
const (
	// Done: the call is over, with the attempt's answer (refused, when
	// Verdict.Reason says why no retry followed).
	Done Next = iota
	// Again: a retry is sent after Verdict.Delay (the admission is asked
	// again then: Open).
	Again
	// Wait: other attempts of the call still run; nothing more is sent,
	// and the call waits for them (Verdict.Reason says why).
	Wait
)

// Verdict is what the step makes of a finished attempt.
type Verdict struct {
	Next   Next
	Delay  time.Duration // Again: the backoff or the server's delay
	Reason Reason        // why no retry follows ("" on success, or when the caller left)
	// Failover: the retry is a fail-over from an endpoint that fails
	// while the others serve.
	Failover bool
}

// skipTime asks peek not to judge time left: the rules did.
const skipTime time.Duration = -1

// Step takes attempt a, which ended with o, to what the call does next:
// the one place where a finished attempt turns into the call's answer, a
// refusal, or a retry after a delay. It learns from the attempt (what the
// admission judges with), then, for a failure, applies the rules and asks
// the admission whether the retry could be paid for now, so that a caller
// does not wait a backoff for a retry refused anyway. others is how many
// other attempts of the call still run (a hedged call's): while some do, a
// refusal that does not settle the call waits for them, and a retry is
// sent at once. Nothing is taken for the retry: Open does, when it is due.
// a is nil when the attempt was ended already (End).
func (c *Call) Step(h Host, a *Attempt, o *Outcome, others int) Verdict {
	if a != nil {
		c.learn(a, o, false)
	}
	c.live--
	if o.Code == OK {
		return Verdict{}
	}
	if c.live == 0 {
		c.idleFrom = o.At
	}
	c.r.Yield.overloaded(o)
	if o.CallerLeft {
		return Verdict{} // the caller is gone: nothing to decide
	}
	p := c.judge(h, o)
	switch {
	case p.reason == 0 && others > 0:
		return Verdict{Next: Again, Failover: c.pay == payFailover}
	case p.reason == 0:
		return Verdict{Next: Again, Delay: p.delay, Failover: c.pay == payFailover}
	case others > 0 && !p.reason.settles():
		return Verdict{Next: Wait, Reason: p.reason}
	}
	return Verdict{Reason: p.reason}
}

// judge runs the rules on failure o, in order, with the operator's
// configuration read again where they need it, applies what they say
// (the server's "do not retry" holds for the attempts still running; the
// throttle counts the failure; the backoff grows, or restarts after a
// server's delay; the retry may be a fail-over), and asks the admission.
func (c *Call) judge(h Host, o *Outcome) ruling {
	if o.Pushback.Stop || c.stopped {
		c.stopped = true
		return ruling{reason: ReasonPushback}
	}
	h.Refresh(o.At, false)
	if p := c.eligible(o); p.reason != 0 {
		return p
	}
	if c.Throttle != nil {
		c.Throttle.Failure()
	}
	h.Refresh(o.At, true)
	p := c.decide(h, o)
	c.stopped = c.stopped || p.stop
	switch {
	case p.pushed:
		c.backoffN = 0
	case p.backedOff:
		c.backoffN++
	}
	if p.reason != 0 {
		return p
	}
	c.failOver(o)
	if o.BudgetDry && c.dryEverywhere(o) && c.r.stands(ReasonBudget) {
		// A dry answer with nowhere else to go: the retry is refused,
		// for the budget unless the admission refuses it for another
		// reason first (a target that serves nothing: the breaker). The
		// budget is not asked (payFailover): it would count the refusal
		// as demand.
		if p.reason = c.peek(o.At, Retry, false, skipTime, nothingBeforeBackoff, payFailover); p.reason == 0 {
			p.reason = ReasonBudget
		}
		return p
	}
	p.reason = c.peek(o.At, Retry, false, skipTime, nothingBeforeBackoff, c.pay)
	return p
}

// End ends attempt a, which came back with o, without a decision: a
// stream's attempt when the stream ends, or a hedged call's attempt that
// lost (abandoned: cancelled because another won, which says nothing
// about the target). The admission learns from it.
func (c *Call) End(a *Attempt, o *Outcome, abandoned bool) { c.learn(a, o, abandoned) }

// Watched counts, at now, a call whose first attempt a hedge's timer
// watches (see Yield).
func (c *Call) Watched(now time.Time) { c.r.Yield.watched(now) }

// Late counts, at now, a watched call whose first attempt ran past its
// delay: the timer that watched it fired (see Yield).
func (c *Call) Late(now time.Time) { c.r.Yield.late(now) }

// Peek reports why an attempt of kind k could not be sent at now, or ""
// when it could; beside marks a retry sent beside a slow attempt. Nothing
// is taken: Open takes.
func (c *Call) Peek(now time.Time, k Kind, beside bool) Reason {
	return c.peek(now, k, beside, 0, nothingWhenDue, c.pay)
}
