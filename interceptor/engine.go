package interceptor

import (
	"context"
	"math"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"time"

	"github.com/stormguard/stormguard/semconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/deadline"
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/internal/codename"
	"github.com/stormguard/stormguard/internal/svcconfig"
)

// The attempt engine. A call is the state of one logical call; run is its
// one loop: it opens an attempt (the gates, in a fixed order: deadline,
// breaker, budget, endpoint), hands it to the call's sender (a unary
// invocation, a hedged group, a stream), settles what came back (the
// attempt ends; decide says whether a retry follows, and when) and waits.
// Every call shape goes through it; the hedged sender, which has several
// attempts in flight, opens and settles each of them with the same
// functions.

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

// plan is what a call may do, settled when it starts (grpcRetry may change
// when the method's service config is read again).
type plan struct {
	maxAttempts int
	asked       int  // the call option MaxAttempts (0: none)
	repeatable  bool // the method may be repeated (retried or hedged)
	hedge       bool // hedges follow a slow attempt
	beside      bool // a per-attempt timeout sends a retry beside the slow attempt (see hedger)
	grpcRetry   bool // grpc-go's retryPolicy covers the method: one attempt of ours
}

// tally is what a call has sent.
type tally struct {
	sent     int // attempts sent
	retries  int
	hedges   int
	prior    int // attempts the logical call's earlier tries sent (outer.go)
	backoffN int // retries since the last pushback
	// The time the call had no attempt in flight between two of its
	// attempts (gRFC A96's retry delay): live counts the attempts opened
	// and not yet settled, idleFrom is when the last of them was settled
	// (zero while one is in flight), and an attempt opened after it adds
	// the gap to idle.
	live     int
	idleFrom time.Time
	idle     time.Duration
}

// deadlines are a call's deadline, and that of the context its attempts
// derive from (the first is tightened when a service-config timeout is
// read late).
type deadlines struct {
	at, ctxAt time.Time
	ok, ctxOK bool
}

// payment is how the next retry of a call is paid for.
type payment uint8

const (
	payBudget   payment = iota // a token from the budget
	payFailover                // a fail-over from an outlier endpoint: free, unless it cannot fail over (attemptCreds)
	payPrepaid                 // withdrawn when its attempt was cut at its per-attempt timeout (perTry)
)

// grpcWatch is what a call knows of grpc-go's own retries of its method.
type grpcWatch struct {
	off     bool          // installed by DialOptions: grpc-go does not retry
	mc      *methodConfig // the method's service config, as last read
	watched *grpcRetries  // installed by hand, a retryPolicy: what grpc-go does is watched
}

// outerTry is what a call knows of a retry loop outside the suite
// (outer.go).
type outerTry struct {
	// back is the logical call this try is one of, when a failed try came
	// back: this try deposits nothing and its first attempt is a retry.
	back    *returned
	req     any    // a unary call's request: a try is found by it (nil for streams)
	madeKey string // the idempotency key the suite made for the call, if any
	// scope identifies the caller's logical call (callerScope; nil: none),
	// and done is the caller's Done channel.
	scope any
	done  <-chan struct{}
}

