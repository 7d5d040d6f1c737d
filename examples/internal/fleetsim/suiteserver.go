package fleetsim

import (
	"time"

	"github.com/stormguard/stormguard/overload"
)

// suiteServer is the suite's server (interceptor.NewServer() as it comes)
// in front of one backend's handler, for its one method: the library's
// overload protection (deadline-aware admission, retry-aware shedding)
// decides on arrival, then the method's retry budget (interim: see
// serverbudget_interim.go); a refusal is answered at once with the status
// and pushback the interceptor sends.
type suiteServer struct {
	guard  *overload.Method
	budget *serverBudget
}

// PolicySuiteServer is the suite's server with its defaults; with
// noBudget, without its retry budget (interceptor.WithServerBudget(nil)).
func PolicySuiteServer() *ServerPolicy {
	return &ServerPolicy{Key: "suite", Name: "stormguard server",
		New: func(*Env, int) Server {
			return &suiteServer{guard: overload.New(overload.Config{}).Method("/echo.v1.EchoService/Put"), budget: newServerBudget()}
		}}
}

// Admit is the interceptor's admitAndHandle up to the handler: the
// overload admission (every call here carries its deadline), then the
// retry budget.
func (s *suiteServer) Admit(c *Call, now time.Time, retry, budgeted bool) (bool, Outcome) {
	t, d := s.guard.AdmitAt(now, overload.Request{Deadline: c.Deadline, Retry: retry})
	switch d.Reason {
	case overload.Admitted:
	case overload.RefusedDeadline:
		s.budget.done(now, true)
		return false, Outcome{Code: DeadlineExceeded, Pushback: DoNotRetry}
	case overload.ShedRetry:
		s.budget.done(now, true)
		return false, Outcome{Code: Unavailable, Pushback: DoNotRetry}
	default:
		s.budget.done(now, true)
		return false, Outcome{Code: Unavailable, Pushback: d.RetryAfter}
	}
	if !s.budget.admit(now, retry, budgeted) {
		t.Discard()
		return false, Outcome{Code: Unavailable, Pushback: DoNotRetry}
	}
	c.ov = t
	return true, Outcome{}
}

// Done reports how the handler ended: the interceptor's release (a
// success is learned, a failure discarded) and the budget's outcome.
func (s *suiteServer) Done(c *Call, now time.Time, code Code, _ bool) {
	s.budget.done(now, failure(code))
	if code == OK {
		c.ov.DoneAt(now)
	} else {
		c.ov.Discard()
	}
}
