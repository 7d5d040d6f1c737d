package interceptor

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/internal/codename"
	"github.com/stormguard/stormguard/internal/engine"
	"github.com/stormguard/stormguard/semconv"
)

// What a decision leaves behind: the status the caller gets (annotated
// when the refusal table says so), the span events, the metrics, the
// hooks, the server's don't-retry marker, and, when the call is over, its
// own span and metrics.

// conclude ends the call with the failed attempt's error err, no retry
// following for reason ("" when the caller left): it records the refusal
// (event, metric, and the server's don't-retry marker) and annotates the
// status when the table says so.
func (c *call) conclude(reason Reason, err error) error {
	if reason != "" {
		c.refuse(reason, semconv.EventRetryRefused)
	}
	return annotate(err, reason, c.client.o.noMarker)
}

// notSent ends the call when an attempt was refused before it was sent:
// a first attempt fails with the gate's status; a retry (and the first
// attempt of a try that came back, refused as a retry) returns the last
// attempt's error, annotated.
func (c *call) notSent(reason Reason, err error) error {
	if c.e.Sent() == 0 && (c.back == nil || err != nil) {
		c.refuse(reason, reason.info().firstEvent)
		return err
	}
	c.refuse(reason, semconv.EventRetryRefused)
	return annotate(c.lastErr, reason, c.client.o.noMarker)
}

// refuse records that a retry, a hedge or a call was refused.
func (c *call) refuse(reason Reason, event string) {
	var span trace.Span
	if c.recording {
		span = c.span
	}
	recordRefusal(c.ctx, c.client, c.route, span, RefusalEvent{Reason: reason, Event: event, Attempts: c.e.Sent(), Err: c.lastErr})
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
		span.AddEvent(e.Event, trace.WithAttributes(semconv.AttrReason.String(string(e.Reason))))
	}
	if e.Reason.info().propagates {
		markRefused(ctx)
	}
	if e.Reason.info().annotates {
		recordOn(ctx, e.Reason)
	}
}

// refusalHook calls the OnRefusal hook with e, on the call's goroutine.
func refusalHook(cl *Client, r *route, e RefusalEvent) {
	if cl.o.hooks.OnRefusal != nil {
		e.Method, e.Target = r.method, r.target
		callHook(cl, "OnRefusal", cl.o.hooks.OnRefusal, e)
	}
}

// wouldRefuse records, in shadow mode, a refusal the budget or the breaker
// would have made.
func (c *call) wouldRefuse(reason Reason) {
	c.client.tel.wouldRefuse.Add(c.ctx, 1, c.route.tel.wouldRefuseOpts(reason)...)
	c.event(semconv.EventWouldRefuse, semconv.AttrReason.String(string(reason)))
}

// scheduled records a retry decided after the failure err (trailer tr),
// with its delay and whether it is a fail-over (v).
func (c *call) scheduled(v engine.Verdict, err error, tr metadata.MD) {
	if c.client.o.hooks.OnRetry != nil {
		callHook(c.client, "OnRetry", c.client.o.hooks.OnRetry, RetryEvent{Method: c.route.method, Target: c.route.target, Attempt: c.e.Sent() + 1, Delay: v.Delay, Err: err})
	}
	if !c.recording {
		return
	}
	attrs := []attribute.KeyValue{semconv.AttrCause.String(codename.Name(status.Code(err))), semconv.AttrDelay.Float64(v.Delay.Seconds())}
	if v.Failover {
		attrs = append(attrs, semconv.AttrFailover.Bool(true))
	}
	if vs := tr[semconv.PushbackKey]; len(vs) == 1 {
		attrs = append(attrs, semconv.AttrPushback.String(vs[0]))
	}
	c.span.AddEvent(semconv.EventRetryScheduled, trace.WithAttributes(attrs...))
}

// event adds a decision event to the call span.
func (c *call) event(name string, attrs ...attribute.KeyValue) {
	if c.recording {
		c.span.AddEvent(name, trace.WithAttributes(attrs...))
	}
}

// endCall records the call's outcome and ends its span. A try that came
// back is not another logical call: the calls and the call duration count
// its logical call's first try only.
func (c *call) endCall(err error) {
	st, _ := status.FromError(err)
	code := st.Code()
	if p := &c.route.eng.Probes; err == nil && p.Locked() {
		p.Heal(c.client.now())
	}
	t, rt := c.client.tel, c.route.tel
	if c.back == nil {
		t.calls.Add(c.ctx, 1, rt.callOpts(code)...)
	}
	if c.back == nil && t.duration.Enabled(c.ctx) {
		t.duration.Record(c.ctx, c.client.now().Sub(c.e.Start()).Seconds(), rt.durationOpts(code)...)
	}
	if n := c.e.Retries(); n > 0 {
		t.retries.Record(c.ctx, int64(n), rt.perCallOpts()...)
	}
	if n := c.e.Hedges(); n > 0 {
		t.hedges.Record(c.ctx, int64(n), rt.perCallOpts()...)
	}
	if c.recording {
		switch {
		case c.e.Rule.FromServiceConfig:
			c.span.SetAttributes(semconv.AttrServiceConfig.String(scApplied))
		case c.scIgnored != "":
			c.span.SetAttributes(semconv.AttrServiceConfig.String(c.scIgnored))
		}
	}
	if c.e.Retries() > 0 || c.e.Hedges() > 0 {
		t.retryDelay.Record(c.ctx, c.e.Idle().Seconds(), rt.perCallOpts()...)
	}
	endSpan(c.span, code, st.Message())
}

// reasonOf is the Reason the engine's refusal r shows.
func reasonOf(r engine.Reason) Reason { return Reason(r.String()) }

// timeoutError is the status of an attempt that ran past its per-attempt
// timeout.
func (c *call) timeoutError() error {
	return status.Errorf(codes.DeadlineExceeded, "stormguard: no answer within the per-attempt timeout (%v)", c.route.eng.PerAttempt)
}
