package interceptor

import (
	"context"
	"net"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/stormguard/stormguard/deadline"
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/internal/engine"
	"github.com/stormguard/stormguard/internal/svcconfig"
	"github.com/stormguard/stormguard/priority"
	"github.com/stormguard/stormguard/semconv"
)

// What a call is: its state, the settings its caller gave it, and how it
// is set up (its idempotency key, whether it may be repeated, its
// deadline, its span). What happens to it after each attempt is the
// engine's (engine.go, and package internal/engine).

// call is the state of one logical call: the engine's (e), and what the
// adapter needs beside it to send attempts with grpc-go and record them.
// It is used by the call's goroutine only.
type call struct {
	e         engine.Call
	client    *Client
	route     *route
	ctx       context.Context // the call's: attempts derive from it
	ctxAt     time.Time       // ctx's deadline (zero: none); the call's may be tighter (a service-config timeout read late)
	span      trace.Span
	recording bool
	lastErr   error // the last attempt's error
	prio      priority.Priority
	// mc is the service config of the call's method as last read; watched
	// what the Client has seen of grpc-go's retries on its ClientConn
	// (see grpcRetries), when they are watched.
	mc      *methodConfig
	watched *grpcRetries
	// hasKey: the call has an idempotency key; scIgnored: why the service
	// config's policy was not applied.
	hasKey    bool
	scIgnored string
	// back is the logical call this try is one of, when a failed try came
	// back through a retry loop outside the suite (outer.go): nil
	// otherwise. scope identifies the caller's logical call (callerScope;
	// nil: none); madeKey is the idempotency key the suite made for the
	// call, if any.
	back    *returned
	scope   any
	madeKey string
}

// Per-call options.

// MaxAttempts limits the attempts of one call, the first included
// (1 disables retries and hedging for the call). It can raise the client's
// limit up to 10, but never makes a method that may not be repeated retry.
func MaxAttempts(n int) grpc.CallOption { return maxAttemptsOption{n: clampAttempts(n)} }

// NoHedging turns hedging off for one call; failed attempts may still be
// retried.
func NoHedging() grpc.CallOption { return noHedgingOption{} }

type maxAttemptsOption struct {
	grpc.EmptyCallOption
	n int
}

type noHedgingOption struct{ grpc.EmptyCallOption }

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

// shape is how a call's attempts are sent: one after the other, or by the
// hedger, with hedges, retries beside a slow attempt, or both.
type shape struct{ hedge, beside bool }

// setup starts call c of route r, from the caller's ctx: the idempotency
// key, whether it may be repeated, its attempt limit and its deadline (the
// method's service-config timeout applies once to the whole call, when it
// is tighter than the caller's deadline; a Client default timeout to
// calls that have none), then the engine's start (the budget's deposit,
// the endpoints to avoid) and the call span. req is a unary call's
// request, by which a try that comes back is known (nil for streams). It
// sets c.ctx to the context the attempts are sent with, and returns the
// CancelFunc to call when the call is over and how its attempts are sent.
func (c *call) setup(ctx context.Context, cs callSettings, cc *grpc.ClientConn, w *svcconfig.Watch, req any) (context.CancelFunc, shape, error) {
	r := c.route
	now := c.client.now()
	if req != nil {
		c.scope = callerScope(ctx)
		c.back = c.client.cameBack(c.scope, r, req, now)
	}
	prior := 0
	if b := c.back; b != nil {
		prior, c.lastErr = b.attempts, b.err()
	}
	ctx, hasKey, err := c.withKey(ctx, cs)
	if err != nil {
		return noCancel, shape{}, err
	}
	e := &c.e
	c.hasKey, e.Asked = hasKey, cs.maxAttempts
	e.Rule, e.Repeatable = &r.eng.Rule, r.policy.Repeatable(hasKey)
	mc := r.methodConfig(cc, now, w)
	if mc.throttle != nil {
		e.Throttle = mc.throttle
	}
	if w != nil {
		e.Resolved = w
	}
	c.applyServiceConfig(mc)
	c.applyGRPCRetry(mc)
	// A try that came back is already a retry: it neither hedges nor
	// sends a retry beside a slow attempt.
	more := e.Repeatable && !e.GRPCRetry && e.MaxAttempts() > 1 && c.back == nil
	sh := shape{hedge: more && e.Rule.Hedge && !cs.noHedge, beside: more && r.eng.PerAttempt > 0}
	ctx, cancel := c.callContext(ctx, now, mc.timeout)
	e.Begin(&r.eng, now, prior)
	c.startSpan(ctx)
	return cancel, sh, nil
}

// callContext returns the context the call's attempts derive from: ctx
// with the call's deadline and priority, and without a stale
// stormguard-deadline-ms (the attempts send their own); and sets the
// call's deadline.
func (c *call) callContext(ctx context.Context, now time.Time, timeout time.Duration) (context.Context, context.CancelFunc) {
	if metadata.ValueFromOutgoingContext(ctx, deadline.MetadataKey) != nil {
		ctx = removeOutgoing(ctx, deadline.MetadataKey)
	}
	ctx = c.priorityFrom(ctx)
	cancel := noCancel
	dl, ok := ctx.Deadline()
	switch {
	case timeout > 0 && (!ok || now.Add(timeout).Before(dl)):
		dl = now.Add(timeout)
		ctx, cancel = context.WithDeadline(ctx, dl)
	case !ok && c.client.dl.DefaultTimeout() > 0:
		dl = now.Add(c.client.dl.DefaultTimeout())
		ctx, cancel = context.WithDeadline(ctx, dl)
	}
	c.ctxAt, c.e.Deadline = dl, dl
	return ctx, cancel
}