// callerDone reports whether the caller's context is done.
func (o *outerTry) callerDone() bool {
	select {
	case <-o.done:
		return true
	default:
		return false
	}
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

// call is the state of one logical call.
type call struct {
	client    *Client
	route     *route
	cc        *grpc.ClientConn
	ctx       context.Context // the call's: attempts derive from it
	span      trace.Span
	recording bool
	timed     bool // an attempt's end time is needed even on success (duration metric, latency)
	start     time.Time
	dl        deadlines
	plan      plan
	tally     tally
	pay       payment
	stopped   bool  // a server said "do not retry": no attempt follows any more
	dry       bool  // the server said its retry budget could not pay for a retry: the budget pays from its credit, never lent
	lastErr   error // the last attempt's error
	avoid     []net.Addr
	failedOn  []net.Addr // the endpoints the call's attempts failed on
	grpc      grpcWatch
	outer     outerTry
	prio      callPriority
	// rule is how the call retries and hedges: its route's, or the service
	// config's policy for its method (applyServiceConfig).
	rule *retryRule
	// watch is the service config of a ClientConn dialed with DialOptions
	// (nil: installed by hand); hasKey, that the call has an idempotency
	// key; scIgnored, why the service config's policy was not applied.
	watch     *svcconfig.Watch
	hasKey    bool
	scIgnored string
	// throttle is the service config's retryThrottling when the call
	// started (nil: none).
	throttle *svcconfig.Throttle
}

// start resolves the call's settings from the caller's ctx: the
// idempotency key, whether it may be repeated, its attempt limit, whether
// it hedges, and its deadline (the method's service-config timeout applies
// once to the whole call, when it is tighter than the caller's deadline; a
// Client default timeout to calls that have none). It sets c.ctx to the
// context the attempts are sent with, deposits into the budget and starts
// the call span, and returns the CancelFunc to call when the call is over.
func (c *call) setup(ctx context.Context, cs callSettings, cc *grpc.ClientConn, w *svcconfig.Watch) (context.CancelFunc, error) {
	r := c.route
	c.cc, c.watch, c.grpc.off = cc, w, w != nil
	c.rule = &r.rule
	c.start = c.client.now()
	if c.outer.req != nil {
		c.outer.scope, c.outer.done = callerScope(ctx), ctx.Done()
		c.outer.back = c.client.cameBack(c.outer.scope, r, c.outer.req, c.start)
	}
	if b := c.outer.back; b != nil {
		c.tally.prior, c.lastErr = b.attempts, b.err()
	}
	ctx, hasKey, err := c.withKey(ctx, cs)
	if err != nil {
		return noCancel, err
	}
	p := &c.plan
	c.hasKey, p.asked = hasKey, cs.maxAttempts
	p.repeatable = r.policy.Repeatable(hasKey)
	mc := r.methodConfig(cc, c.start, w)
	c.throttle = mc.throttle
	c.applyServiceConfig(mc)
	c.applyGRPCRetry(mc)
	c.setMaxAttempts()
	// A try that came back is already a retry: it neither hedges nor
	// sends a retry beside a slow attempt.
	more := p.repeatable && !p.grpcRetry && p.maxAttempts > 1 && c.outer.back == nil
	p.hedge = more && c.rule.hedge && !cs.noHedge
	p.beside = more && r.perAttempt > 0
	if metadata.ValueFromOutgoingContext(ctx, deadline.MetadataKey) != nil {
		ctx = removeOutgoing(ctx, deadline.MetadataKey) // stale: the attempts send their own
	}
	ctx = c.prio.from(ctx)
	cancel := noCancel
	dl, ok := ctx.Deadline()
	switch {
	case mc.timeout > 0 && (!ok || c.start.Add(mc.timeout).Before(dl)):
		ctx, cancel = context.WithDeadline(ctx, c.start.Add(mc.timeout))
	case !ok && c.client.dl.DefaultTimeout() > 0:
		ctx, cancel = context.WithDeadline(ctx, c.start.Add(c.client.dl.DefaultTimeout()))
	}
	c.dl.at, c.dl.ok = ctx.Deadline()
	c.dl.ctxAt, c.dl.ctxOK = c.dl.at, c.dl.ok
	if !c.client.o.noFailover {
		c.avoid = r.endpoints.current(c.start)
	}
	if c.outer.back == nil { // a try that came back: its logical call deposited
		r.budget.DepositAt(c.start) // a nil budget does nothing
	}
	c.timed = r.lat != nil || c.client.tel.duration.Enabled(ctx)
	if t := c.client.tel.tracer; t != nil {
		ctx, c.span = t.Start(ctx, r.tel.name, r.tel.callSpan...)
		c.recording = c.span.IsRecording()
		if c.recording && p.grpcRetry {
			c.span.SetAttributes(semconv.AttrGRPCRetryPolicy.Bool(true))
		}
		if c.recording && c.outer.back != nil {
			c.span.SetAttributes(semconv.AttrOuterRetry.Bool(true))
		}
		if c.recording && c.prio.set {
			c.span.SetAttributes(semconv.AttrPriority.String(c.prio.p.String()))
		}
	}
	c.ctx = ctx
	return cancel, nil
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
			if b := c.outer.back; b != nil && b.idemKey != "" {
				c.outer.madeKey = b.idemKey
			} else {
				c.outer.madeKey = idempotency.NewKey()
			}
			ctx = metadata.AppendToOutgoingContext(ctx, idempotency.MetadataKey, c.outer.madeKey)
			hasKey = true
		}
	}
	return ctx, hasKey, nil
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

// setMaxAttempts sets the call's attempt limit: one for a call that may not
// be repeated; else its rule's, or the MaxAttempts call option's.
func (c *call) setMaxAttempts() {
	p := &c.plan
	p.maxAttempts = 1
	if p.repeatable {
		p.maxAttempts = c.rule.maxAttempts
		if p.asked > 0 {
			p.maxAttempts = p.asked
		}
	}
}

// applyGRPCRetry notes whether grpc-go retries the method itself: its
// service config has a retryPolicy and grpc-go's retries are not known to
// be off (DialOptions turns them off; installed by hand, the Client
// watches what grpc-go does with such calls: see grpcRetries). Sending
// more attempts of our own would multiply grpc-go's; when its retries are
// off, the suite retries as for any other method.
func (c *call) applyGRPCRetry(mc *methodConfig) {
	c.grpc.mc = mc
	if c.grpc.off || !c.plan.repeatable {
		return
	}
	if !mc.grpcRetry {
		// Read before the ClientConn was ready, the config may not be
		// grpc's yet: the attempt is watched all the same, in case its
		// failure shows a retryPolicy (see noteGRPCRetries).
		if mc.provisional && c.grpc.watched == nil {
			c.grpc.watched = c.watchedOf(mc)
		}
		return
	}
	if c.grpc.watched == nil {
		c.grpc.watched = c.watchedOf(mc)
	}
	switch {
	case c.grpc.watched != nil && c.grpc.watched.off.Load():
		c.plan.grpcRetry = false
	case !c.plan.grpcRetry:
		c.plan.grpcRetry = true
		c.client.warnGRPCRetry(c.route)
	}
}

