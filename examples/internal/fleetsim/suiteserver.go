package fleetsim

import (
	"time"

	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/overload"
)

// suiteServer is the suite's server (interceptor.NewServer() as it comes)
// in front of one backend's handler, for its one method, as its
// admitAndHandle runs: the library's overload protection
// (deadline-aware admission, retry-aware shedding, and at an engaged
// adaptive limit the queue where first attempts wait for a place)
// decides, then the method's retry budget (budget.Method, which charges
// every retry whoever sends it: the suite's clients' "budgeted" header
// buys nothing from a server that does not trust them, and the default
// trusts nobody); a refusal is answered with the status and pushback the
// interceptor sends.
type suiteServer struct {
	guard  *overload.Method
	budget *budget.Method
}

// PolicySuiteServer is the suite's server with its defaults.
func PolicySuiteServer() *ServerPolicy {
	return &ServerPolicy{Key: "suite", Name: "stormguard server",
		New: func(*Env, int) Server {
			return &suiteServer{
				guard:  overload.New(overload.Config{}).Method("/echo.v1.EchoService/Put"),
				budget: budget.NewMethod(budget.New(budget.Config{})), // the default registry's For(method)
			}
		}}
}

// clientOf is the number the server's budget tells the call's client by:
// the interceptor's is a hash of the caller's address, one per client
// connection, and each client of the fleet has its own connection to each
// backend.
func clientOf(c *Call) uint64 { return uint64(c.Client) }

// Admit is the interceptor's admitAndHandle up to the handler: the
// overload admission (every call here carries its deadline), which may
// hold a first attempt in its queue (see Decide), then the retry budget.
func (s *suiteServer) Admit(c *Call, now time.Time, retry, _ bool) (Admission, Outcome) {
	t, d := s.guard.AdmitAt(now, overload.Request{Deadline: c.Deadline, Retry: retry})
	c.ov, c.asRetry = t, retry
	if d.Reason == overload.Queued {
		return Held, Outcome{}
	}
	return s.decided(c, now, d, retry)
}

// Decide is the queued call's Ticket.Wait, at now: still waiting, or
// given a place (then the retry budget), or refused for its deadline.
func (s *suiteServer) Decide(c *Call, now time.Time) (Admission, Outcome) {
	d, err := c.ov.WaitAt(now)
	switch {
	case err != nil: // its caller has left (the kernel asks before then)
		s.budget.DoneAt(now, true)
		return Refused, Outcome{Code: DeadlineExceeded, Pushback: NoPushback}
	case d.Reason == overload.Queued:
		return Held, Outcome{}
	}
	return s.decided(c, now, d, false)
}

// Leave is the waiting call's caller leaving at now: Ticket.Wait returns
// its context's error, and the interceptor counts the call as one the
// method failed.
func (s *suiteServer) Leave(c *Call, now time.Time) {
	c.ov.WaitAt(now)
	s.budget.DoneAt(now, true)
}

// decided goes on from the overload protection's decision d on the
// attempt at now: a refusal is answered (and counted as a failure of the
// method), an admission goes to the retry budget, which deposits a first
// attempt and charges a retry (refused, "do not retry", when the method
// fails and the budget cannot pay).
func (s *suiteServer) decided(c *Call, now time.Time, d overload.Decision, retry bool) (Admission, Outcome) {
	switch d.Reason {
	case overload.Admitted:
	case overload.RefusedDeadline:
		s.budget.DoneAt(now, true)
		return Refused, Outcome{Code: DeadlineExceeded, Pushback: DoNotRetry}
	case overload.ShedRetry:
		s.budget.DoneAt(now, true)
		return Refused, Outcome{Code: Unavailable, Pushback: DoNotRetry}
	default:
		s.budget.DoneAt(now, true)
		return Refused, Outcome{Code: Unavailable, Pushback: d.RetryAfter}
	}
	client := clientOf(c)
	if retry {
		client = 0 // the interceptor asks about a retry without its client
	}
	if !s.budget.AdmitAt(now, retry, client) {
		c.ov.DiscardAt(now)
		return Refused, Outcome{Code: Unavailable, Pushback: DoNotRetry}
	}
	return Admitted, Outcome{}
}

// Done reports how the handler ended: the budget's outcome, and for a
// failure whether the budget would pay for a retry of it (PromiseAt, as
// the interceptor's ended asks: stormguard-budget-dry if not), then the
// interceptor's release (a success is learned, a failure discarded).
func (s *suiteServer) Done(c *Call, now time.Time, code Code, _ bool) bool {
	failed := serverFailure(code)
	s.budget.DoneAt(now, failed)
	dry := failed && !s.budget.PromiseAt(now, c.asRetry)
	if code == OK {
		c.ov.DoneAt(now)
	} else {
		c.ov.DiscardAt(now)
	}
	return dry
}

// serverFailure is the interceptor's: whether an attempt's code says the
// method failed its caller (every code the model answers but OK).
func serverFailure(c Code) bool {
	switch c {
	case Unavailable, ResourceExhausted, DeadlineExceeded:
		return true
	}
	return false
}
