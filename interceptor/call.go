package interceptor

import (
	"context"
	"net"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/deadline"
	"github.com/stormguard/stormguard/idempotency"
)

// callSettings are the per-call options found among a call's CallOptions.
type callSettings struct {
	maxAttempts int
	noHedge     bool
	key         string
	hasKey      bool
	userCreds   grpc.PerRPCCredsCallOption // the caller's own call credentials, if any
	hasCreds    bool
}

func scanCallOptions(opts []grpc.CallOption) (s callSettings) {
	for _, o := range opts {
		switch o := o.(type) {
		case maxAttemptsOption:
			s.maxAttempts = o.n
		case noHedgingOption:
			s.noHedge = true
		case idempotency.KeyCallOption:
			if o.Key != "" {
				s.key, s.hasKey = o.Key, true
			}
		case *idempotency.KeyCallOption:
			if o != nil && o.Key != "" {
				s.key, s.hasKey = o.Key, true
			}
		case grpc.PerRPCCredsCallOption:
			s.userCreds, s.hasCreds = o, o.Creds != nil
		}
	}
	return s
}

// call is the state of one logical call: one engine for unary calls,
// hedged calls and streams.
type call struct {
	client       *Client
	route        *route
	cc           *grpc.ClientConn
	grpcRetryOff bool      // installed by DialOptions: grpc-go does not retry
	ctxDeadline  time.Time // the deadline of the context attempts derive from
	ctxHasDL     bool
	span         trace.Span
	recording    bool
	start        time.Time
	maxAttempts  int
	repeatable   bool
	hedge        bool
	beside       bool          // a per-attempt timeout sends a retry beside the slow attempt (see hedger)
	grpcRetry    bool          // grpc-go's retryPolicy covers the method: one attempt of ours
	mc           *methodConfig // the method's service config, as last read
	watched      *grpcRetries  // installed by hand, a retryPolicy: what grpc-go does with it is watched (see grpcRetries)
	deadline     time.Time
	hasDeadline  bool
	sent         int // attempts sent
	retries      int
	hedges       int
	backoffN     int        // retries since the last pushback
	lastErr      error      // the last attempt's error
	timed        bool       // an attempt's end time is needed even on success (duration metric, latency)
	failover     bool       // the next retry fails over from an outlier endpoint
	prepaid      bool       // the next retry's token was withdrawn when its attempt was cut (perTry)
	pushedBack   bool       // a server said "do not retry": no attempt follows any more
	avoid        []net.Addr // the target's outlier endpoints, which attempts avoid
	failedOn     []net.Addr // the endpoints the call's attempts failed on
	// back is, for a try of a logical call that failed and came back
	// through a retry loop outside the suite (see outer.go), that call:
	// this try deposits nothing and its first attempt is a retry.
	back    *returned
	req     any    // a unary call's request: a try of a failed call is found by it (nil for streams)
	prior   int    // attempts the logical call's earlier tries sent
	madeKey string // the idempotency key the suite made for the call, if any
}

// setup resolves the call's settings: the idempotency key (added to ctx),
// whether it may be repeated, its attempt limit, whether it hedges, and its
// deadline (the method's service-config timeout applies once to the whole
// call, when it is tighter than the caller's deadline; a Client default
// timeout to calls that have none). It returns the context to send the
// attempts with and the CancelFunc to call when the call is over.
func (c *call) setup(ctx context.Context, cs callSettings, cc *grpc.ClientConn, grpcRetryOff bool) (context.Context, context.CancelFunc, error) {
	r := c.route
	c.cc, c.grpcRetryOff = cc, grpcRetryOff
	c.start = c.client.now()
	if c.req != nil {
		c.back = c.client.cameBack(ctx, r, c.req, c.start)
	}
	if b := c.back; b != nil {
		c.prior, c.lastErr = b.attempts, b.err
	}
	key, hasKey := cs.key, cs.hasKey
	if !hasKey {
		key, hasKey = idempotency.KeyFromContext(ctx)
	}
	switch {
	case hasKey:
		if err := idempotency.ValidateKey(key); err != nil {
			return ctx, noCancel, err
		}
		ctx = replaceOutgoing(ctx, idempotency.MetadataKey, key)
	case r.policy.Level == idempotency.RetryWithKey:
		// Only here does a key change anything (Repeatable); a key the
		// caller put in the metadata of another method is sent as is.
		if vs := metadata.ValueFromOutgoingContext(ctx, idempotency.MetadataKey); len(vs) == 1 {
			hasKey = true
		} else if !c.client.o.noKeys {
			// A try that came back sends the key of the logical call's
			// earlier tries, so that the server deduplicates them.
			if b := c.back; b != nil && b.key != "" {
				c.madeKey = b.key
			} else {
				c.madeKey = idempotency.NewKey()
			}
			ctx = metadata.AppendToOutgoingContext(ctx, idempotency.MetadataKey, c.madeKey)
			hasKey = true
		}
	}
	c.repeatable = r.policy.Repeatable(hasKey)
	c.maxAttempts = 1
	if c.repeatable {
		c.maxAttempts = r.maxAttempts
		if cs.maxAttempts > 0 {
			c.maxAttempts = cs.maxAttempts
		}
	}
	mc := r.methodConfig(cc, c.start)
	c.applyGRPCRetry(mc)
	// A try that came back is already a retry: it neither hedges nor
	// sends a retry beside a slow attempt.
	c.hedge = c.repeatable && !c.grpcRetry && r.hedge && !cs.noHedge && c.maxAttempts > 1 && c.back == nil
	c.beside = c.repeatable && !c.grpcRetry && r.perAttempt > 0 && c.maxAttempts > 1 && c.back == nil
	if metadata.ValueFromOutgoingContext(ctx, deadline.MetadataKey) != nil {
		ctx = removeOutgoing(ctx, deadline.MetadataKey) // stale: the attempts send their own
	}
	var cancel context.CancelFunc
	if dl, ok := ctx.Deadline(); mc.timeout > 0 && (!ok || c.start.Add(mc.timeout).Before(dl)) {
		ctx, cancel = context.WithDeadline(ctx, c.start.Add(mc.timeout))
	} else {
		ctx, cancel = c.client.dl.CallContext(ctx) // a default timeout, if configured
	}
	c.deadline, c.hasDeadline = ctx.Deadline()
	c.ctxDeadline, c.ctxHasDL = c.deadline, c.hasDeadline
	if !c.client.o.noFailover {
		c.avoid = r.endpoints.current(c.start)
	}
	return ctx, cancel, nil
}