// watchedOf returns what the Client has seen of grpc-go's retries on the
// call's ClientConn, looked up once per method config read.
func (c *call) watchedOf(mc *methodConfig) *grpcRetries {
	if w := mc.watched.Load(); w != nil {
		return w
	}
	w := c.client.grpcRetriesOf(c.cc)
	if w != nil && mc.cc == c.cc {
		mc.watched.Store(w)
	}
	return w
}

// recheckMethodConfig reads the method's service config again after a
// failed attempt (see route.readMethodConfig): a retryPolicy found now
// stops the suite's retries, and a method timeout bounds the rest of the
// call, measured from its start, when it is tighter than its deadline.
func (c *call) recheckMethodConfig(now time.Time) {
	mc := c.route.readMethodConfig(c.cc, now, c.watch)
	if c.applyServiceConfig(mc); c.rule == mc.rule {
		c.setMaxAttempts()
	}
	c.applyGRPCRetry(mc)
	if mc.timeout > 0 {
		if dl := c.start.Add(mc.timeout); !c.dl.ok || dl.Before(c.dl.at) {
			c.dl.at, c.dl.ok = dl, true
		}
	}
}

// sender sends the attempts of one call shape.
type sender interface {
	// attempt returns a new attempt for open to fill.
	attempt() *attempt
	// send sends attempt a, which open has admitted, and returns what came
	// back. It settles a pick the attempt was sent to (atPick).
	send(c *call, a *attempt) outcome
}

// outcome is what a sender got for an attempt.
type outcome struct {
	err error
	tr  metadata.MD
	// refused: the attempt was refused at its pick, never sent (atPick);
	// err is the status a first attempt fails with.
	refused Reason
	// kept: the attempt stays open (a stream handed to the caller), and
	// is ended later by its sender.
	kept bool
	// settled: the sender settled the call itself (a hedged group): err
	// is the call's.
	settled bool
}

// verdict is what the engine makes of a settled attempt.
type verdict struct {
	retry  bool          // send another attempt, after delay
	delay  time.Duration // backoff or pushback
	reason Reason        // why not, when !retry ("" on success or when the caller left)
	err    error         // the attempt's error
	tr     metadata.MD   // the attempt's trailer
}

// firstKind is the kind of a call's first attempt: a retry for a try that
// came back through a retry loop outside the suite.
func (c *call) firstKind() attemptKind {
	if c.outer.back != nil {
		return kindRetry
	}
	return kindFirst
}

// run is the engine's loop: it sends the call's attempts through s, from
// one of the given kind, until one succeeds, is kept, or no retry may
// follow, and returns the call's error.
func (c *call) run(s sender, kind attemptKind, mode attemptMode) error {
	for {
		a := s.attempt()
		if reason, err := c.open(a, kind, mode); reason != "" {
			return c.notSent(reason, err)
		}
		out := s.send(c, a)
		switch {
		case out.settled:
			return out.err
		case out.refused != "":
			return c.notSent(out.refused, out.err)
		case out.kept:
			return nil
		}
		v := c.settle(a, out.err, out.tr)
		if !v.retry {
			return c.conclude(v)
		}
		c.scheduled(v)
		if err := c.wait(v.delay); err != nil {
			return err
		}
		kind = kindRetry
	}
}

// open starts attempt a of the given kind: the gates (time left, the
// breaker, then, for retries and hedges, a token from the budget), then
// the attempt's metadata, context, span and metrics. When a may not be
// sent, open returns why and the status a first attempt fails with;
// nothing was sent and nothing was withdrawn.
func (c *call) open(a *attempt, kind attemptKind, mode attemptMode) (Reason, error) {
	now := c.start // the first attempt starts with the call
	if c.tally.sent > 0 {
		now = c.client.now()
	}
	*a = attempt{kind: kind, start: now, shared: mode == streamAttemptMode}
	if reason, err := c.gate(a, now); reason != "" && c.enforce(reason, a) {
		a.ticket.Ignore()
		if !c.probe(a, now, reason) {
			return reason, err
		}
	}
	if c.pay == payPrepaid {
		c.pay = payBudget
	}
	actx := c.ctx
	if n := c.tally.prior + c.tally.sent; n > 0 {
		actx = metadata.AppendToOutgoingContext(actx, semconv.PreviousAttemptsKey, strconv.Itoa(n))
		if a.paid && c.route.budget != nil && !c.client.o.shadow {
			// The budget paid for this retry or hedge: a stormguard
			// server that trusts this client need not charge it to its
			// own budget again (see WithTrustedBudgets).
			actx = metadata.AppendToOutgoingContext(actx, semconv.BudgetedKey, "1")
		}
	}
	actx = c.attemptContext(actx, a, now, mode)
	rt := c.route.tel
	ao := rt.attemptOpts(kind)
	if c.recording {
		actx, a.span = c.client.tel.tracer.Start(actx, c.route.tel.attemptSpanName(), ao.span...)
		a.span.SetAttributes(semconv.AttrPreviousAttempts.Int(c.tally.prior + c.tally.sent))
	}
	if p := c.client.o.propagators; p != nil {
		md, ok := metadata.FromOutgoingContext(actx) // a copy
		if !ok {
			md = metadata.MD{}
		}
		p.Inject(actx, mdCarrier(md))
		actx = metadata.NewOutgoingContext(actx, md)
	}
	if a.guarded == nil && !a.free {
		c.client.tel.attempts.Add(c.ctx, 1, ao.metric...)
	}
	if c.tally.live == 0 && !c.tally.idleFrom.IsZero() {
		c.tally.idle += now.Sub(c.tally.idleFrom)
		c.tally.idleFrom = time.Time{}
	}
	c.tally.live++
	switch kind {
	case kindRetry:
		c.tally.retries++
	case kindHedge:
		c.tally.hedges++
	}
	c.tally.sent++
	a.ctx = actx
	return "", nil
}

