package interceptor

import (
	"context"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/deadline"
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/internal/codename"
	"github.com/stormguard/stormguard/internal/cowmap"
	"github.com/stormguard/stormguard/internal/protoreg"
)

// Metadata keys the client reads and writes (gRFC A6).
const (
	// PreviousAttemptsKey is sent on every retry and hedge: the number of
	// attempts of the same call sent before it.
	PreviousAttemptsKey = "grpc-previous-rpc-attempts"
	// PushbackKey is read from response trailers: a value ≥ 0 is the delay
	// in milliseconds before the next attempt (replacing the backoff); a
	// negative or malformed value, or several values, mean "do not retry".
	PushbackKey = "grpc-retry-pushback-ms"
)

// Client is the suite's client side: unary and stream interceptors that
// retry and hedge only what may be repeated, pay for every retry and hedge
// from a per-target budget, stop calling a target whose breaker is open,
// propagate the deadline, and record every decision as OpenTelemetry spans,
// events and metrics.
//
// Create one with NewClient and use it for any number of ClientConns:
// budgets and breakers are per target (cc.Target()) and shared by every
// ClientConn of the same Client. A Client is safe for concurrent use.
type Client struct {
	o         clientOptions
	resolver  *idempotency.Resolver
	budgets   *budget.Registry  // nil: no budget
	breakers  *breaker.Registry // nil: no breaker
	dl        *deadline.Client
	tel       *telemetry
	retryable idempotency.CodeSet
	failures  idempotency.CodeSet
	hedgeQ    float64
	routes    cowmap.Map[routeKey, *route]
	// budgetAt and breakerAt are true when the budgets and breakers run on
	// this Client's clock, so that the times it reads anyway can be passed
	// to them instead of their reading the clock again.
	budgetAt, breakerAt bool
}

// NewClient returns a Client configured by opts. Nil options are ignored.
func NewClient(opts ...ClientOption) *Client {
	o := clientOptions{
		maxAttempts: DefaultMaxAttempts,
		backoffBase: DefaultBackoffBase,
		backoffMax:  DefaultBackoffMax,
		replayLimit: DefaultReplayLimit,
		now:         time.Now,
	}
	for _, opt := range opts {
		if opt != nil {
			opt.applyClient(&o)
		}
	}
	o.backoffMax = max(o.backoffMax, o.backoffBase)
	c := &Client{o: o}
	c.resolver = idempotency.NewResolver(idempotency.ResolverConfig{Idempotent: o.idempotent})
	ratio := budget.DefaultRatio
	if !o.noBudget {
		if o.budgets != nil {
			c.budgets = o.budgets
		} else {
			cfg := o.budgetCfg
			if cfg.Now == nil {
				cfg.Now = o.now
				c.budgetAt = true
			}
			c.budgets = budget.NewRegistry(cfg)
			if cfg.Ratio > 0 && !math.IsInf(cfg.Ratio, 0) {
				ratio = cfg.Ratio
			}
		}
	}
	// Hedges alone should use about three quarters of the budget, leaving
	// the rest for retries: hedge when an attempt is slower than the
	// (1 - 0.75·ratio) quantile.
	c.hedgeQ = min(max(1-0.75*ratio, 0.5), 0.999)
	if !o.noBreaker {
		if o.breakers != nil {
			c.breakers = o.breakers
		} else {
			cfg := o.breakerCfg
			if cfg.Now == nil {
				cfg.Now = o.now
				c.breakerAt = true
			}
			c.breakers = breaker.NewRegistry(cfg)
		}
	}
	dcfg := o.deadlineCfg
	if dcfg.Now == nil {
		dcfg.Now = o.now
	}
	c.dl = deadline.NewClient(dcfg)
	c.retryable = resolveCodes(o.retryable, idempotency.Codes(codes.Unavailable))
	c.failures = resolveCodes(o.failures, idempotency.Codes(codes.Unavailable, codes.DeadlineExceeded, codes.ResourceExhausted, codes.Internal))
	c.tel = newTelemetry(&c.o, c)
	return c
}

