package fleetsim

import (
	"time"

	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/internal/window"
)

// INTERIM: the server's per-method retry budget is unexported
// (interceptor/server_budget.go, methodBudget). Its payment is the
// library's budget.Budget, called here as the interceptor calls it; the
// judgement around it (is the method failing more than the ratio of its
// recent calls? a budgeted retry that cannot be paid for is served and
// counted) is transcribed below. The grpc-free, explicit-time form of that
// decision in package budget replaces serverBudget: suiteServer then
// calls it in Admit and Done instead, and nothing else changes.

// The server budget's window (interceptor/server_budget.go): the method's
// outcomes of the last 3 to 4 s, judged from 10 of them.
const (
	sbSlots   = 4
	sbSlot    = time.Second
	sbMinSeen = 10
)

// serverBudget is one method's retry budget on one server.
type serverBudget struct {
	b        *budget.Budget
	outcomes *window.Counter // served, failed
	ratio    float64
}

func newServerBudget() *serverBudget {
	return &serverBudget{b: budget.New(budget.Config{}), outcomes: window.New(sbSlots, 2, sbSlot), ratio: budget.DefaultRatio}
}

// admit is methodBudget.admit: a first attempt deposits; a retry is
// withdrawn while the method fails, and refused when the budget cannot
// pay for it unless its client's own budget did.
func (s *serverBudget) admit(now time.Time, retry, budgeted bool) bool {
	if !retry {
		s.b.DepositAt(now)
		return true
	}
	if !s.failing(now) {
		return true
	}
	return s.b.WithdrawAt(now) || budgeted
}

// failing is methodBudget.failing: more than ratio of the recent calls
// failed, with at least sbMinSeen of them.
func (s *serverBudget) failing(now time.Time) bool {
	ok, failed := s.outcomes.Counts(now.UnixNano())
	return ok+failed >= sbMinSeen && float64(failed) > s.ratio*float64(ok+failed)
}

// done is methodBudget.done: how an attempt of the method ended (the
// codes a client's breaker counts are failures).
func (s *serverBudget) done(now time.Time, failed bool) {
	kind := 0
	if failed {
		kind = 1
	}
	s.outcomes.Add(now.UnixNano(), kind, 1)
}