// gate asks, in order, the deadline, the breaker, the budget and the
// endpoint table whether attempt a may be sent at now, and takes what it
// is sent with: the breaker's ticket, the budget's token. It returns why
// not, with the status a first attempt refused fails with; enforce has the
// last word.
func (c *call) gate(a *attempt, now time.Time) (Reason, error) {
	if c.dl.ok {
		if err := c.client.dl.Check(c.dl.at.Sub(now)); err != nil {
			return ReasonDeadline, err
		}
	}
	if b := c.route.breaker; b != nil {
		t, err := b.AdmitAt(now)
		switch {
		case err == nil:
			a.ticket = t
		case a.kind == kindFirst && c.guardPick(now):
			// Refused at the pick, and only if it picks an endpoint that
			// served nothing (see guardPick).
			a.guarded = b
		default:
			return ReasonBreaker, circuitOpenError(c.route, b, now)
		}
		if a.kind != kindFirst && !a.probe && servedNothing(c.route, b, now, c.watch) {
			return ReasonBreaker, nil
		}
	}
	switch {
	case a.kind == kindFirst:
	case c.throttle.Throttled():
		return ReasonThrottle, nil
	case a.probe: // a probe of a locked route (outer.go): nobody pays
	case a.kind == kindRetry && c.pay == payPrepaid:
		a.paid = true // withdrawn at its per-attempt timeout (perTry)
	case a.kind == kindRetry && c.pay == payFailover:
		a.free = true // the budget pays at the pick if it cannot fail over
	case a.kind == kindHedge:
		if !c.route.budget.HedgeAt(now) { // a nil budget grants
			return ReasonBudget, nil
		}
		a.paid = true
	case !c.withdraw(now): // a nil budget grants
		return ReasonBudget, nil
	default:
		a.paid = true
	}
	return "", nil
}

// enforce is the gates' last word on attempt a (nil: a retry being decided,
// before its backoff): it reports whether refusal r stands. In shadow mode
// the breaker's and the budget's refusals do not: the attempt is sent all
// the same, marked shadowed so that its outcome teaches the breaker and
// the endpoint table nothing, and the refusal it would have had is
// recorded when it is sent.
func (c *call) enforce(r Reason, a *attempt) bool {
	if !c.client.o.shadow || (r != ReasonBreaker && r != ReasonBudget) {
		return true
	}
	if a != nil {
		c.wouldRefuse(r)
		a.shadow()
	}
	return false
}

// probe decides whether the first attempt a of a try that came back (a
// retry loop outside the suite), refused at now for reason, is sent all
// the same, as a probe of its locked route (see outerGate): the budget
// does not pay for it, the deadline, the breaker (when open) and the
// service config's throttle still apply. It reports whether a was
// admitted so.
func (c *call) probe(a *attempt, now time.Time, reason Reason) bool {
	if c.outer.back == nil || c.tally.sent > 0 || (reason != ReasonBudget && reason != ReasonBreaker) {
		return false
	}
	if !c.route.outer.probeDue(now, c.route.servedLately(now)) {
		return false
	}
	*a = attempt{kind: a.kind, start: a.start, shared: a.shared, probe: true}
	if reason, _ := c.gate(a, now); reason != "" {
		a.ticket.Ignore()
		return false
	}
	c.event(semconv.EventOuterProbe, semconv.AttrReason.String(string(reason)))
	return true
}

// shadow marks a, in shadow mode, as an attempt the Client would not have
// sent: the breaker does not count it.
func (a *attempt) shadow() {
	a.ticket.Ignore()
	a.ticket, a.shadowed = breaker.Ticket{}, true
}

// guardPick decides, for a first attempt that an open breaker refuses,
// whether to refuse it at the pick instead: when the target's endpoints
// that served nothing lately are known, the attempt avoids them (picking
// again, as for outliers) and is refused only if it still picks one. An
// endpoint that serves (a healthy backend whose connection was not ready
// when the others failed, a new one) gets the call: an open breaker never
// refuses what no retries would have sent successfully. A target whose
// every endpoint has failed is refused as before, before anything is sent.
func (c *call) guardPick(now time.Time) bool {
	if c.client.o.noFailover {
		return false
	}
	dead := c.route.endpoints.dead(now)
	if len(dead) == 0 {
		return false
	}
	avoid := make([]net.Addr, 0, len(dead)+len(c.avoid))
	avoid = append(append(avoid, dead...), c.avoid...)
	c.avoid = avoid
	return true
}