func resolveCodes(set, def idempotency.CodeSet) idempotency.CodeSet {
	switch set {
	case 0:
		return def
	case noCodes:
		return 0
	}
	return set
}

type routeKey struct{ target, method string }

// route is everything a call needs that depends only on its target and
// method, resolved once and cached.
type route struct {
	method      string // "/pkg.Svc/Method"
	name        string // "pkg.Svc/Method"
	policy      idempotency.Policy
	budget      *budget.Budget   // nil: none
	breaker     *breaker.Breaker // nil: none
	maxAttempts int              // for repeatable calls
	retryable   idempotency.CodeSet
	hedge       bool
	hedgeDelay  time.Duration // 0: adaptive
	maxHedges   int
	perAttempt  time.Duration
	lat         *latency                 // adaptive hedging; nil unless hedge && hedgeDelay == 0
	respType    protoreflect.MessageType // streams: to drain a failed attempt; may be nil
	tel         *routeTelemetry
	attemptName string
}

func (c *Client) route(target, method string) *route {
	if r, ok := c.routes.Load(routeKey{target, method}); ok {
		return r
	}
	return c.routes.LoadOrCreate(routeKey{target, method}, func(k routeKey) *route {
		p := c.resolver.Lookup(method)
		r := &route{
			method:      method,
			name:        strings.TrimPrefix(method, "/"),
			policy:      p,
			maxAttempts: c.o.maxAttempts,
			retryable:   c.retryable,
			perAttempt:  p.PerAttemptTimeout,
			tel:         newRouteTelemetry(method, target),
			respType:    protoreg.ResponseType(method),
		}
		r.attemptName = "Attempt." + r.name
		if c.budgets != nil {
			r.budget = c.budgets.For(target)
		}
		if c.breakers != nil {
			r.breaker = c.breakers.For(target)
		}
		if p.MaxAttempts > 0 {
			r.maxAttempts = clampAttempts(p.MaxAttempts)
		}
		if p.RetryableCodes != 0 {
			r.retryable = p.RetryableCodes
		}
		if r.perAttempt == 0 {
			r.perAttempt = c.o.perAttempt
		}
		switch {
		case p.Hedging:
			r.hedge, r.hedgeDelay, r.maxHedges = true, p.HedgingDelay, p.MaxHedges
		case c.o.hedging:
			r.hedge, r.hedgeDelay = true, c.o.hedgeDelay
			if c.o.hedgeAttempts > 0 {
				r.maxAttempts = clampAttempts(c.o.hedgeAttempts)
			}
		}
		if r.maxHedges <= 0 || r.maxHedges >= r.maxAttempts {
			r.maxHedges = r.maxAttempts - 1
		}
		if r.hedge && r.hedgeDelay == 0 {
			r.lat = newLatency(c.hedgeQ)
		}
		return r
	})
}

// callSettings are the per-call options found among a call's CallOptions.
type callSettings struct {
	maxAttempts int
	noHedge     bool
	key         string
	hasKey      bool
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
		}
	}
	return s
}

// call is the state of one logical call, shared by the unary and the stream
// paths: one retry engine for both.
type call struct {
	c           *Client
	r           *route
	span        trace.Span
	recording   bool
	start       time.Time
	maxAttempts int
	repeatable  bool
	hedge       bool
	sent        int // attempts sent
	retries     int
	hedges      int
	backoffN    int       // retries since the last pushback
	last        time.Time // when the last attempt ended
}

// attemptMode says what context an attempt needs.
type attemptMode uint8

const (
	plainAttempt      attemptMode = iota // the call's context, or a per-attempt timeout
	cancelableAttempt                    // its own cancel (hedging)
	streamAttempt                        // its own cancel, no per-attempt timeout
)

// attempt is the state of one attempt.
type attempt struct {
	ctx     context.Context
	cancel  context.CancelFunc // nil when the attempt made no context of its own
	span    trace.Span
	ticket  breaker.Ticket
	kind    int
	start   time.Time
	timeout bool   // the attempt has its own per-attempt timeout
	ended   uint32 // atomic: 1 once end has run
}

