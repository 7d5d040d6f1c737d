package interceptor

import (
	"context"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/internal/codename"
)

// MaxPushback is the longest grpc-retry-pushback-ms delay the client
// honours: a server asking for a longer wait is taken to mean "do not
// retry", so that a call without a deadline never sleeps for days on a
// server's word.
const MaxPushback = time.Minute

// verdict is what the loop makes of a finished attempt.
type verdict struct {
	retry  bool          // send another attempt, after delay
	delay  time.Duration // backoff or pushback
	reason Reason        // why not, when !retry ("" on success or when the caller left)
	err    error         // the attempt's error
	tr     metadata.MD   // the attempt's trailer
}

// after is the one place that turns a finished attempt into what the call
// does next: it ends the attempt (breaker, latency, span), then decides
// whether a retry may follow and after how long. It records nothing about
// the decision: a retry is recorded by the loop that sends it (scheduled),
// a refusal by conclude.
func (c *call) after(ctx context.Context, a *attempt, err error, tr metadata.MD) verdict {
	c.end(ctx, a, err, false)
	if err == nil {
		return verdict{}
	}
	c.lastErr = err
	v := verdict{err: err, tr: tr}
	v.delay, v.reason, v.retry = c.decide(ctx, err, tr, a)
	return v
}

// decide applies the retry rules, in order, to a failed attempt. A yes is
// tentative: the breaker and the budget are asked again, and a token
// withdrawn, only when the retry is sent (begin).
func (c *call) decide(ctx context.Context, err error, tr metadata.MD, a *attempt) (time.Duration, Reason, bool) {
	if ctx.Err() != nil {
		return 0, "", false // the caller is gone: nothing to decide
	}
	// A server's "do not retry" comes first: it may come with any code (a
	// stormguard server refusing on arrival answers DEADLINE_EXCEEDED),
	// and it says the attempt was not run, not that the call is settled.
	pushback, hasPushback, stop := parsePushback(tr)
	if stop || c.pushedBack {
		c.pushedBack = true // for the attempts still running (hedged calls)
		return 0, ReasonPushback, false
	}
	code := status.Code(err)
	if !c.route.retryable.Has(code) && !(a.timeout && code == codes.DeadlineExceeded) {
		return 0, ReasonCode, false
	}
	if !c.repeatable {
		return 0, ReasonNotIdempotent, false
	}
	now := c.client.now()
	c.recheckMethodConfig(now)
	if c.grpcRetry {
		return 0, ReasonGRPCRetry, false
	}
	if c.sent >= c.maxAttempts {
		return 0, ReasonMaxAttempts, false
	}
	if f := c.client.o.retryIf; f != nil && !f(ctx, c.route.method, err) {
		return 0, ReasonRetryIf, false
	}
	delay := pushback
	if hasPushback {
		c.backoffN = 0
	} else {
		delay = c.backoff()
	}
	if c.hasDeadline && !now.Add(delay).Before(c.deadline) {
		return 0, ReasonDeadline, false
	}
	c.failOver(a, now)
	if reason := c.fundable(now); reason != "" {
		return 0, reason, false
	}
	return delay, "", true
}

// fundable returns why a retry or hedge could not be paid for now (the
// breaker is open, or the budget has no token), or "" if it could. It
// withdraws nothing (begin does, when the attempt is sent), so that a
// caller is not made to wait a backoff for a retry that is refused anyway;
// a refusal is counted by the budget as the withdrawal it stands for.
// In shadow mode it refuses nothing: begin records what it would refuse,
// when the retry is due.
func (c *call) fundable(now time.Time) Reason {
	switch {
	case c.client.o.shadow:
		return ""
	case c.route.breaker != nil && (c.route.breaker.RetryAfterAt(now) > 0 || c.deadForSure(now)):
		return ReasonBreaker
	case c.route.budget != nil && !c.failover && !c.prepaid && !c.route.budget.PeekAt(now):
		return ReasonBudget
	}
	return ""
}

// failOver decides whether the retry after attempt a is a fail-over: a
// failed on an endpoint that fails while the target's other endpoints
// serve (see endpoints.outliers). Every attempt avoids such endpoints, so
// a fail-over retry goes to one that serves: it is not added load on a
// failing service, and the budget does not pay for it; the breaker and the
// attempt limit still apply. If its picks all go to endpoints it avoids
// (grpc has no other endpoint ready), it fails over to nothing: the budget
// pays for it at the pick, or it is not sent (see attemptCreds), and
// attempts avoid nothing for a while (endpoints.nowhereElse).
func (c *call) failOver(a *attempt, now time.Time) {
	c.failover = false
	if c.client.o.noFailover {
		return
	}
	p := a.peer()
	c.avoid = c.route.endpoints.current(now)
	if p != nil && !slices.Contains(c.avoid, p) {
		c.avoid = c.route.endpoints.judge(now) // this failure may make it one
	}
	c.failover = p != nil && slices.Contains(c.avoid, p)
	if p != nil {
		c.failedOn = append(c.failedOn, p)
	}
}

// minDeadForSure is the evidence fundable wants to refuse a retry at once
// because the target serves nothing: more than begin wants when the retry
// is due (minServedNothing), because a fresh client's first callers may see
// a few failures before any success has come back, and their retries must
// then wait for the successes, not be refused.
const minDeadForSure = 10