// atPick settles what an attempt's pick decided (see attemptCreds), once
// the sender has sent it: a first attempt an open breaker sent to the pick
// was refused there if it picked an endpoint that served nothing; a
// fail-over retry with nowhere to go was not sent if the budget would not
// pay for it. Such an attempt was never sent: atPick undoes open for it
// and returns why, with the status a first attempt fails with. Otherwise
// the attempt is counted as sent. In shadow mode nothing is refused at the
// pick; what would have been is recorded.
func (c *call) atPick(a *attempt) (Reason, error) {
	if a.guarded == nil && !a.free {
		return "", nil
	}
	refused := a.creds != nil && (a.creds.refused || a.creds.unpaid)
	reason := ReasonBreaker
	if a.free {
		reason = ReasonBudget
	}
	guarded := a.guarded
	a.guarded, a.free = nil, false
	if !refused || !c.enforce(reason, a) {
		c.client.tel.attempts.Add(c.ctx, 1, c.route.tel.attemptOpts(a.kind).metric...)
		return "", nil
	}
	c.tally.sent--
	if c.tally.live--; c.tally.live == 0 {
		c.tally.idleFrom = c.client.now() // it was never in flight
	}
	switch a.kind {
	case kindRetry:
		c.tally.retries--
	case kindHedge:
		c.tally.hedges--
	}
	var err error
	msg := "stormguard: no other endpoint to fail over to, and no budget"
	if guarded != nil {
		err = circuitOpenError(c.route, guarded, c.client.now())
		msg = status.Convert(err).Message()
	}
	a.unsent(msg)
	return reason, err
}

// unheard reports whether some of the endpoints the resolver gave the
// ClientConn (known through DialOptions: w not nil) have not answered an
// attempt yet, as far as the target's endpoint table knows.
func unheard(r *route, w *svcconfig.Watch) bool {
	return w != nil && w.Endpoints() > int(r.endpoints.n.Load())
}

// minServedNothing is how many attempts, all failed, say that a target
// serves nothing lately (see servedNothing).
const minServedNothing = 3

// servedNothing reports whether the target serves nothing lately: its
// endpoints' recent window (the last 3 to 4 seconds) or, while no endpoint
// is known, the breaker's window holds at least minServedNothing attempts,
// all failed. A retry or a hedge is then refused when it is due (a first
// attempt never is: refusing it would cost what no retries would have
// had). The breaker itself opens only when its whole window (10 s by
// default) holds failures, with at least MinAttempts; this stops the
// retries of a dead target's callers sooner, so that the hop next to it
// refuses, and says so to the hops above. Through DialOptions (w not nil),
// while fewer endpoints have answered than the resolver gave, the target
// has not served nothing for sure: a fresh ClientConn's first failures
// may all come from the one endpoint that was ready first.
func servedNothing(r *route, b *breaker.Breaker, now time.Time, w *svcconfig.Watch) bool {
	if unheard(r, w) {
		return false
	}
	if ok, fail, known := r.endpoints.totals(now); known {
		return ok == 0 && fail >= minServedNothing
	}
	st := b.StatsAt(now)
	return st.State == breaker.StateClosed && st.Attempts >= minServedNothing && st.Failures == st.Attempts
}

// attemptContext gives attempt a the context it needs beyond the call
// context's: the call's deadline when it was tightened after the context
// was made (a service-config timeout read late); the per-attempt timeout,
// when it is tighter and a retry may follow (see perTry); and a cancel
// when the mode needs one.
func (c *call) attemptContext(ctx context.Context, a *attempt, now time.Time, mode attemptMode) context.Context {
	var dl time.Time
	if c.dl.ok && (!c.dl.ctxOK || c.dl.at.Before(c.dl.ctxAt)) {
		dl = c.dl.at
	}
	var perTry time.Duration
	if p := c.route.perAttempt; p > 0 && mode == plainAttempt {
		// Only a reply that is not a proto message (a custom codec) is
		// retried on a per-attempt timeout here; the others are run by
		// the hedger, which does not cancel the slow attempt.
		if pdl := now.Add(p); (!c.dl.ok || pdl.Before(c.dl.at)) && c.mayFollow() {
			perTry = p
		}
	}
	switch {
	case perTry > 0:
		// Cut by perTry's timer, only if a retry can follow then.
		if dl.IsZero() {
			ctx, a.cancel = context.WithCancel(ctx)
		} else {
			ctx, a.cancel = context.WithDeadline(ctx, dl)
		}
		a.pt = c.newPerTry(perTry, a.cancel)
	case !dl.IsZero():
		ctx, a.cancel = context.WithDeadline(ctx, dl)
	case mode != plainAttempt:
		ctx, a.cancel = context.WithCancel(ctx)
	}
	return ctx
}