// setup resolves the call's settings: the idempotency key (added to ctx),
// whether it may be repeated, its attempt limit, and whether it hedges.
// It returns the context to send attempts with.
func (k *call) setup(ctx context.Context, cs callSettings) (context.Context, error) {
	r := k.r
	key, hasKey := cs.key, cs.hasKey
	if !hasKey {
		key, hasKey = idempotency.KeyFromContext(ctx)
	}
	switch {
	case hasKey:
		if err := idempotency.ValidateKey(key); err != nil {
			return ctx, err
		}
		ctx = replaceOutgoing(ctx, idempotency.MetadataKey, key)
	case r.policy.Level == idempotency.RetryWithKey:
		// Only here does a key change anything (Repeatable); a key the
		// caller put in the metadata of another method is sent as is.
		if vs := metadata.ValueFromOutgoingContext(ctx, idempotency.MetadataKey); len(vs) == 1 {
			hasKey = true
		} else if !k.c.o.noKeys {
			ctx = metadata.AppendToOutgoingContext(ctx, idempotency.MetadataKey, idempotency.NewKey())
			hasKey = true
		}
	}
	k.repeatable = r.policy.Repeatable(hasKey)
	k.maxAttempts = 1
	if k.repeatable {
		k.maxAttempts = r.maxAttempts
		if cs.maxAttempts > 0 {
			k.maxAttempts = cs.maxAttempts
		}
	}
	k.hedge = k.repeatable && r.hedge && !cs.noHedge && k.maxAttempts > 1
	return ctx, nil
}

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

// startCall deposits into the budget and starts the call span.
func (k *call) startCall(ctx context.Context) context.Context {
	k.start = k.c.o.now()
	if b := k.r.budget; b != nil {
		if k.c.budgetAt {
			b.DepositAt(k.start)
		} else {
			b.Deposit()
		}
	}
	if t := k.c.tel.tracer; t != nil {
		ctx, k.span = t.Start(ctx, k.r.name, k.r.tel.callStart...)
		k.recording = k.span.IsRecording()
	}
	return ctx
}

// endCall records the call's outcome and ends its span.
func (k *call) endCall(ctx context.Context, err error) {
	st, _ := status.FromError(err)
	t := k.c.tel
	t.calls.Add(ctx, 1, k.r.tel.callOpts[codeIndex(st.Code())]...)
	if t.duration.Enabled(ctx) {
		end := k.last // when the last attempt ended, usually the call's end
		if end.IsZero() {
			end = k.c.o.now()
		}
		t.duration.Record(ctx, end.Sub(k.start).Seconds(), k.r.tel.callRecord...)
	}
	if k.retries > 0 {
		t.retries.Record(ctx, int64(k.retries), k.r.tel.callRecord...)
	}
	if k.hedges > 0 {
		t.hedges.Record(ctx, int64(k.hedges), k.r.tel.callRecord...)
	}
	endSpan(k.span, k.r.tel, st.Code(), st.Message())
}

// begin starts an attempt of the given kind: the deadline check, the
// breaker, the attempt's metadata, span and metrics. When the attempt may
// not be sent, begin returns why (ReasonDeadline or ReasonBreaker) and the
// status a first attempt fails with; nothing was sent.
func (k *call) begin(ctx context.Context, kind int, mode attemptMode) (attempt, Reason, error) {
	now := k.start // the first attempt starts with the call
	if k.sent > 0 {
		now = k.c.o.now()
	}
	actx, err := k.c.dl.AttemptContext(ctx, now)
	if err != nil {
		return attempt{}, ReasonDeadline, err
	}
	a := attempt{kind: kind, start: now}
	if b := k.r.breaker; b != nil {
		t, err := b.Admit()
		if err != nil {
			return attempt{}, ReasonBreaker, circuitOpenError(b)
		}
		a.ticket = t
	}
	if k.sent > 0 {
		actx = metadata.AppendToOutgoingContext(actx, PreviousAttemptsKey, strconv.Itoa(k.sent))
	}
	switch {
	case k.r.perAttempt > 0 && mode != streamAttempt:
		actx, a.cancel = context.WithTimeout(actx, k.r.perAttempt)
		a.timeout = true
	case mode != plainAttempt:
		actx, a.cancel = context.WithCancel(actx)
	}
	if k.recording {
		actx, a.span = k.c.tel.tracer.Start(actx, k.r.attemptName, k.r.tel.attemptStart[kind]...)
		a.span.SetAttributes(AttrPreviousAttempts.Int(k.sent))
	}
	if p := k.c.o.propagators; p != nil {
		md, ok := metadata.FromOutgoingContext(actx) // a copy
		if !ok {
			md = metadata.MD{}
		}
		p.Inject(actx, mdCarrier(md))
		actx = metadata.NewOutgoingContext(actx, md)
	}
	k.c.tel.attempts.Add(ctx, 1, k.r.tel.attemptOpts[kind]...)
	switch kind {
	case kindRetry:
		k.retries++
	case kindHedge:
		k.hedges++
	}
	k.sent++
	a.ctx = actx
	return a, "", nil
}

