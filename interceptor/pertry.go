package interceptor

import (
	"context"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/internal/engine"
	"github.com/stormguard/stormguard/semconv"
)

// Calls whose reply is a proto message are retried on a per-attempt
// timeout by the hedger, beside the slow attempt. A reply that is not (a
// custom codec fills it) cannot have two attempts in flight: such an
// attempt is cut at its per-attempt timeout, but only when a retry can
// follow it. When none can (the method may not be repeated, this is the
// last attempt allowed, the call's deadline is too close, or, when the
// timeout fires, the breaker or the budget would refuse the retry),
// cutting the attempt could only lose a reply it may still get: the
// attempt keeps running to the call's deadline, as it would with no
// retries at all. Nor is it cut while the target is overloaded (see
// yield): the retry would queue behind it.

// Per-try timer states.
const (
	ptRunning uint32 = iota // the attempt runs; the timer has not decided
	ptCut                   // the timer fired and cut the attempt: a retry follows, its token withdrawn
	ptKept                  // the timer fired, and the attempt kept running (reason says why)
	ptOver                  // the attempt ended before the timer decided
)

// perTry is the per-attempt timeout of one sequential attempt that a
// retry may follow. Its timer runs fire on another goroutine; the call
// reads the outcome with finish once the attempt has returned. It reads
// nothing of the call that the call's goroutine may write meanwhile: what
// it needs is copied in when it is made (cut: the engine's admission).
type perTry struct {
	state  atomic.Uint32
	d      time.Duration
	cancel context.CancelFunc // the attempt's
	stop   func() bool        // stops the timer
	cut    engine.Cut
	// What fire records a kept attempt with.
	ctx      context.Context // the call's
	span     trace.Span      // the call's, nil when it does not record
	client   *Client
	route    *route
	attempts int // attempts sent, this one included
	// kept is the refusal of a kept attempt (state ptKept), written by
	// fire before it sets the state; finish hands it to the OnRefusal
	// hook on the call's goroutine.
	kept RefusalEvent
}

// newPerTry arms the per-attempt timeout d of the attempt of c just
// opened at now, whose context cancel is cancel.
func (c *call) newPerTry(d time.Duration, cancel context.CancelFunc, now time.Time) *perTry {
	p := &perTry{
		d: d, cancel: cancel, ctx: c.ctx, client: c.client, route: c.route,
		cut: c.e.Cut(now), attempts: c.e.Sent(),
	}
	if c.recording {
		p.span = c.span
	}
	p.stop = c.client.afterFunc(d, p.fire)
	return p
}

// fire runs when the per-attempt timeout expires, on the timer's
// goroutine: if a retry could be sent now (the engine's admission, on the
// timer's copy: engine.Cut.Take, which withdraws the retry's token), it
// cuts the attempt; otherwise the attempt keeps running, and the refused
// retry is recorded (semconv.EventTimeoutKept; the hook is called by
// finish, on the call's goroutine).
func (p *perTry) fire() {
	defer p.client.recoverOwn("per-attempt timeout")
	if p.state.Load() != ptRunning {
		return
	}
	if reason := reasonOf(p.cut.Take(p.client.now())); reason != "" {
		e := RefusalEvent{Reason: reason, Event: semconv.EventTimeoutKept, Attempts: p.attempts}
		p.kept = e
		if p.state.CompareAndSwap(ptRunning, ptKept) {
			noteRefusal(p.ctx, p.client, p.route, p.span, e)
		}
		return
	}
	// When the attempt ended meanwhile, the token is spent for nothing:
	// the two happen at the same instant, rarely.
	if p.state.CompareAndSwap(ptRunning, ptCut) {
		p.cancel()
	}
}

// finish reads the outcome of a's per-attempt timeout once a has returned
// with err, and stops the timer. It returns the attempt's error as the
// call sees it: a cut attempt failed with DEADLINE_EXCEEDED (grpc reports
// the cancel as CANCELLED), unless the caller left or a reply came first.
func (c *call) finish(a *attempt, err error) error {
	p := a.pt
	p.stop()
	if p.state.CompareAndSwap(ptRunning, ptOver) {
		return err
	}
	switch p.state.Load() {
	case ptKept:
		refusalHook(c.client, c.route, p.kept)
		return err
	case ptOver:
		return err
	}
	if p.cut.Paid {
		c.e.Prepaid()
	}
	if err != nil && c.ctx.Err() == nil {
		return status.Errorf(codes.DeadlineExceeded, "stormguard: attempt timed out after %v", p.d)
	}
	return err
}
