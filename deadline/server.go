package deadline

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Resolution is the precision of the [MetadataKey] header. Its value is
// whole milliseconds (see [FormatHeader]), so a header deadline less than
// Resolution before the context deadline is rounding, not a tighter
// deadline: the server keeps the context as it is (and allocates nothing)
// in that case.
const Resolution = time.Millisecond

// ServerConfig configures a [Server]. The zero value refuses only work
// whose deadline has already passed on arrival.
type ServerConfig struct {
	// MinRemaining makes the server refuse a call (DeadlineExceeded,
	// handler not run) when less than this is left of its deadline on
	// arrival; 0: only when the deadline has already passed. Negative
	// counts as zero.
	MinRemaining time.Duration
}

// ServerStats counts what a [Server] did. The zero value is no activity.
type ServerStats struct {
	// Refused counts calls answered on arrival without running the
	// handler: DeadlineExceeded (deadline passed, or less than
	// MinRemaining left) or Canceled (the caller already left).
	Refused uint64
	// Malformed counts calls whose header was ignored: not a plain
	// non-negative decimal of at most 10 digits, or more than one value.
	Malformed uint64
	// Tightened counts calls whose handler got the header's deadline
	// because it was earlier (by at least Resolution) than the context's,
	// or the context had none.
	Tightened uint64
}

// Server is the server side of deadline propagation: it gives the handler
// the tighter of the incoming context deadline (grpc-timeout) and the
// [MetadataKey] header, and refuses work whose deadline has passed on
// arrival.
//
// The header is relative (time left when sent), so clocks of client and
// server need not agree; time spent in transit is not subtracted, exactly
// as with grpc-timeout. A header value of 0 means no time was left (a
// [Client] writes 1 for any positive time under a millisecond): such a call
// is refused. A malformed header is ignored (the
// grpc-timeout deadline still applies) and counted; a value above
// [MaxHeader] is clamped to it.
//
// A Server reads the real clock (time.Now), as the context deadlines it
// works with do.
//
// Create a Server with [NewServer]; the zero Server behaves as
// NewServer(ServerConfig{}). A Server is safe for concurrent use, and its
// counters are updated atomically. A Server must not be copied after first
// use.
type Server struct {
	min                           time.Duration
	now                           func() time.Time // nil: time.Now; set by tests only
	refused, malformed, tightened atomic.Uint64
}

// NewServer returns a Server configured by c.
func NewServer(c ServerConfig) *Server {
	return &Server{min: max(c.MinRemaining, 0)}
}

// Stats returns a snapshot of the counters. Each counter is read
// atomically; the three are not read at one instant.
func (s *Server) Stats() ServerStats {
	return ServerStats{Refused: s.refused.Load(), Malformed: s.malformed.Load(), Tightened: s.tightened.Load()}
}

var (
	errPassed = status.Error(codes.DeadlineExceeded, "stormguard: deadline passed before the call reached the handler")
	errShort  = status.Error(codes.DeadlineExceeded, "stormguard: less than the server's minimum time left on arrival")
	errGone   = status.Error(codes.Canceled, "stormguard: the call was cancelled before it reached the handler")
)

// Apply is the server building block, run on arrival with the incoming
// context. It reads the [MetadataKey] header and returns a context with the
// tighter of the header's deadline and ctx's own, and the CancelFunc to call
// when the handler is done. When the effective deadline has already passed,
// or less than MinRemaining is left, it returns ctx, a no-op cancel and a
// status error with codes.DeadlineExceeded, and counts a refusal: the
// handler must not run. A ctx that is already cancelled (the caller left
// before the handler started) is refused the same way, with
// codes.Canceled.
//
// The header is relative: Apply measures it from the moment it runs. Run it
// on arrival, before anything that may queue or block (install the
// interceptor first in the chain); time spent before it is charged to the
// grpc-timeout deadline, which grpc measures from arrival, but not to the
// header's.
//
// With no header, or one that is not tighter, Apply returns ctx itself
// (grpc copies a header it finds: one small allocation).
func (s *Server) Apply(ctx context.Context) (context.Context, context.CancelFunc, error) {
	ctx, cancel, _, err := s.apply(ctx)
	return ctx, cancel, err
}

func (s *Server) apply(ctx context.Context) (context.Context, context.CancelFunc, bool, error) {
	var now time.Time
	if s.now == nil {
		now = time.Now()
	} else {
		now = s.now()
	}
	eff, has := ctx.Deadline()
	tighten := false
	switch vals := metadata.ValueFromIncomingContext(ctx, MetadataKey); len(vals) {
	case 0:
	case 1:
		d, ok := ParseHeader(vals[0])
		if !ok {
			s.malformed.Add(1)
			break
		}
		if hdl := now.Add(d); !has || hdl.Before(eff) {
			tighten = !has || eff.Sub(hdl) >= Resolution
			eff, has = hdl, true
		}
	default:
		s.malformed.Add(1)
	}
	if has {
		if left := eff.Sub(now); left <= 0 || left < s.min {
			s.refused.Add(1)
			if left <= 0 {
				return ctx, noop, false, errPassed
			}
			return ctx, noop, false, errShort
		}
	}
	if err := ctx.Err(); err != nil {
		// The caller left (grpc cancelled the stream) before the handler
		// started: nobody would wait for its work.
		s.refused.Add(1)
		if errors.Is(err, context.DeadlineExceeded) {
			return ctx, noop, false, errPassed
		}
		return ctx, noop, false, errGone
	}
	if !tighten {
		return ctx, noop, false, nil
	}
	s.tightened.Add(1)
	ctx, cancel := context.WithDeadline(ctx, eff)
	return ctx, cancel, true, nil
}

// Unary returns the unary server interceptor: Apply, then the handler with
// the resulting context, unless Apply refused the call.
func (s *Server) Unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		ctx, cancel, _, err := s.apply(ctx)
		if err != nil {
			return nil, err
		}
		defer cancel()
		return handler(ctx, req)
	}
}

// Stream returns the stream server interceptor: Apply, then the handler
// with a stream whose Context is the resulting context, unless Apply
// refused the call. The stream is wrapped only when the deadline was
// tightened.
func (s *Server) Stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx, cancel, changed, err := s.apply(ss.Context())
		if err != nil {
			return err
		}
		defer cancel()
		if changed {
			ss = &serverStream{ServerStream: ss, ctx: ctx}
		}
		return handler(srv, ss)
	}
}

type serverStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *serverStream) Context() context.Context { return s.ctx }

// Remaining returns the time left before the deadline of ctx, and false
// when ctx has no deadline. A deadline that has passed leaves 0. In a
// handler behind a [Server] interceptor, this is the propagated budget: the
// tighter of grpc-timeout and the [MetadataKey] header.
func Remaining(ctx context.Context) (time.Duration, bool) {
	dl, ok := ctx.Deadline()
	if !ok {
		return 0, false
	}
	return max(time.Until(dl), 0), true
}
