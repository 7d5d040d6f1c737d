package interceptor

import (
	"context"
	"hash/maphash"
	"net"
	"time"

	"github.com/stormguard/stormguard/semconv"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/internal/cowmap"
	"github.com/stormguard/stormguard/overload"
)

var errRetryBudget = overloadError(codes.Unavailable,
	"stormguard: retry refused by the server: retries and hedges of this method are over its retry budget, do not retry",
	semconv.ErrorReasonRetryBudget, nil)

// serverBudgets is the Server's retry budget: one budget.Method per
// method, each paying for the retries and hedges it serves with the first
// attempts it serves (see budget.Method), its Budget from the registry.
// It is the fleet's budget: it sees every client's attempts, whatever
// their own budgets (or none, for clients it does not control).
type serverBudgets struct {
	reg   *budget.Registry
	m     cowmap.Map[string, *budget.Method]
	other *budget.Method // every method beyond maxRoutes
}

func newServerBudgets(reg *budget.Registry) *serverBudgets {
	if reg == nil {
		return nil
	}
	s := &serverBudgets{reg: reg}
	s.m.Max = maxRoutes
	s.other = s.newMethod(otherMethodSemconv)
	return s
}

func (s *serverBudgets) newMethod(method string) *budget.Method {
	return budget.NewMethod(s.reg.For(method))
}

// forMethod returns method's budget (nil when the Server has none: a nil
// *budget.Method admits everything and records nothing).
func (s *serverBudgets) forMethod(method string) *budget.Method {
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

// admitRetry asks the method's budget about an attempt arriving with ctx
// (a retry, or a hedge, when retry says so): a first attempt pays for the
// retries to come; a retry or hedge is charged while the method fails,
// whoever sends it, and refused when the budget cannot pay, unless a
// caller the Server trusts says its own budget paid for it
// (WithTrustedBudgets).
func (s *Server) admitRetry(ctx context.Context, mb *budget.Method, retry bool) bool {
	if mb == nil {
		return true
	}
	if !retry {
		return mb.AdmitAt(time.Now(), false, clientOf(ctx))
	}
	return mb.AdmitAt(time.Now(), true, 0) || s.paidByTrusted(ctx)
}

// clientSeed keys clientOf's hash.
var clientSeed = maphash.MakeSeed()

// clientOf tells apart the clients of a method, for its budget's loans
// (see budget.Method): a hash of the caller's address, which is one per
// client connection over TCP. Callers whose addresses are alike (a Unix
// socket, an in-memory listener) are one client.
func clientOf(ctx context.Context) uint64 {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return 0
	}
	if a, ok := p.Addr.(*net.TCPAddr); ok {
		return maphash.Bytes(clientSeed, a.IP) ^ uint64(a.Port)<<48
	}
	return maphash.String(clientSeed, p.Addr.String())
}

// isBudgeted reports whether a retry arriving with ctx says its client's
// own budget paid for it (the caller's word: it buys nothing unless the
// caller is trusted).
func isBudgeted(ctx context.Context) bool {
	vs := metadata.ValueFromIncomingContext(ctx, semconv.BudgetedKey)
	return len(vs) == 1 && vs[0] == "1"
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
