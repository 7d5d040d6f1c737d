package interceptor

import (
	"context"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/internal/engine"
	"github.com/stormguard/stormguard/semconv"
)

// What happens next. A call goes through the engine (package
// internal/engine) one attempt at a time: run opens an attempt (the
// engine's admission), hands it to the call's sender (a unary invocation,
// a hedged group, a stream), and takes what came back through the one
// step (step: the engine's Step, then what its verdict leaves behind, and
// the wait before a retry). Every call shape goes through them: the
// hedged sender, which has several attempts in flight, opens and steps
// each of them with the same functions, and a stream's retry after it was
// handed to its caller too.

// sender sends the attempts of one call shape.
type sender interface {
	// attempt returns a new attempt for open to fill.
	attempt() *attempt
	// send sends attempt a, which open has admitted, and returns what came
	// back, in the sender's own outcome, which the next send overwrites.
	// It settles a pick the attempt was sent to (atPick).
	send(c *call, a *attempt) *outcome
}

// outcome is what a sender got for an attempt.
type outcome struct {
	err error
	tr  metadata.MD
	// refused: the attempt was refused at its pick, never sent (atPick);
	// err is the status a first attempt fails with.
	refused Reason
	// kept: the attempt stays open (a stream handed to the caller), and
	// is ended later by its sender.
	kept bool
	// settled: the sender settled the call itself (a hedged group): err
	// is the call's.
	settled bool
}

// run is the call's loop: it sends the call's attempts through s, from
// one of the given kind, until one succeeds, is kept, or no retry may
// follow, and returns the call's error.
func (c *call) run(s sender, kind engine.Kind, mode attemptMode) error {
	for {
		a := s.attempt()
		if reason, err := c.open(a, kind, mode); reason != "" {
			return c.notSent(reason, err)
		}
		out := s.send(c, a)
		switch {
		case out.settled:
			return out.err
		case out.refused != "":
			return c.notSent(out.refused, out.err)
		case out.kept:
			return nil
		}
		if next, err := c.step(a, out.err, out.tr, 0); next != engine.Again || err != nil {
			return err
		}
		kind = engine.Retry
	}
}

// step takes attempt a, which came back with err and trailer tr, through the engine's
// one step, while others of the call's attempts still run (a hedged
// call's): it records what the verdict leaves behind (a refusal, a retry
// scheduled) and waits a retry's delay. It returns what the call does
// next: engine.Done with the call's error, engine.Again to send a retry
// now (with an error: the caller left while the retry waited, and the
// call is over with it), or engine.Wait for the others.
func (c *call) step(a *attempt, err error, tr metadata.MD, others int) (engine.Next, error) {
	var o engine.Outcome
	c.outcome(&o, a, err, tr)
	ea := &a.Attempt
	if !a.endOnce() {
		ea = nil // ended already (a stream's, when its caller left)
	} else if a.cancel != nil || a.span != nil { // else nothing to release
		c.endAttempt(a, err)
	}
	v := c.e.Step(c, ea, &o, others)
	if err == nil {
		return engine.Done, nil
	}
	c.lastErr = err
	switch v.Next {
	case engine.Wait:
		// Refused, but others still run; one of them may succeed.
		c.refuse(reasonOf(v.Reason), semconv.EventRetryRefused)
		return engine.Wait, nil
	case engine.Done:
		return engine.Done, c.conclude(reasonOf(v.Reason), err)
	}
	c.scheduled(v, err, tr)
	return engine.Again, c.wait(v.Delay)
}

// outcome fills o with what the engine sees of attempt a, which came
// back with err and trailer tr: the code, the server's pushback and
// RetryInfo, the endpoint and the time. A success is timed only when
// something measures it (its start stands in: the breaker and the
// endpoint table count it in the slot of its start).
func (c *call) outcome(o *engine.Outcome, a *attempt, err error, tr metadata.MD) {
	o.Endpoint, o.At, o.Err = a.peer(), a.Start, err
	if err == nil {
		if a.span != nil || c.route.eng.Latency != nil || c.client.tel.durationOn(c.ctx) {
			o.At = c.client.now()
		}
		return
	}
	o.Code, o.At = engine.Code(status.Code(err)), c.client.now()
	o.CallerLeft = c.ctx.Err() != nil
	o.TimedOut = a.pt != nil && a.pt.state.Load() == ptCut
	o.Pushback = pushbackOf(tr)
	o.BudgetDry = budgetDry(tr)
	o.RetryInfo = retryInfoOf(err)
}

// end ends attempt a, which came back with err, without a decision (see
// engine.Call.End).
func (c *call) end(a *attempt, err error, abandoned bool) {
	if !a.endOnce() {
		return
	}
	var o engine.Outcome
	c.outcome(&o, a, err, nil)
	c.e.End(&a.Attempt, &o, abandoned)
	c.endAttempt(a, err)
}

