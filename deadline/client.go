package deadline

import (
	"context"
	"math"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// MaxMarginFraction caps [ClientConfig.MarginFraction], and what Margin
// and MarginFraction together take off the header: at least a tenth of
// the time left is always sent.
const MaxMarginFraction = 0.9

// MaxMarginShare is the largest share of the time left that
// [ClientConfig.Margin] takes off the header: a call with 2 ms left sends
// at least 1.5 ms, whatever the margin. The margin is there so that a
// server downstream gives up before its caller does; on a call whose
// deadline is shorter than a few margins, taking it whole would refuse
// work that plain grpc-go completes in time.
const MaxMarginShare = 0.25

// DefaultMargin is the Margin of a zero ClientConfig: the header is
// relative, so each hop's deadline would otherwise land later than its
// caller's by the time the request spent between the header's writing and
// the server's reading it. With it, no handler down a chain has a deadline
// later than the original caller's, as long as each hop takes less than
// DefaultMargin to get there and the call has at least 20 ms left (below
// that, the margin is MaxMarginShare of the time left); see the package
// documentation for the measurement behind it.
const DefaultMargin = 5 * time.Millisecond

// ClientConfig configures a [Client]. The zero value propagates the
// deadline less DefaultMargin, fails fast only on an already expired
// deadline and gives calls without a deadline none. Negative durations
// count as zero, except Margin (see there).
type ClientConfig struct {
	// MinRemaining makes an attempt fail fast (DeadlineExceeded, nothing
	// sent) when less than this is left of its deadline; 0: only when the
	// deadline has already passed.
	MinRemaining time.Duration
	// DefaultTimeout is applied to calls whose context has no deadline;
	// 0: none (such calls are sent without a deadline and without the
	// header).
	DefaultTimeout time.Duration
	// Margin is subtracted from the time written into the header, but
	// never more than MaxMarginShare of the time left; 0: DefaultMargin;
	// negative: none.
	Margin time.Duration
	// MarginFraction of the remaining time is subtracted from the header as
	// well; clamped to [0, MaxMarginFraction]; NaN counts as 0. Margin and
	// MarginFraction together take at most MaxMarginFraction of the time
	// left.
	MarginFraction float64
}

// Client is the client side of deadline propagation: it fails attempts
// fast that have (almost) no time left, gives calls without a deadline a
// default one, and writes the time left, less a margin, into the
// [MetadataKey] header of every attempt.
//
// The Client never changes an attempt's own deadline, which grpc sends as
// grpc-timeout: the margin shrinks only the header (see Margin in the
// package documentation), and a server that does not read the header is
// bound by grpc-timeout alone.
//
// The interceptors and CallContext read the real clock (time.Now), as the
// context deadlines they work with do; AttemptContext takes the time from
// its caller.
//
// Create a Client with [NewClient]; the zero Client behaves as
// NewClient(ClientConfig{}). A Client is immutable and safe for concurrent
// use, also by concurrent attempts (hedges) of one call.
type Client struct {
	min, def, margin time.Duration
	frac             float64
	now              func() time.Time // nil: time.Now; set by tests only
}

// NewClient returns a Client configured by c.
func NewClient(c ClientConfig) *Client {
	f := c.MarginFraction
	switch {
	case math.IsNaN(f) || f < 0:
		f = 0
	case f > MaxMarginFraction:
		f = MaxMarginFraction
	}
	margin := c.Margin
	if margin == 0 {
		margin = DefaultMargin
	}
	return &Client{min: max(c.MinRemaining, 0), def: max(c.DefaultTimeout, 0), margin: max(margin, 0), frac: f}
}

func (c *Client) clock() time.Time {
	if c.now == nil {
		return time.Now()
	}
	return c.now()
}

// noop is the CancelFunc returned when there is nothing to cancel; a
// package-level func value, so returning it does not allocate.
var noop context.CancelFunc = func() {}

var (
	errExpired = status.Error(codes.DeadlineExceeded, "stormguard: deadline exceeded before the attempt was sent")
	errTooLate = status.Error(codes.DeadlineExceeded, "stormguard: less than the minimum time left before the deadline; attempt not sent")
)

// DefaultTimeout returns the timeout the Client gives a call that has no
// deadline (ClientConfig.DefaultTimeout; 0: none).
func (c *Client) DefaultTimeout() time.Duration { return c.def }

// CallContext is the once-per-logical-call step: it returns ctx with the
// configured DefaultTimeout applied (measured from now) when
// ctx has no deadline, and ctx itself (with a no-op cancel) otherwise. The
// caller must call cancel when the call is over.
func (c *Client) CallContext(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel, _ := c.callContext(ctx)
	return ctx, cancel
}

func (c *Client) callContext(ctx context.Context) (context.Context, context.CancelFunc, bool) {
	if c.def <= 0 {
		return ctx, noop, false
	}
	if _, ok := ctx.Deadline(); ok {
		return ctx, noop, false
	}
	ctx, cancel := context.WithDeadline(ctx, c.clock().Add(c.def))
	return ctx, cancel, true
}

// Downstream returns the time written into the header for an attempt with
// remaining time left: remaining less Margin (at most MaxMarginShare of
// remaining) and less MarginFraction of remaining, together at most
// MaxMarginFraction of it; zero when remaining is not positive. Any
// positive remaining gives a positive result.
func (c *Client) Downstream(remaining time.Duration) time.Duration {
	if remaining <= 0 {
		return 0
	}
	margin := min(c.margin, time.Duration(float64(remaining)*MaxMarginShare))
	take := min(margin+time.Duration(float64(remaining)*c.frac), time.Duration(float64(remaining)*MaxMarginFraction))
	return max(remaining-take, 1)
}

// Check returns the status error an attempt with left time before its
// deadline fails fast with (codes.DeadlineExceeded, nothing sent), or nil
// when it may be sent: left must be positive and at least MinRemaining.
func (c *Client) Check(left time.Duration) error {
	switch {
	case left <= 0:
		return errExpired
	case left < c.min:
		return errTooLate
	}
	return nil
}

// AttemptContext is the once-per-attempt step, to be called right before
// the attempt is sent, with the current time.
//
// When ctx has a deadline that has passed, or with less than MinRemaining
// left, it returns ctx and a status error with codes.DeadlineExceeded (see
// Check): the attempt must not be sent. Otherwise it returns ctx with the outgoing
// [MetadataKey] header set to Downstream(time left), as [FormatHeader]
// writes it. A header already present in the outgoing metadata (say, a
// proxy copied its incoming metadata) is replaced, so exactly one value is
// sent. When ctx has no deadline, no header is sent, and a stale one is
// removed: the header only ever states this call's deadline.
//
// The header states the time left when AttemptContext runs: a wait before
// the stream starts (connection set-up, grpc.WaitForReady) eats into the
// margin, never past grpc-timeout, which a stormguard server also reads.
// The common case costs one metadata.AppendToOutgoingContext.
func (c *Client) AttemptContext(ctx context.Context, now time.Time) (context.Context, error) {
	dl, ok := ctx.Deadline()
	// ValueFromOutgoingContext allocates only when it finds a value.
	stale := metadata.ValueFromOutgoingContext(ctx, MetadataKey) != nil
	if !ok {
		if stale {
			ctx = replaceHeader(ctx, "", false)
		}
		return ctx, nil
	}
	left := dl.Sub(now)
	if err := c.Check(left); err != nil {
		return ctx, err
	}
	v := FormatHeader(c.Downstream(left))
	if stale {
		return replaceHeader(ctx, v, true), nil
	}
	return metadata.AppendToOutgoingContext(ctx, MetadataKey, v), nil
}

// replaceHeader rebuilds the outgoing metadata of ctx with the header set
// to v (set) or removed (!set).
func replaceHeader(ctx context.Context, v string, set bool) context.Context {
	md, _ := metadata.FromOutgoingContext(ctx) // a copy, keys lower-cased
	delete(md, MetadataKey)
	if set {
		md[MetadataKey] = []string{v}
	}
	return metadata.NewOutgoingContext(ctx, md)
}

// Unary returns the unary client interceptor: CallContext, then
// AttemptContext, then the call (not sent when AttemptContext fails).
func (c *Client) Unary() grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		ctx, cancel, _ := c.callContext(ctx)
		defer cancel()
		ctx, err := c.AttemptContext(ctx, c.clock())
		if err != nil {
			return err
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
}

// Stream returns the stream client interceptor: CallContext, then
// AttemptContext, then the stream (not opened when AttemptContext fails).
// When a DefaultTimeout was applied, its context is released when the
// stream ends (RecvMsg returns an error, or the single response of a
// non-server-streaming method arrived) or, for a stream the caller
// abandons, when the timeout expires.
func (c *Client) Stream() grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		ctx, cancel, applied := c.callContext(ctx)
		ctx, err := c.AttemptContext(ctx, c.clock())
		if err != nil {
			cancel()
			return nil, err
		}
		cs, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil {
			cancel()
			return nil, err
		}
		if !applied {
			return cs, nil
		}
		return &cancelStream{ClientStream: cs, cancel: cancel, serverStreams: desc.ServerStreams}, nil
	}
}

// cancelStream releases the default-timeout context when the stream ends.
type cancelStream struct {
	grpc.ClientStream
	cancel        context.CancelFunc
	serverStreams bool
}

func (s *cancelStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	// Without server streaming, grpc finishes the stream once the one
	// response arrived.
	if err != nil || !s.serverStreams {
		s.cancel()
	}
	return err
}
