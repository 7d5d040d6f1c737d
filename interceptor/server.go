package interceptor

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/stormguard/stormguard/overload"
	"github.com/stormguard/stormguard/semconv"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/deadline"
	"github.com/stormguard/stormguard/idempotency/dedupe"
	"github.com/stormguard/stormguard/priority"
)

// Server is the suite's server side: it applies the caller's propagated
// deadline and refuses work whose deadline has already passed, deduplicates
// requests on their idempotency key, and tells callers not to retry when
// the handler failed because its own outgoing retries were refused.
//
// Create one with NewServer; a Server is safe for concurrent use.
type Server struct {
	o      serverOptions
	dl     *deadline.Server
	dedupe *dedupe.Server // nil: off
	ov     serverOverload // overload protection (server_overload.go)
	rb     *serverBudgets // the retry budget per method (server_budget.go); nil: off
	tel    *serverTelemetry
}

// NewServer returns a Server configured by opts. Nil options are ignored.
//
// By default it deduplicates keyed writes with dedupe.NewServer(dedupe.Config{}),
// which scopes idempotency keys by caller (TLS client certificate, or
// authorization metadata) and refuses a keyed request to a deduplicated
// method from a caller without identity with codes.FailedPrecondition,
// before the handler runs. A server whose callers are all trusted and
// unauthenticated (plaintext on a private network) opts in to one shared
// key space explicitly:
//
//	interceptor.NewServer(interceptor.WithDedupe(dedupe.NewServer(dedupe.Config{AllowAnonymous: true})))
func NewServer(opts ...ServerOption) *Server {
	var o serverOptions
	for _, opt := range opts {
		if opt != nil {
			opt.applyServer(&o)
		}
	}
	s := &Server{o: o, dl: deadline.NewServer(o.deadlineCfg), dedupe: o.dedupe, tel: newServerTelemetry(o.meterProvider)}
	s.ov.guard = o.overload
	if !o.overloadSet {
		s.ov.guard = overload.New(overload.Config{})
	}
	reg := o.budgets
	if !o.budgetSet {
		reg = budget.NewRegistry(budget.Config{})
	}
	s.rb = newServerBudgets(reg) // nil for a nil reg
	if !o.dedupeSet {
		s.dedupe = dedupe.NewServer(dedupe.Config{})
	}
	return s
}

// refusalMarker is put in every handler's context by the Server; a Client
// call made from that handler sets it when it refuses a retry (budget,
// breaker, pushback, attempts exhausted). The Server sets dry when the
// handler failed and the method's retry budget could not pay for a retry
// of the call (see ended).
type refusalMarker struct{ set, dry atomic.Bool }

type markerKey struct{}

// markRefused flags the handler (if ctx comes from one) as having had an
// outgoing retry refused.
func markRefused(ctx context.Context) {
	if m, ok := ctx.Value(markerKey{}).(*refusalMarker); ok {
		m.set.Store(true)
	}
}

// dontRetry is the trailer that tells callers not to retry (gRFC A6).
var dontRetry = metadata.Pairs(semconv.PushbackKey, "-1")

// dryBudget is the trailer that tells the suite's clients that the
// method's retry budget could not pay for a retry (semconv.BudgetDryKey).
var dryBudget = metadata.Pairs(semconv.BudgetDryKey, "1")

// pushback sets grpc-retry-pushback-ms: -1 on a failed response whose
// failure comes from refused retries further down, and otherwise
// stormguard-budget-dry on one whose retry the method's retry budget
// could not pay for.
func (s *Server) pushback(ctx context.Context, m *refusalMarker, err error) {
	if err == nil || s.o.noPushback {
		return
	}
	if m.dry.Load() && !m.set.Load() {
		if local, forwarded := refusalsIn(err); !local.propagates() && !forwarded.propagates() {
			_ = grpc.SetTrailer(ctx, dryBudget)
			return
		}
	}
	if m.set.Load() {
		_ = grpc.SetTrailer(ctx, dontRetry)
		return
	}
	// A refused call's error the handler returns: this process's, or one
	// forwarded from further down.
	if local, forwarded := refusalsIn(err); local.propagates() || forwarded.propagates() {
		_ = grpc.SetTrailer(ctx, dontRetry)
	}
}

