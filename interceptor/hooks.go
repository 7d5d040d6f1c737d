package interceptor

import (
	"log/slog"
	"time"

	"github.com/stormguard/stormguard/breaker"
)

// Hooks are callbacks for the Client's decisions, for logs, audits and
// tests. They are called synchronously, on the goroutine of the call (the
// breaker's from the goroutine whose report changed its state), so they
// must be fast and safe for concurrent use; they must not block. The zero
// Hooks calls nothing.
type Hooks struct {
	// OnRetry is called when a retry has been decided, before its backoff.
	// It may still be refused when it is due (the breaker, the budget, the
	// deadline): OnRefusal then follows.
	OnRetry func(RetryEvent)
	// OnRefusal is called when a retry, a hedge or a call is refused.
	OnRefusal func(RefusalEvent)
	// OnBreakerChange is called after a target's breaker changed state.
	// It is not called for breakers given with WithBreakers (set their
	// Config.OnStateChange instead).
	OnBreakerChange func(target string, from, to breaker.State)
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
	Event    string // EventRetryRefused, EventHedgeRefused, EventBreakerRejected, EventDeadlineFast or EventTimeoutKept
	Attempts int    // attempts of the call sent so far
	Err      error  // the last attempt's status (nil when none was sent, and for EventTimeoutKept: the attempt runs on)
}

func (c *Client) logger() *slog.Logger {
	if c.o.logger != nil {
		return c.o.logger
	}
	return slog.Default()
}