// endAttempt releases attempt a's context and ends its span.
func (c *call) endAttempt(a *attempt, err error) {
	if a.cancel != nil {
		a.cancel()
	}
	if a.span == nil {
		return
	}
	code, msg := codes.OK, ""
	if err != nil {
		st := status.Convert(err)
		code, msg = st.Code(), st.Message()
		if p := a.peer(); p != nil && a.span.IsRecording() {
			a.span.SetAttributes(semconv.AttrPeer.String(p.String()))
		}
	}
	endSpan(a.span, code, msg)
}

// open opens attempt a of the given kind through the engine's admission,
// then gives it its metadata, context, span and metric. When a may not be
// sent, open returns why and the status a call refused before it sent
// anything fails with; nothing was sent and nothing was withdrawn.
func (c *call) open(a *attempt, kind engine.Kind, mode attemptMode) (Reason, error) {
	now := c.e.Start() // the first attempt starts with the call
	if c.e.Sent() > 0 {
		now = c.client.now()
	}
	a.ctx, a.cancel, a.span, a.pt, a.ended, a.creds, a.peerp = nil, nil, nil, nil, 0, nil, nil
	a.shared = mode == streamAttemptMode
	var adm engine.Admission // filled in place: no copy of it to reread
	c.e.Open(&a.Attempt, kind, now, &adm)
	if adm != (engine.Admission{}) || kind == engine.Hedge { // else admitted, nothing to record
		if reason, err := c.admitted(&a.Attempt, &adm, now); reason != "" {
			return reason, err
		}
	}
	actx := c.ctx
	if n := c.e.Prior() + c.e.Sent() - 1; n > 0 {
		actx = metadata.AppendToOutgoingContext(actx, semconv.PreviousAttemptsKey, strconv.Itoa(n))
		if a.Paid() {
			// The budget paid for this retry or hedge: a stormguard
			// server that trusts this client need not charge it to its
			// own budget again (see WithTrustedBudgets).
			actx = metadata.AppendToOutgoingContext(actx, semconv.BudgetedKey, "1")
		}
	}
	actx = c.attemptContext(actx, a, now, mode)
	if c.recording {
		ao := c.route.tel.attemptOpts(kind)
		actx, a.span = c.client.tel.tracer.Start(actx, c.route.tel.attemptSpanName(), ao.span...)
		a.span.SetAttributes(semconv.AttrPreviousAttempts.Int(c.e.Prior() + c.e.Sent() - 1))
	}
	if p := c.client.o.propagators; p != nil {
		md, ok := metadata.FromOutgoingContext(actx) // a copy
		if !ok {
			md = metadata.MD{}
		}
		p.Inject(actx, mdCarrier(md))
		actx = metadata.NewOutgoingContext(actx, md)
	}
	if !a.AtPick() && c.client.tel.metrics {
		c.client.tel.attempts.Add(c.ctx, 1, c.route.tel.attemptOpts(kind).metric...)
	}
	a.ctx = actx
	return "", nil
}

// attemptContext gives attempt a the context it needs beyond the call
// context's: the call's deadline when it was tightened after the context
// was made (a service-config timeout read late); the per-attempt timeout,
// when it is tighter and a retry may follow (see perTry); and a cancel
// when the mode needs one.
func (c *call) attemptContext(ctx context.Context, a *attempt, now time.Time, mode attemptMode) context.Context {
	var dl time.Time
	if at := c.e.Deadline; !at.IsZero() && (c.ctxAt.IsZero() || at.Before(c.ctxAt)) {
		dl = at
	}
	var perTry time.Duration
	if p := c.route.eng.PerAttempt; p > 0 && mode == plainAttempt {
		// Only a reply that is not a proto message (a custom codec) is
		// retried on a per-attempt timeout here; the others are run by
		// the hedger, which does not cancel the slow attempt.
		if at := c.e.Deadline; (at.IsZero() || now.Add(p).Before(at)) && c.e.MayFollow(c) == 0 {
			perTry = p
		}
	}
	switch {
	case perTry > 0:
		// Cut by perTry's timer, only if a retry can follow then.
		if dl.IsZero() {
			ctx, a.cancel = context.WithCancel(ctx)
		} else {
			ctx, a.cancel = context.WithDeadline(ctx, dl)
		}
		a.pt = c.newPerTry(perTry, a.cancel, now)
	case !dl.IsZero():
		ctx, a.cancel = context.WithDeadline(ctx, dl)
	case mode != plainAttempt:
		ctx, a.cancel = context.WithCancel(ctx)
	}
	return ctx
}

// wait waits d (on the Client's timers) or until the call's context is
// done.
func (c *call) wait(d time.Duration) error {
	if d <= 0 {
		if err := c.ctx.Err(); err != nil {
			return status.FromContextError(err).Err()
		}
		return nil
	}
	t := c.client.newTimer(d)
	defer t.Stop()
	select {
	case <-t.C():
		return nil
	case <-c.ctx.Done():
		return status.FromContextError(c.ctx.Err()).Err()
	}
}