// Unary returns the unary server interceptor. Its steps, in order:
//
//  1. the deadline: apply the caller's propagated deadline, and refuse a
//     call whose deadline has passed or whose caller has left; then the
//     priority the call claims, as far as WithPriorityCap honours it, is
//     put in the handler's context;
//  2. deduplication: a keyed request to a deduplicated method whose write
//     already completed is answered from the store, and one whose write
//     is in flight waits for its outcome; neither is work, so neither is
//     admitted, refused or learned from by step 3;
//  3. admission: the overload protection admits, refuses or sheds the
//     call (or, at the method's limit, makes it wait for a place, which
//     it leaves when its caller does), and learns from how the admitted
//     call ends; then the method's
//     retry budget: a first attempt pays for retries to come, and while
//     the method fails more than the budget's ratio of its calls, a retry
//     or hedge it cannot pay for is refused at once, with "do not retry";
//  4. the handler.
//
// A failure caused by refused retries downstream gets don't-retry pushback,
// and a refusal this process's Client made is sent up without its seal: a
// refusal made down the chain (see RefusedDownstream).
func (s *Server) Unary() grpc.UnaryServerInterceptor {
	var dedupe grpc.UnaryServerInterceptor
	if s.dedupe != nil {
		dedupe = s.dedupe.Unary()
	}
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		ctx, cancel, err := s.dl.Apply(ctx) // 1
		if err != nil {
			s.refused(ctx, info.FullMethod, serverDoomed)
			return nil, err
		}
		defer cancel()
		ctx = s.withPriority(ctx)
		m := &refusalMarker{}
		ctx = context.WithValue(ctx, markerKey{}, m)
		var resp any
		if dedupe != nil && s.dedupe.Deduplicates(info.FullMethod) {
			// 2, then 3 and 4 if the handler is to run.
			resp, err = dedupe(ctx, req, info, func(ctx context.Context, req any) (any, error) {
				return s.admitAndHandle(ctx, req, info.FullMethod, handler)
			})
			s.refusedByDedupe(ctx, info.FullMethod, err)
		} else {
			resp, err = s.admitAndHandle(ctx, req, info.FullMethod, handler)
		}
		s.pushback(ctx, m, err)
		return resp, unseal(err)
	}
}

// admitAndHandle runs the overload admission of a unary call of method
// (step 3 of Unary), then, if admitted, its handler (step 4), and reports
// how the call ended to the protection.
func (s *Server) admitAndHandle(ctx context.Context, req any, method string, handler grpc.UnaryHandler) (resp any, err error) {
	retry := isRetry(ctx)
	mb := s.rb.forMethod(method)
	p, _ := priority.FromContext(ctx)
	t, err := s.admit(ctx, method, retry, p)
	if err != nil {
		mb.DoneAt(time.Now(), serverFailure(err)) // a refusal, or a caller gone while it waited: the method fails its callers
		if err == errDeadlineTooShort || err == errShedRetry || err == errShedFirst {
			s.refused(ctx, method, admissionReason(err))
		}
		return nil, err
	}
	if !s.admitRetry(ctx, mb, retry) {
		t.Discard()
		s.refused(ctx, method, serverRetryBudget)
		return nil, refuseRetry(ctx)
	}
	defer func() {
		if err == nil {
			mb.DoneAt(time.Now(), false)
		} else {
			m, _ := ctx.Value(markerKey{}).(*refusalMarker)
			s.ended(mb, m, retry, err)
		}
		s.release(ctx, t, err)
	}()
	return handler(ctx, req)
}

// ended tells the method's retry budget how an attempt it admitted ended
// (err; retry: the attempt was a retry or hedge), and, if the method
// failed it, asks the budget whether it would pay for a retry: if not, m
// is marked dry, and the caller is told so (stormguard-budget-dry, see
// pushback): the suite's client then retries only from its own budget's
// credit, not on a loan, so that the fleet's start-up loans stop where the
// server's budget does. While the method fails, a first attempt's retry
// it would pay for is promised (see budget.Method.PromiseAt).
func (s *Server) ended(mb *budget.Method, m *refusalMarker, retry bool, err error) {
	now := time.Now()
	failed := serverFailure(err)
	mb.DoneAt(now, failed)
	if failed && mb != nil && m != nil && !s.o.noPushback && !m.set.Load() && !mb.PromiseAt(now, retry) {
		m.dry.Store(true)
	}
}

// Stream returns the stream server interceptor: deadline, the method's
// retry budget, then the handler (streams are not deduplicated unless the
// dedupe server says so), with don't-retry pushback as for unary calls.
func (s *Server) Stream() grpc.StreamServerInterceptor {
	var dedupe grpc.StreamServerInterceptor
	if s.dedupe != nil {
		dedupe = s.dedupe.Stream()
	}
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
		ctx, cancel, err := s.dl.Apply(ss.Context())
		if err != nil {
			s.refused(ctx, info.FullMethod, serverDoomed)
			return err
		}
		defer cancel()
		ctx = s.withPriority(ctx)
		m := &refusalMarker{}
		ctx = context.WithValue(ctx, markerKey{}, m)
		mb := s.rb.forMethod(info.FullMethod)
		if !s.admitRetry(ctx, mb, isRetry(ctx)) {
			s.refused(ctx, info.FullMethod, serverRetryBudget)
			return refuseRetry(ctx)
		}
		ss = &serverStream{ServerStream: ss, ctx: ctx}
		if dedupe != nil {
			err = dedupe(srv, ss, info, handler)
			s.refusedByDedupe(ctx, info.FullMethod, err)
		} else {
			err = handler(srv, ss)
		}
		s.ended(mb, m, isRetry(ctx), err)
		s.pushback(ctx, m, err)
		return unseal(err)
	}
}

type serverStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *serverStream) Context() context.Context { return s.ctx }
