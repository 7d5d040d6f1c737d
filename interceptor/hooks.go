package interceptor

import (
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/stormguard/stormguard/breaker"
)

// Hooks are callbacks for the Client's decisions, for logs, audits and
// tests. They are called synchronously, so they must be fast and safe for
// concurrent use; they must not block. OnRetry and OnRefusal run on the
// goroutine of the call; OnBreakerChange on the goroutine that changed the
// breaker's state (see there). The zero Hooks calls nothing.
//
// A hook that panics does not disturb the call or the Client: the panic is
// recovered where the hook was called, logged (level Error, with the
// stack, on Telemetry.Logger), and the call goes on as if the hook had
// returned. A hook may run where a panic could not be handed to the
// caller (OnBreakerChange on the Client's own timers, say), and a panic
// half-way through a decision would leave the call's state inconsistent:
// so no hook's panic ever leaves the Client.
type Hooks struct {
	// OnRetry is called when a retry has been decided, before its backoff.
	// It may still be refused when it is due (the breaker, the budget, the
	// deadline): OnRefusal then follows.
	OnRetry func(RetryEvent)
	// OnRefusal is called when a retry, a hedge or a call is refused. For a
	// retry refused at a per-attempt timeout (semconv.EventTimeoutKept) of an
	// attempt the call waits for (a reply that is not a proto message), it
	// is called once that attempt has returned.
	OnRefusal func(RefusalEvent)
	// OnBreakerChange is called after the breaker of a target's method
	// changed state, on the goroutine whose admission or report changed
	// it: usually a call's, sometimes the goroutine of the Client's
	// per-attempt timer, of the watcher that ends a stream whose caller
	// left, or of a metrics collection (the breaker-state gauge).
	OnBreakerChange func(BreakerEvent)
}

// BreakerEvent describes a change of state of the breaker of one method of
// a target (breakers are per target and method: see WithBreaker).
type BreakerEvent struct {
	Target   string // the target, canonical ("dns:///host:port" for "host:port")
	Method   string // "/pkg.Svc/Method"
	From, To breaker.State
}

// RetryEvent describes a retry the Client decided to send.
type RetryEvent struct {
	Method  string        // "/pkg.Svc/Method"
	Target  string        // the ClientConn's target, or its name (WithTargetName)
	Attempt int           // the retry's number among the call's attempts, from 2
	Delay   time.Duration // the backoff or pushback before it
	Err     error         // the failed attempt's status
}

// RefusalEvent describes a retry, hedge or call the Client refused.
type RefusalEvent struct {
	Method   string
	Target   string
	Reason   Reason
	Event    string // semconv.EventRetryRefused, semconv.EventHedgeRefused, semconv.EventBreakerRejected, semconv.EventDeadlineFast or semconv.EventTimeoutKept
	Attempts int    // attempts of the call sent so far
	Err      error  // the last attempt's status (nil when none was sent, and for semconv.EventTimeoutKept: the attempt runs on)
}

func (c *Client) logger() *slog.Logger {
	if c.o.logger != nil {
		return c.o.logger
	}
	return slog.Default()
}

// hookPanicked logs the panic v of the hook named hook, recovered where
// the Client called it (see Hooks).
func (c *Client) hookPanicked(hook string, v any) {
	c.logger().Error("stormguard: a hook panicked; the Client recovered the panic and went on",
		"hook", hook, "panic", v, "stack", string(debug.Stack()))
}

// callHook calls the hook h named name with e, if h is set, recovering
// and logging a panic (see Hooks): a hook that runs inside the breaker
// (OnBreakerChange) or half-way through a decision must not leave a panic
// behind.
func callHook[E any](c *Client, name string, h func(E), e E) {
	if h == nil {
		return
	}
	defer func() {
		if v := recover(); v != nil {
			c.hookPanicked(name, v)
		}
	}()
	h(e)
}

// recoverOwn recovers, on a goroutine the Client owns (a timer, a
// watcher), a panic of code it does not control that reached it (the
// callback of its breakers), and logs it: no panic
// may end the process from a goroutine the caller does not own.
func (c *Client) recoverOwn(where string) {
	if v := recover(); v != nil {
		c.logger().Error("stormguard: recovered a panic on the Client's own goroutine",
			"where", where, "panic", v, "stack", string(debug.Stack()))
	}
}
