package interceptor

import (
	"context"
	"time"

	"github.com/stormguard/stormguard/semconv"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/internal/cowmap"
	"github.com/stormguard/stormguard/internal/window"
	"github.com/stormguard/stormguard/overload"
)

var errRetryBudget = overloadError(codes.Unavailable,
	"stormguard: retry refused by the server: retries and hedges of this method are over its retry budget, do not retry",
	semconv.ErrorReasonRetryBudget, nil)

// The window over which a method's recent failure share is judged: the
// last 3 to 4 s.
const (
	sbSlots   = 4
	sbSlot    = time.Second
	sbMinSeen = 10 // outcomes before the share is judged
)

// serverBudgets is the Server's retry budget: per method, the retries and
// hedges it serves are paid for by the first attempts it serves, as a
// client's budget pays for the retries it sends. It is the fleet's budget:
// it sees every client's attempts, whatever their own budgets (or none,
// for clients it does not control).
//
// It applies while the method fails more than the budget's Ratio of its
// recent calls: then the retries it gets are the ones its failures cause,
// and what the budget refuses is answered at once, before the handler,
// with "do not retry". While the method serves, its retries are fail-overs
// from other servers (or the odd retry of a transient failure) and are
// served: refusing them would cost the callers what a healthy server can
// give.
type serverBudgets struct {
	reg   *budget.Registry
	ratio float64
	m     cowmap.Map[string, *methodBudget]
	other *methodBudget // every method beyond maxRoutes
}

// methodBudget is one method's retry budget and its recent outcomes.
type methodBudget struct {
	b        *budget.Budget
	outcomes *window.Counter // served, failed
	ratio    float64
}

func newServerBudgets(reg *budget.Registry, ratio float64) *serverBudgets {
	if reg == nil {
		return nil
	}
	s := &serverBudgets{reg: reg, ratio: ratio}
	s.m.Max = maxRoutes
	s.other = s.newMethod(otherMethodSemconv)
	return s
}

func (s *serverBudgets) newMethod(method string) *methodBudget {
	return &methodBudget{b: s.reg.For(method), outcomes: window.New(sbSlots, 2, sbSlot), ratio: s.ratio}
}

// forMethod returns method's budget (nil when the Server has none).
func (s *serverBudgets) forMethod(method string) *methodBudget {
	if s == nil {
		return nil
	}
	if mb, ok := s.m.Load(method); ok {
		return mb
	}
	if s.m.Len() >= maxRoutes {
		return s.other
	}
	return s.m.LoadOrCreate(method, s.newMethod)
}

// admit decides an attempt of the method arriving at now: a first attempt
// is counted (it pays for the retries to come), a retry or hedge is
// withdrawn while the method fails more than the ratio. It reports false
// for a retry the budget refuses. A retry whose client's own budget bounds
// it (budgeted: the suite's clients say so) is withdrawn when the budget
// can pay for it and served when it cannot: it is counted, so that the
// retries of other clients get only what is left.
func (mb *methodBudget) admit(now time.Time, retry, budgeted bool) bool {
	if mb == nil {
		return true
	}
	if !retry {
		mb.b.DepositAt(now)
		return true
	}
	if !mb.failing(now) {
		return true
	}
	return mb.b.WithdrawAt(now) || budgeted
}

// isBudgeted reports whether a retry arriving with ctx says its client's
// own budget bounds it (the caller's word, as its attempt number is).
func isBudgeted(ctx context.Context) bool {
	vs := metadata.ValueFromIncomingContext(ctx, semconv.BudgetedKey)
	return len(vs) == 1 && vs[0] == "1"
}

// failing reports whether the method failed more than the ratio of its
// recent calls (with at least sbMinSeen of them).
func (mb *methodBudget) failing(now time.Time) bool {
	ok, failed := mb.outcomes.Counts(now.UnixNano())
	return ok+failed >= sbMinSeen && float64(failed) > mb.ratio*float64(ok+failed)
}

// done records how an admitted attempt of the method ended.
func (mb *methodBudget) done(now time.Time, err error) {
	if mb == nil {
		return
	}
	if serverFailure(err) {
		mb.outcomes.Add(now.UnixNano(), 1, 1)
	} else {
		mb.outcomes.Add(now.UnixNano(), 0, 1)
	}
}

// serverFailure reports whether a handler's error says the method failed
// (not that the call was bad): the codes a client's breaker counts.
func serverFailure(err error) bool {
	if err == nil {
		return false
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.ResourceExhausted, codes.Internal:
		return true
	}
	return false
}

// isRetry reports whether the call arriving with ctx says it is a retry or
// a hedge (gRFC A6's grpc-previous-rpc-attempts; the caller's word).
func isRetry(ctx context.Context) bool {
	return overload.IsRetry(metadata.ValueFromIncomingContext(ctx, semconv.PreviousAttemptsKey))
}

// refuseRetry answers a retry the method's budget refused: do not retry.
func refuseRetry(ctx context.Context) error {
	_ = grpc.SetTrailer(ctx, dontRetry)
	return errRetryBudget
}