// deadForSure reports whether the target's endpoints have served nothing
// lately, with at least minDeadForSure failures: a retry would be refused
// when due, so the caller need not wait a backoff for it.
func (c *call) deadForSure(now time.Time) bool {
	ok, fail, known := c.route.endpoints.totals(now)
	return known && ok == 0 && fail >= minDeadForSure
}

// conclude ends the call with the verdict's error: it records the refusal
// (event, metric, and the server's don't-retry marker) and annotates the
// status when the table says so.
func (c *call) conclude(ctx context.Context, v verdict) error {
	if v.reason != "" {
		c.refuse(ctx, v.reason, EventRetryRefused)
	}
	return annotate(v.err, v.reason, c.client.o.noMarker)
}

// notSent ends the call when begin refused an attempt: a first attempt
// fails with begin's status; a retry (and the first attempt of a try that
// came back, refused as a retry) returns the last attempt's error,
// annotated.
func (c *call) notSent(ctx context.Context, reason Reason, err error) error {
	if c.sent == 0 && (c.back == nil || err != nil) {
		c.refuse(ctx, reason, reason.info().firstEvent)
		return err
	}
	c.refuse(ctx, reason, EventRetryRefused)
	return annotate(c.lastErr, reason, c.client.o.noMarker)
}

// refuse records that a retry, a hedge or a call was refused.
func (c *call) refuse(ctx context.Context, reason Reason, event string) {
	var span trace.Span
	if c.recording {
		span = c.span
	}
	recordRefusal(ctx, c.client, c.route, span, RefusalEvent{Reason: reason, Event: event, Attempts: c.sent, Err: c.lastErr})
}

// recordRefusal records refusal e of a call on route r: the metric, the
// event on span (nil when the call's span does not record), the marker for
// the server's don't-retry pushback, and, on the call's goroutine, the
// hook.
func recordRefusal(ctx context.Context, cl *Client, r *route, span trace.Span, e RefusalEvent) {
	noteRefusal(ctx, cl, r, span, e)
	refusalHook(cl, r, e)
}

// noteRefusal is recordRefusal but the hook: the part that may run on
// another goroutine than the call's (a per-attempt timer's).
func noteRefusal(ctx context.Context, cl *Client, r *route, span trace.Span, e RefusalEvent) {
	cl.tel.refusals.Add(ctx, 1, r.tel.refusalOpts(e.Reason)...)
	if span != nil {
		span.AddEvent(e.Event, trace.WithAttributes(AttrReason.String(string(e.Reason))))
	}
	if e.Reason.info().propagates {
		markRefused(ctx)
	}
}

// refusalHook calls the OnRefusal hook with e, on the call's goroutine.
func refusalHook(cl *Client, r *route, e RefusalEvent) {
	if cl.o.hooks.OnRefusal != nil {
		e.Method, e.Target = r.method, r.target
		cl.onRefusal(e)
	}
}

// wouldRefuse records, in shadow mode, a refusal the budget or the breaker
// would have made.
func (c *call) wouldRefuse(ctx context.Context, reason Reason) {
	c.client.tel.wouldRefuse.Add(ctx, 1, c.route.tel.wouldRefuseOpts(reason)...)
	c.event(EventWouldRefuse, AttrReason.String(string(reason)))
}

// scheduled records a retry decision.
func (c *call) scheduled(v verdict) {
	if c.client.o.hooks.OnRetry != nil {
		c.client.onRetry(RetryEvent{Method: c.route.method, Target: c.route.target, Attempt: c.sent + 1, Delay: v.delay, Err: v.err})
	}
	if !c.recording {
		return
	}
	attrs := []attribute.KeyValue{AttrCause.String(codename.Name(status.Code(v.err))), AttrDelay.Float64(v.delay.Seconds())}
	if c.failover {
		attrs = append(attrs, AttrFailover.Bool(true))
	}
	if vs := v.tr[PushbackKey]; len(vs) == 1 {
		attrs = append(attrs, AttrPushback.String(vs[0]))
	}
	c.span.AddEvent(EventRetryScheduled, trace.WithAttributes(attrs...))
}

// wait waits d (on the Client's timers) or until ctx is done.
func (c *call) wait(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		if err := ctx.Err(); err != nil {
			return status.FromContextError(err).Err()
		}
		return nil
	}
	t := c.client.newTimer(d)
	defer t.Stop()
	select {
	case <-t.C():
		return nil
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
}

// backoff returns the next exponential backoff with jitter: a random time
// in [d/2, d] with d = min(max, base·2ⁿ).
func (c *call) backoff() time.Duration {
	d := c.backoffCeil()
	c.backoffN++
	return d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
}

// parsePushback reads grpc-retry-pushback-ms from trailers: has is true for
// one value from 0 to MaxPushback (the delay); stop is true for a negative,
// malformed or larger value, or several values.
func parsePushback(tr metadata.MD) (delay time.Duration, has, stop bool) {
	vs := tr[PushbackKey]
	switch len(vs) {
	case 0:
		return 0, false, false
	case 1:
	default:
		return 0, false, true
	}
	ms, err := strconv.ParseInt(vs[0], 10, 32)
	if err != nil || ms < 0 || ms > MaxPushback.Milliseconds() {
		return 0, false, true
	}
	return time.Duration(ms) * time.Millisecond, true, false
}
