package interceptor

import (
	"context"
	"strconv"
	"sync/atomic"

	"github.com/stormguard/stormguard/semconv"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/idempotency/dedupe"
	"github.com/stormguard/stormguard/overload"
	"github.com/stormguard/stormguard/priority"
)

// serverOverload is the Server's overload state.
type serverOverload struct {
	guard   *overload.Guard // nil: off
	trailer atomic.Pointer[retryAfterTrailer]
}

// The statuses of refusals, built once. They are marked as refusals for
// the dedupe interceptor, which runs admission only for a request that is
// to run its handler: a refused request's key is released, not stored,
// whatever the dedupe server's NotStored says.
var (
	errDeadlineTooShort = overloadError(codes.DeadlineExceeded,
		"stormguard: refused on arrival: less time left than the method needs now (server overloaded)",
		semconv.ErrorReasonDeadlineTooShort, nil)
	errShedRetry = overloadError(codes.Unavailable,
		"stormguard: server overloaded: retry shed, do not retry",
		semconv.ErrorReasonOverloaded, map[string]string{"attempt": "retry"})
	errShedFirst = overloadError(codes.Unavailable,
		"stormguard: server overloaded: request shed",
		semconv.ErrorReasonOverloaded, map[string]string{"attempt": "first"})
)

func overloadError(c codes.Code, msg, reason string, md map[string]string) error {
	st := status.New(c, msg)
	if d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: semconv.ErrorDomain, Metadata: md}); err == nil {
		st = d
	}
	return dedupe.Refused(st.Err())
}

// retryAfterTrailer caches the pushback trailer of shed first attempts,
// which depends on the Guard's configuration only.
type retryAfterTrailer struct {
	ms int64
	md metadata.MD
}

// admit runs the overload protection on a unary call of priority p that
// arrives with ctx (the deadline already applied). A refused call gets its
// status and pushback trailer; an admitted one a Ticket to report its end
// on. A call told to wait for a place under the method's limit waits here,
// before its handler, until it is given one, refused, or its caller
// leaves (then it fails with its context's status, and nothing ran).
func (s *Server) admit(ctx context.Context, method string, retry bool, p priority.Priority) (overload.Ticket, error) {
	g := s.ov.guard
	if g == nil {
		return overload.Ticket{}, nil
	}
	dl, _ := ctx.Deadline() // zero: none
	t, d := g.Method(method).Admit(overload.Request{Deadline: dl, Retry: retry, Priority: p})
	if d.Reason == overload.Queued {
		var err error
		if d, err = t.Wait(ctx); err != nil {
			return t, status.FromContextError(err).Err()
		}
	}
	switch d.Reason {
	case overload.Admitted:
		return t, nil
	case overload.RefusedDeadline:
		_ = grpc.SetTrailer(ctx, dontRetry)
		return t, errDeadlineTooShort
	case overload.ShedRetry:
		_ = grpc.SetTrailer(ctx, dontRetry)
		return t, errShedRetry
	}
	_ = grpc.SetTrailer(ctx, s.retryAfter(d.RetryAfter.Milliseconds()))
	return t, errShedFirst
}

// release reports the end of a call admitted with t, as what it proves:
// a call that returned a response completed (Done: its latency is what
// the method took, however late); one that failed after its context ended
// (the caller left, or the deadline passed) was cut short (Abandon: it
// took at least that long); one that failed on its own teaches nothing
// (Discard: often at once, and a full pool answering "busy" is no measure
// of the method's latency).
func (s *Server) release(ctx context.Context, t overload.Ticket, err error) {
	switch {
	case err == nil:
		t.Done()
	case ctx.Err() != nil:
		t.Abandon()
	default:
		t.Discard()
	}
}

// retryAfter returns the pushback trailer for ms milliseconds.
func (s *Server) retryAfter(ms int64) metadata.MD {
	if c := s.ov.trailer.Load(); c != nil && c.ms == ms {
		return c.md
	}
	c := &retryAfterTrailer{ms: ms, md: metadata.Pairs(semconv.PushbackKey, strconv.FormatInt(ms, 10))}
	s.ov.trailer.Store(c)
	return c.md
}