// settle ends attempt a, which came back with err and trailer tr, and
// decides what the call does next: the one place where a finished attempt
// turns into a retry, a fail-over, or a refusal. It records nothing about
// the decision: a retry is recorded by whoever sends it (scheduled), a
// refusal by conclude.
func (c *call) settle(a *attempt, err error, tr metadata.MD) verdict {
	now := c.end(a, err, false)
	c.tally.live--
	if err == nil {
		return verdict{}
	}
	if c.tally.live == 0 {
		c.tally.idleFrom = now
	}
	c.route.yield.overloaded(now, err, tr)
	c.lastErr = err
	v := verdict{err: err, tr: tr}
	v.delay, v.reason, v.retry = c.decide(err, tr, a)
	return v
}

// decide applies the retry rules, in order, to a failed attempt. A yes is
// tentative: the gates are asked again, and a token withdrawn, only when
// the retry is sent (open).
func (c *call) decide(err error, tr metadata.MD, a *attempt) (time.Duration, Reason, bool) {
	if c.ctx.Err() != nil {
		return 0, "", false // the caller is gone: nothing to decide
	}
	// A server's "do not retry" comes first: it may come with any code (a
	// stormguard server refusing on arrival answers DEADLINE_EXCEEDED),
	// and it says the attempt was not run, not that the call is settled.
	pushback, hasPushback, stop := parsePushback(tr)
	if stop || c.stopped {
		c.stopped = true // for the attempts still running (hedged calls)
		return 0, ReasonPushback, false
	}
	c.dry = budgetDry(tr)
	now := c.client.now()
	if w := c.watch; w != nil && c.grpc.mc.gen != w.Generation() {
		// The resolver gave another service config since the call read
		// it (a fresh ClientConn's first call runs before it has any):
		// its policy for the method applies from this decision on.
		c.recheckMethodConfig(now)
	}
	code := status.Code(err)
	if !c.rule.retryable.Has(code) && !(a.timeout && code == codes.DeadlineExceeded) {
		return 0, ReasonCode, false
	}
	if !c.plan.repeatable {
		return 0, ReasonNotIdempotent, false
	}
	c.throttle.Failure() // a nil throttle counts nothing
	c.recheckMethodConfig(now)
	if c.plan.grpcRetry {
		return 0, ReasonGRPCRetry, false
	}
	if c.tally.sent >= c.plan.maxAttempts {
		return 0, ReasonMaxAttempts, false
	}
	if f := c.client.o.retryIf; f != nil && !f(c.ctx, c.route.method, err) {
		return 0, ReasonRetryIf, false
	}
	// A google.rpc.RetryInfo in the status is a server's pushback too: the
	// retry waits at least its retry_delay (the longer of the two, when
	// both came), and none is sent for a delay beyond MaxPushback.
	ri, hasRI, riStop := parseRetryInfo(err)
	if riStop {
		c.stopped = true
		return 0, ReasonPushback, false
	}
	delay := pushback
	if hasRI && (!hasPushback || ri > delay) {
		delay, hasPushback = ri, true
	}
	if hasPushback {
		c.tally.backoffN = 0
	} else {
		delay = c.backoff()
	}
	if c.dl.ok && !now.Add(delay).Before(c.dl.at) {
		return 0, ReasonDeadline, false
	}
	c.failOver(a, now)
	if c.dry && c.dryEverywhere(a, now) {
		return 0, ReasonBudget, false
	}
	if reason := c.fundable(now); reason != "" {
		return 0, reason, false
	}
	return delay, "", true
}

// fundable returns why a retry could not be paid for now (the breaker is
// open, the target has served nothing for sure, or the budget has no
// token), or "" if it could. It withdraws nothing (open does, when the
// retry is sent), so that a caller is not made to wait a backoff for a
// retry that is refused anyway; a refusal is counted by the budget as the
// withdrawal it stands for. In shadow mode (enforce), open records what it
// would refuse, when the retry is due.
func (c *call) fundable(now time.Time) Reason {
	var r Reason
	switch {
	case c.throttle.Throttled():
		return ReasonThrottle // the service config's retryThrottling: no shadow mode
	case c.route.breaker != nil && (c.route.breaker.RetryAfterAt(now) > 0 || c.deadForSure(now)):
		r = ReasonBreaker
	case c.route.budget != nil && c.pay == payBudget && !c.client.o.shadow && !c.peek(now):
		r = ReasonBudget
	}
	if r != "" && !c.enforce(r, nil) {
		return ""
	}
	return r
}

// peek asks the budget whether it would pay for the retry being decided at
// now: from its credit alone when the server said its own retry budget
// could not pay (a client's start-up loan is for a failure the fleet's
// server has not yet paid for: its server, which sees the fleet, knows
// better).
func (c *call) peek(now time.Time) bool {
	if c.dry {
		return c.route.budget.PeekNoNewLoanAt(now)
	}
	return c.route.budget.PeekAt(now)
}

// withdraw takes the retry's token from the budget at now, from its
// credit alone when the server said its budget was dry (see peek).
func (c *call) withdraw(now time.Time) bool {
	if c.dry {
		return c.route.budget.WithdrawNoNewLoanAt(now)
	}
	return c.route.budget.WithdrawAt(now)
}