// startSpan starts the call span, and makes c.ctx the context that
// carries it.
func (c *call) startSpan(ctx context.Context) {
	c.ctx = ctx
	t := c.client.tel.tracer
	if t == nil {
		return
	}
	c.ctx, c.span = t.Start(ctx, c.route.tel.name, c.route.tel.callSpan...)
	if c.recording = c.span.IsRecording(); !c.recording {
		return
	}
	if c.e.GRPCRetry {
		c.span.SetAttributes(semconv.AttrGRPCRetryPolicy.Bool(true))
	}
	if c.back != nil {
		c.span.SetAttributes(semconv.AttrOuterRetry.Bool(true))
	}
	if p, set := priority.FromContext(ctx); set {
		c.span.SetAttributes(semconv.AttrPriority.String(p.String()))
	}
}

// withKey returns ctx with the call's idempotency key in its outgoing
// metadata: the caller's (its call option, or its context), or, for a
// retry_with_key method, one the Client makes (the same for every try of
// a logical call that came back). It reports whether the call has a key.
func (c *call) withKey(ctx context.Context, cs callSettings) (context.Context, bool, error) {
	key, hasKey := cs.key, cs.hasKey
	if !hasKey {
		key, hasKey = idempotency.KeyFromContext(ctx)
	}
	switch {
	case hasKey:
		if err := idempotency.ValidateKey(key); err != nil {
			return ctx, false, err
		}
		ctx = replaceOutgoing(ctx, idempotency.MetadataKey, key)
	case c.route.policy.Level == idempotency.RetryWithKey:
		// Only here does a key change anything (Repeatable); a key the
		// caller put in the metadata of another method is sent as is.
		if vs := metadata.ValueFromOutgoingContext(ctx, idempotency.MetadataKey); len(vs) == 1 {
			hasKey = true
		} else if !c.client.o.noKeys {
			// A try that came back sends the key of the logical call's
			// earlier tries, so that the server deduplicates them.
			if b := c.back; b != nil && b.idemKey != "" {
				c.madeKey = b.idemKey
			} else {
				c.madeKey = idempotency.NewKey()
			}
			ctx = metadata.AppendToOutgoingContext(ctx, idempotency.MetadataKey, c.madeKey)
			hasKey = true
		}
	}
	return ctx, hasKey, nil
}

// priorityFrom reads the call's priority from ctx and returns the context
// its attempts are sent with: a call with a priority of its own drops a
// stormguard-priority value already in the outgoing metadata (a proxy's
// copy of its incoming metadata), since its attempts send their own. A
// call without one leaves the metadata as it is, and costs one context
// lookup.
func (c *call) priorityFrom(ctx context.Context) context.Context {
	p, set := priority.FromContext(ctx)
	c.prio = p
	if set && metadata.ValueFromOutgoingContext(ctx, semconv.PriorityKey) != nil {
		ctx = removeOutgoing(ctx, semconv.PriorityKey)
	}
	return ctx
}

// callerScope returns what identifies the caller's logical call in ctx: its
// Done channel, shared by the contexts a loop derives from it for each try
// (metadata, values); or, for a context that is never done, the context
// itself. context.Background() and TODO() identify nothing (nil): they are
// the same for every caller.
func callerScope(ctx context.Context) any {
	if d := ctx.Done(); d != nil {
		return d
	}
	if ctx == context.Background() || ctx == context.TODO() {
		return nil
	}
	return ctx
}

// callerDone reports whether the caller's context, identified by scope
// (see callerScope), is done: a context that is not a Done channel is
// never done.
func callerDone(scope any) bool {
	d, ok := scope.(<-chan struct{})
	if !ok {
		return false
	}
	select {
	case <-d:
		return true
	default:
		return false
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

// attemptMode says what context an attempt needs.
type attemptMode uint8

const (
	plainAttempt      attemptMode = iota // the call's context, or a per-attempt timeout
	cancelableAttempt                    // its own cancel (hedging)
	streamAttemptMode                    // its own cancel, no per-attempt timeout
)

// attempt is the state of one attempt: the engine's, and what grpc-go
// sends it with.
type attempt struct {
	engine.Attempt
	ctx    context.Context
	cancel context.CancelFunc // nil when the attempt made no context of its own
	span   trace.Span
	pt     *perTry // the per-attempt timeout of a sequential attempt a retry may follow
	ended  uint32  // 1 once end has run; atomic if shared
	// shared marks a stream attempt, which its receiver and the caller
	// leaving may both end: ended is then set by compare-and-swap. Any
	// other attempt is ended by its call's goroutine alone.
	shared bool
	creds  *attemptCreds // nil when the attempt was sent without
	peerp  *peer.Peer    // filled by grpc.Peer after the attempt, when the call asked for it
}

// endOnce reports whether a has not been ended before, and marks it
// ended.
func (a *attempt) endOnce() bool {
	if a.shared {
		return atomic.CompareAndSwapUint32(&a.ended, 0, 1)
	}
	if a.ended != 0 {
		return false
	}
	a.ended = 1
	return true
}

// peer returns the endpoint a went to, if known.
func (a *attempt) peer() net.Addr {
	if a.creds != nil && a.creds.committed.addr != nil {
		return a.creds.committed.addr
	}
	if a.peerp != nil {
		return a.peerp.Addr
	}
	return nil
}