// mdCarrier lets propagators write into gRPC metadata, whose keys must be
// lower case (propagation.HeaderCarrier would write "Traceparent", which
// grpc refuses).
type mdCarrier metadata.MD

func (c mdCarrier) Get(key string) string {
	if vs := metadata.MD(c).Get(key); len(vs) > 0 {
		return vs[0]
	}
	return ""
}

func (c mdCarrier) Set(key, value string) { metadata.MD(c).Set(key, value) }

func (c mdCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// notSent records an attempt that begin refused. A first attempt fails
// with begin's status; a retry returns the last attempt's error, with the
// reason attached.
func (k *call) notSent(ctx context.Context, reason Reason, err, last error) error {
	if k.sent == 0 {
		ev := EventBreakerRejected
		if reason == ReasonDeadline {
			ev = EventDeadlineFast
		}
		k.refuse(ctx, reason, ev)
		return err
	}
	k.refuse(ctx, reason, EventRetryRefused)
	return annotate(last, reason)
}

// end reports an attempt's outcome: to the breaker, the latency tracker and
// its span. abandoned is true for a hedge cancelled because another attempt
// won, which says nothing about the target.
func (k *call) end(callCtx context.Context, a *attempt, err error, abandoned bool) {
	if !atomic.CompareAndSwapUint32(&a.ended, 0, 1) {
		return // a stream attempt may be ended by its receiver and by the caller leaving
	}
	code := status.Code(err)
	now := k.c.o.now()
	k.last = now
	switch {
	case abandoned || (code == codes.Canceled && callCtx.Err() != nil):
		a.ticket.Ignore()
		if abandoned && k.r.lat != nil {
			k.r.lat.observe(now.Sub(a.start)) // a lower bound: it was cut short
		}
	default:
		failed := code != codes.OK && k.c.failures.Has(code)
		if k.c.breakerAt {
			a.ticket.DoneAt(failed, now)
		} else {
			a.ticket.Done(failed)
		}
		if k.r.lat != nil && (code == codes.OK || !k.r.retryable.Has(code)) {
			k.r.lat.observe(now.Sub(a.start))
		}
	}
	if a.cancel != nil {
		a.cancel()
	}
	if a.span != nil {
		msg := ""
		if err != nil {
			msg = status.Convert(err).Message()
		}
		endSpan(a.span, k.r.tel, code, msg)
	}
}

// decide is called after a failed attempt: it returns the delay before the
// next attempt, or why there will be none. On a yes it has withdrawn a
// token from the budget. Refusals are recorded (event, metric, and the
// server's don't-retry marker) by refuse.
func (k *call) decide(ctx context.Context, err error, tr metadata.MD, a *attempt) (time.Duration, Reason, bool) {
	if ctx.Err() != nil {
		return 0, "", false // the caller is gone: nothing to decide
	}
	code := status.Code(err)
	perAttemptTimeout := a.timeout && code == codes.DeadlineExceeded
	if !k.r.retryable.Has(code) && !perAttemptTimeout {
		return 0, ReasonCode, false
	}
	if !k.repeatable {
		return 0, ReasonNotIdempotent, false
	}
	pushback, hasPushback, stop := parsePushback(tr)
	if stop {
		return 0, ReasonPushback, false
	}
	if k.sent >= k.maxAttempts {
		return 0, ReasonMaxAttempts, false
	}
	delay := pushback
	if !hasPushback {
		delay = k.backoff()
	} else {
		k.backoffN = 0
	}
	now := k.c.o.now()
	if d, ok := ctx.Deadline(); ok && !now.Add(delay).Before(d) {
		return 0, ReasonDeadline, false
	}
	if reason, ok := k.fund(now); !ok {
		return 0, reason, false
	}
	return delay, "", true
}

// fund checks that the breaker is not open and withdraws one retry or
// hedge from the budget; it is the last step before either is sent.
func (k *call) fund(now time.Time) (Reason, bool) {
	if b := k.r.breaker; b != nil && b.RetryAfter() > 0 {
		return ReasonBreaker, false
	}
	if b := k.r.budget; b != nil {
		ok := false
		if k.c.budgetAt {
			ok = b.WithdrawAt(now)
		} else {
			ok = b.Withdraw()
		}
		if !ok {
			return ReasonBudget, false
		}
	}
	return "", true
}

// backoff returns the next exponential backoff with jitter: a random time
// in [d/2, d] with d = min(max, base·2ⁿ).
func (k *call) backoff() time.Duration {
	d := k.c.o.backoffBase << min(k.backoffN, 30)
	if d <= 0 || d > k.c.o.backoffMax {
		d = k.c.o.backoffMax
	}
	k.backoffN++
	return d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
}

// parsePushback reads grpc-retry-pushback-ms from trailers: has is true for
// one value ≥ 0 (the delay); stop is true for a negative or malformed value
// or several values.
func parsePushback(tr metadata.MD) (delay time.Duration, has, stop bool) {
	vs := tr[PushbackKey]
	switch len(vs) {
	case 0:
		return 0, false, false
	case 1:
	default:
		return 0, false, true
	}
	ms, err := strconv.ParseInt(vs[0], 10, 32)
	if err != nil || ms < 0 {
		return 0, false, true
	}
	return time.Duration(ms) * time.Millisecond, true, false
}

// refuse records that a retry, a hedge or a call was refused, and returns
// the reason.
func (k *call) refuse(ctx context.Context, reason Reason, event string) {
	k.c.tel.refusals.Add(ctx, 1, k.r.tel.refusalOpts[reason]...)
	if k.recording {
		k.span.AddEvent(event, trace.WithAttributes(AttrReason.String(string(reason))))
	}
	if reason.propagates() {
		markRefused(ctx)
	}
}

func (k *call) event(name string, attrs ...attribute.KeyValue) {
	if k.recording {
		k.span.AddEvent(name, trace.WithAttributes(attrs...))
	}
}

// propagates reports whether a refusal for this reason makes the server
// interceptor (if the call is made from a handler) tell its own callers not
// to retry: the layer closest to the failure has already retried, or
// decided that retrying would hurt, so the layers above must not multiply.
func (r Reason) propagates() bool {
	switch r {
	case ReasonBudget, ReasonBreaker, ReasonPushback, ReasonMaxAttempts:
		return true
	}
	return false
}

// annotates reports whether the returned status gets an ErrorInfo saying
// why it was not retried.
func (r Reason) annotates() bool {
	switch r {
	case ReasonBudget, ReasonBreaker, ReasonDeadline, ReasonPushback:
		return true
	}
	return false
}

// sleep waits d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// retryScheduled records a retry decision on the call span.
func (k *call) retryScheduled(err error, delay time.Duration, tr metadata.MD) {
	if !k.recording {
		return
	}
	attrs := []attribute.KeyValue{AttrCause.String(codename.Name(status.Code(err))), AttrDelay.Float64(delay.Seconds())}
	if vs := tr[PushbackKey]; len(vs) == 1 {
		attrs = append(attrs, AttrPushback.String(vs[0]))
	}
	k.span.AddEvent(EventRetryScheduled, trace.WithAttributes(attrs...))
}