// dryEverywhere is the retry's answer to a server that said its retry
// budget could not pay for it (semconv.BudgetDryKey): the server speaks
// for its own endpoint, which would refuse the retry, so the retry avoids
// it, and every endpoint that failed an attempt in the last 10 s (their
// servers are likely dry too; see endpoints.failedLately). It
// reports whether that leaves no endpoint the target's table knows: then
// the retry is not sent. Otherwise it goes, picking again away from them,
// and is paid for by the budget from its credit (see peek); with
// WithoutFailover it picks as any attempt does.
func (c *call) dryEverywhere(a *attempt, now time.Time) bool {
	avoid := slices.Clip(c.avoid)
	if p := a.peer(); p != nil && !slices.Contains(avoid, p) {
		avoid = append(avoid, p)
	}
	avoid, all := c.route.endpoints.failedLately(avoid, now)
	if !c.client.o.noFailover {
		c.avoid = avoid
	}
	return all
}

// budgetDry reports whether trailer tr says the server's retry budget
// could not pay for a retry (semconv.BudgetDryKey).
func budgetDry(tr metadata.MD) bool {
	vs := tr[semconv.BudgetDryKey]
	return len(vs) == 1 && vs[0] == "1"
}

// failOver decides whether the retry after attempt a is a fail-over: a
// failed on an endpoint that fails while the target's other endpoints
// serve (see endpoints.outliers). Every attempt avoids such endpoints, so
// a fail-over retry goes to one that serves: it is not added load on a
// failing service, and the budget does not pay for it; the breaker and the
// attempt limit still apply. If its picks all go to endpoints it avoids
// (grpc has no other endpoint ready), it fails over to nothing: the budget
// pays for it at the pick, or it is not sent (see attemptCreds), and
// attempts avoid nothing for a while (endpoints.nowhereElse).
func (c *call) failOver(a *attempt, now time.Time) {
	if c.pay == payFailover {
		c.pay = payBudget
	}
	if c.client.o.noFailover {
		return
	}
	p := a.peer()
	c.avoid = c.route.endpoints.current(now)
	if p != nil && !slices.Contains(c.avoid, p) {
		c.avoid = c.route.endpoints.judge(now) // this failure may make it one
	}
	if p != nil && !slices.Contains(c.avoid, p) && unheard(c.route, c.watch) {
		// Endpoints the resolver gave have not answered yet (a fresh
		// ClientConn whose first picks went to p): the retry fails over to
		// one of them, avoiding p, or, with nowhere else to go, is paid.
		c.avoid = append(slices.Clip(c.avoid), p)
	}
	if p != nil && slices.Contains(c.avoid, p) && c.pay == payBudget {
		c.pay = payFailover
	}
	if p != nil {
		c.failedOn = append(c.failedOn, p)
	}
}

// minDeadForSure is the evidence fundable wants to refuse a retry at once
// because the target serves nothing: more than open wants when the retry
// is due (minServedNothing), because a fresh client's first callers may see
// a few failures before any success has come back, and their retries must
// then wait for the successes, not be refused.
const minDeadForSure = 10

// deadForSure reports whether the target's endpoints have served nothing
// lately, with at least minDeadForSure failures: a retry would be refused
// when due, so the caller need not wait a backoff for it.
func (c *call) deadForSure(now time.Time) bool {
	if unheard(c.route, c.watch) {
		return false
	}
	ok, fail, known := c.route.endpoints.totals(now)
	return known && ok == 0 && fail >= minDeadForSure
}

// conclude ends the call with the verdict's error: it records the refusal
// (event, metric, and the server's don't-retry marker) and annotates the
// status when the table says so.
func (c *call) conclude(v verdict) error {
	if v.reason != "" {
		c.refuse(v.reason, semconv.EventRetryRefused)
	}
	return annotate(v.err, v.reason, c.client.o.noMarker)
}

// notSent ends the call when an attempt was refused before it was sent:
// a first attempt fails with the gate's status; a retry (and the first
// attempt of a try that came back, refused as a retry) returns the last
// attempt's error, annotated.
func (c *call) notSent(reason Reason, err error) error {
	if c.tally.sent == 0 && (c.outer.back == nil || err != nil) {
		c.refuse(reason, reason.info().firstEvent)
		return err
	}
	c.refuse(reason, semconv.EventRetryRefused)
	return annotate(c.lastErr, reason, c.client.o.noMarker)
}

// refuse records that a retry, a hedge or a call was refused.
func (c *call) refuse(reason Reason, event string) {
	var span trace.Span
	if c.recording {
		span = c.span
	}
	recordRefusal(c.ctx, c.client, c.route, span, RefusalEvent{Reason: reason, Event: event, Attempts: c.tally.sent, Err: c.lastErr})
}

// recordRefusal records refusal e of a call on route r: the metric, the
// event on span (nil when the call's span does not record), the marker for
// the server's don't-retry pushback, and, on the call's goroutine, the
// hook.
func recordRefusal(ctx context.Context, cl *Client, r *route, span trace.Span, e RefusalEvent) {
	noteRefusal(ctx, cl, r, span, e)
	refusalHook(cl, r, e)
}