// applyGRPCRetry notes whether grpc-go retries the method itself: its
// service config has a retryPolicy and grpc-go's retries are not known to
// be off (DialOptions turns them off; installed by hand, the Client
// watches what grpc-go does with such calls: see grpcRetries). Sending
// more attempts of our own would multiply grpc-go's; when its retries are
// off, the suite retries as for any other method.
func (c *call) applyGRPCRetry(mc *methodConfig) {
	c.mc = mc
	if c.grpcRetryOff || !c.repeatable {
		return
	}
	if !mc.grpcRetry {
		// Read before the ClientConn was ready, the config may not be
		// grpc's yet: the attempt is watched all the same, in case its
		// failure shows a retryPolicy (see noteGRPCRetries).
		if mc.provisional && c.watched == nil {
			c.watched = c.client.grpcRetriesOf(c.cc)
		}
		return
	}
	if c.watched == nil {
		c.watched = c.client.grpcRetriesOf(c.cc)
	}
	switch {
	case c.watched != nil && c.watched.off.Load():
		c.grpcRetry = false
	case !c.grpcRetry:
		c.grpcRetry = true
		c.client.warnGRPCRetry(c.route)
	}
}

// recheckMethodConfig reads the method's service config again after a
// failed attempt (see route.readMethodConfig): a retryPolicy found now
// stops the suite's retries, and a method timeout bounds the rest of the
// call, measured from its start, when it is tighter than its deadline.
func (c *call) recheckMethodConfig(now time.Time) {
	mc := c.route.readMethodConfig(c.cc, now)
	c.applyGRPCRetry(mc)
	if mc.timeout > 0 {
		if dl := c.start.Add(mc.timeout); !c.hasDeadline || dl.Before(c.deadline) {
			c.deadline, c.hasDeadline = dl, true
		}
	}
}

// noCancel is the CancelFunc of a call that made no context of its own.
var noCancel context.CancelFunc = func() {}

// replaceOutgoing sets key to the single value v in ctx's outgoing
// metadata, dropping any value already there.
func replaceOutgoing(ctx context.Context, key, v string) context.Context {
	if len(metadata.ValueFromOutgoingContext(ctx, key)) == 0 {
		return metadata.AppendToOutgoingContext(ctx, key, v)
	}
	md, _ := metadata.FromOutgoingContext(ctx)
	md = md.Copy()
	md.Set(key, v)
	return metadata.NewOutgoingContext(ctx, md)
}

// removeOutgoing drops key from ctx's outgoing metadata.
func removeOutgoing(ctx context.Context, key string) context.Context {
	md, _ := metadata.FromOutgoingContext(ctx) // a copy
	delete(md, key)
	return metadata.NewOutgoingContext(ctx, md)
}

// startCall deposits into the budget (not for a try that came back: its
// logical call deposited) and starts the call span.
func (c *call) startCall(ctx context.Context) context.Context {
	if c.back == nil { // a try that came back: its logical call deposited
		c.route.budget.DepositAt(c.start) // a nil budget does nothing
	}
	c.timed = c.route.lat != nil || c.client.tel.duration.Enabled(ctx)
	if t := c.client.tel.tracer; t != nil {
		ctx, c.span = t.Start(ctx, c.route.tel.name, c.route.tel.callSpan...)
		c.recording = c.span.IsRecording()
		if c.recording && c.grpcRetry {
			c.span.SetAttributes(AttrGRPCRetryPolicy.Bool(true))
		}
		if c.recording && c.back != nil {
			c.span.SetAttributes(AttrOuterRetry.Bool(true))
		}
	}
	return ctx
}

// endCall records the call's outcome and ends its span. A try that came
// back is not another logical call: the calls and the call duration count
// its logical call's first try only.
func (c *call) endCall(ctx context.Context, err error) {
	st, _ := status.FromError(err)
	code := st.Code()
	t, rt := c.client.tel, c.route.tel
	if c.back == nil {
		t.calls.Add(ctx, 1, rt.callOpts(code)...)
	}
	if c.back == nil && t.duration.Enabled(ctx) {
		t.duration.Record(ctx, c.client.now().Sub(c.start).Seconds(), rt.durationOpts(code)...)
	}
	if c.retries > 0 {
		t.retries.Record(ctx, int64(c.retries), rt.perCallOpts()...)
	}
	if c.hedges > 0 {
		t.hedges.Record(ctx, int64(c.hedges), rt.perCallOpts()...)
	}
	endSpan(c.span, code, st.Message())
}

// event adds a decision event to the call span.
func (c *call) event(name string, attrs ...attribute.KeyValue) {
	if c.recording {
		c.span.AddEvent(name, trace.WithAttributes(attrs...))
	}
}