// noteRefusal is recordRefusal but the hook: the part that may run on
// another goroutine than the call's (a per-attempt timer's).
func noteRefusal(ctx context.Context, cl *Client, r *route, span trace.Span, e RefusalEvent) {
	cl.tel.refusals.Add(ctx, 1, r.tel.refusalOpts(e.Reason)...)
	if span != nil {
		span.AddEvent(e.Event, trace.WithAttributes(semconv.AttrReason.String(string(e.Reason))))
	}
	if e.Reason.info().propagates {
		markRefused(ctx)
	}
	if e.Reason.info().annotates {
		recordOn(ctx, e.Reason)
	}
}

// refusalHook calls the OnRefusal hook with e, on the call's goroutine.
func refusalHook(cl *Client, r *route, e RefusalEvent) {
	if cl.o.hooks.OnRefusal != nil {
		e.Method, e.Target = r.method, r.target
		callHook(cl, "OnRefusal", cl.o.hooks.OnRefusal, e)
	}
}

// wouldRefuse records, in shadow mode, a refusal the budget or the breaker
// would have made.
func (c *call) wouldRefuse(reason Reason) {
	c.client.tel.wouldRefuse.Add(c.ctx, 1, c.route.tel.wouldRefuseOpts(reason)...)
	c.event(semconv.EventWouldRefuse, semconv.AttrReason.String(string(reason)))
}

// scheduled records a retry decision.
func (c *call) scheduled(v verdict) {
	if c.client.o.hooks.OnRetry != nil {
		callHook(c.client, "OnRetry", c.client.o.hooks.OnRetry, RetryEvent{Method: c.route.method, Target: c.route.target, Attempt: c.tally.sent + 1, Delay: v.delay, Err: v.err})
	}
	if !c.recording {
		return
	}
	attrs := []attribute.KeyValue{semconv.AttrCause.String(codename.Name(status.Code(v.err))), semconv.AttrDelay.Float64(v.delay.Seconds())}
	if c.pay == payFailover {
		attrs = append(attrs, semconv.AttrFailover.Bool(true))
	}
	if vs := v.tr[semconv.PushbackKey]; len(vs) == 1 {
		attrs = append(attrs, semconv.AttrPushback.String(vs[0]))
	}
	c.span.AddEvent(semconv.EventRetryScheduled, trace.WithAttributes(attrs...))
}

// event adds a decision event to the call span.
func (c *call) event(name string, attrs ...attribute.KeyValue) {
	if c.recording {
		c.span.AddEvent(name, trace.WithAttributes(attrs...))
	}
}

// wait waits d (on the Client's timers) or until the call's context is
// done.
func (c *call) wait(d time.Duration) error {
	if d <= 0 {
		if err := c.ctx.Err(); err != nil {
			return status.FromContextError(err).Err()
		}
		return nil
	}
	t := c.client.newTimer(d)
	defer t.Stop()
	select {
	case <-t.C():
		return nil
	case <-c.ctx.Done():
		return status.FromContextError(c.ctx.Err()).Err()
	}
}

// backoff returns the next exponential backoff with jitter: a random time
// in [d/2, d] with d = min(max, base·2ⁿ).
func (c *call) backoff() time.Duration {
	d := c.backoffCeil()
	c.tally.backoffN++
	return d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
}

// backoffCeil is the longest the next retry's backoff can be.
func (c *call) backoffCeil() time.Duration {
	r := c.rule
	var d time.Duration
	if r.backoffMult == 2 {
		d = r.backoffBase << min(c.tally.backoffN, 30)
	} else if f := float64(r.backoffBase) * math.Pow(r.backoffMult, float64(c.tally.backoffN)); f < float64(r.backoffMax) {
		d = time.Duration(f)
	}
	if d <= 0 || d > r.backoffMax {
		d = r.backoffMax
	}
	return d
}

// endCall records the call's outcome and ends its span. A try that came
// back is not another logical call: the calls and the call duration count
// its logical call's first try only.
func (c *call) endCall(err error) {
	st, _ := status.FromError(err)
	code := st.Code()
	if g := &c.route.outer; err == nil && g.locked.Load() != 0 {
		g.heal(c.client.now())
	}
	t, rt := c.client.tel, c.route.tel
	if c.outer.back == nil {
		t.calls.Add(c.ctx, 1, rt.callOpts(code)...)
	}
	if c.outer.back == nil && t.duration.Enabled(c.ctx) {
		t.duration.Record(c.ctx, c.client.now().Sub(c.start).Seconds(), rt.durationOpts(code)...)
	}
	if c.tally.retries > 0 {
		t.retries.Record(c.ctx, int64(c.tally.retries), rt.perCallOpts()...)
	}
	if c.tally.hedges > 0 {
		t.hedges.Record(c.ctx, int64(c.tally.hedges), rt.perCallOpts()...)
	}
	if c.recording {
		switch {
		case c.rule.fromServiceConfig:
			c.span.SetAttributes(semconv.AttrServiceConfig.String(scApplied))
		case c.scIgnored != "":
			c.span.SetAttributes(semconv.AttrServiceConfig.String(c.scIgnored))
		}
	}
	if c.tally.retries > 0 || c.tally.hedges > 0 {
		t.retryDelay.Record(c.ctx, c.tally.idle.Seconds(), rt.perCallOpts()...)
	}
	endSpan(c.span, code, st.Message())
}
