package interceptor

import (
	"context"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/deadline"
	"github.com/stormguard/stormguard/outlier"
)

// attemptMode says what context an attempt needs.
type attemptMode uint8

const (
	plainAttempt      attemptMode = iota // the call's context, or a per-attempt timeout
	cancelableAttempt                    // its own cancel (hedging)
	streamAttemptMode                    // its own cancel, no per-attempt timeout
)

// attempt is the state of one attempt.
type attempt struct {
	ctx     context.Context
	cancel  context.CancelFunc // nil when the attempt made no context of its own
	span    trace.Span
	ticket  breaker.Ticket
	kind    attemptKind
	start   time.Time
	timeout bool          // the attempt was cut by its per-attempt timeout (see perTry)
	pt      *perTry       // the per-attempt timeout of a sequential attempt a retry may follow
	ended   uint32        // atomic: 1 once end has run
	creds   *attemptCreds // nil when the attempt was sent without
	peerp   *peer.Peer    // filled by grpc.Peer after the attempt, when the call asked for it
	// guarded is the open breaker of a first attempt that goes to the
	// pick: it is refused there if it picks an endpoint that served
	// nothing (see call.guardPick), and counted as sent otherwise.
	guarded *breaker.Breaker
	// shadowed marks, in shadow mode, an attempt the Client would have
	// refused: sent anyway, but its outcome is kept from the breaker and
	// the endpoint table, so that they see what they would have seen.
	shadowed bool
	// free marks a fail-over retry, which the budget did not pay for: if
	// its pick can go only to an endpoint it avoids, it is no fail-over,
	// and the budget pays then, or it is not sent (see attemptCreds). It
	// is counted as sent after its pick.
	free bool
}

// begin starts an attempt of the given kind: the send-time checks (time
// left, the breaker, then, for retries and hedges, a token from the
// budget), the attempt's metadata, context, span and metrics. When the
// attempt may not be sent, begin returns why and the status a first
// attempt fails with; nothing was sent and nothing was withdrawn. It fills
// a in place (an attempt is too large to return by value on the hot path).
func (c *call) begin(ctx context.Context, a *attempt, kind attemptKind, mode attemptMode) (Reason, error) {
	now := c.start // the first attempt starts with the call
	if c.sent > 0 {
		now = c.client.now()
	}
	if c.hasDeadline {
		if err := c.client.dl.Check(c.deadline.Sub(now)); err != nil {
			return ReasonDeadline, err
		}
	}
	*a = attempt{kind: kind, start: now}
	if reason, err := c.admit(ctx, a, now); reason != "" {
		return reason, err
	}
	c.prepaid = false
	actx := ctx
	if n := c.prior + c.sent; n > 0 {
		// The marker says the suite's budget paid for (or bounds) this
		// retry or hedge, so that a stormguard server does not charge it
		// to its own budget again (see WithServerBudget).
		actx = metadata.AppendToOutgoingContext(actx, PreviousAttemptsKey, strconv.Itoa(n), BudgetedKey, "1")
	}
	if c.sent > 0 {
		for _, p := range c.failedOn {
			// With the outlier LB policy on the channel, its picker
			// avoids the endpoints this call failed on (Envoy's
			// previous_hosts); without it, this does nothing.
			actx = outlier.AvoidContext(actx, p.String())
		}
	}
	actx = c.attemptContext(actx, a, now, mode)
	rt := c.route.tel
	ao := rt.attemptOpts(kind)
	if c.recording {
		actx, a.span = c.client.tel.tracer.Start(actx, ao.spanName, ao.span...)
		a.span.SetAttributes(AttrPreviousAttempts.Int(c.prior + c.sent))
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
		c.client.tel.attempts.Add(ctx, 1, ao.metric...)
	}
	switch kind {
	case kindRetry:
		c.retries++
	case kindHedge:
		c.hedges++
	}
	c.sent++
	a.ctx = actx
	return "", nil
}

// admit asks the breaker and, for a retry or a hedge, the budget whether a
// may be sent, and returns why not (with the status a first attempt fails
// with). In shadow mode it refuses nothing: it records the refusal a
// would have had, once, and marks it shadowed.
func (c *call) admit(ctx context.Context, a *attempt, now time.Time) (Reason, error) {
	kind := a.kind
	var would Reason
	if b := c.route.breaker; b != nil {
		t, err := b.AdmitAt(now)
		switch {
		case err == nil:
			a.ticket = t
		case kind == kindFirst && c.guardPick(now):
			// Refused at the pick, and only if it picks an endpoint that
			// served nothing (see guardPick; in shadow mode only
			// recorded, see pickRefused).
			a.guarded = b
		case c.client.o.shadow:
			would = ReasonBreaker
		default:
			return ReasonBreaker, circuitOpenError(c.route, b, now)
		}
		if would == "" && kind != kindFirst && c.servedNothing(b, now) {
			if !c.client.o.shadow {
				a.ticket.Ignore()
				return ReasonBreaker, nil
			}
			would = ReasonBreaker
		}
	}
	switch {
	case would != "":
		c.wouldRefuse(ctx, would)
		a.shadow()
	case kind == kindRetry && c.failover && !c.prepaid:
		a.free = true // the budget pays at the pick if it cannot fail over
	case kind == kindHedge || (kind == kindRetry && !c.failover && !c.prepaid):
		// The budget is asked only when the breaker lets a through.
		reason, ok := c.withdraw(ctx, now)
		if !ok {
			a.ticket.Ignore()
			return reason, nil
		}
		if reason != "" { // shadow mode: withdraw recorded it
			a.shadow()
		}
	}
	return "", nil
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

// refusedAtPick ends an attempt that guardPick sent to the pick and that
// picked an endpoint which served nothing: it was never sent. It returns
// the status the call fails with (as an open breaker's).
func (c *call) refusedAtPick(ctx context.Context, a *attempt) error {
	c.sent--
	a.ticket.Ignore()
	if a.cancel != nil {
		a.cancel()
	}
	err := circuitOpenError(c.route, a.guarded, c.client.now())
	if a.span != nil {
		a.span.SetAttributes(AttrSent.Bool(false))
		endSpan(a.span, codes.Unavailable, status.Convert(err).Message())
	}
	atomic.StoreUint32(&a.ended, 1)
	return c.notSent(ctx, ReasonBreaker, err)
}

// pickRefused reports whether a guarded first attempt was refused at its
// pick (a.creds.refused). In shadow mode the pick is never refused, and one
// that would have been is recorded as a would-be refusal instead.
func (c *call) pickRefused(ctx context.Context, a *attempt) bool {
	if !a.creds.refused {
		return false
	}
	if c.client.o.shadow {
		a.shadowed = true
		c.wouldRefuse(ctx, ReasonBreaker)
		return false
	}
	return true
}

// sentGuarded counts, as sent, a guarded first attempt that was not refused
// at its pick.
func (c *call) sentGuarded(ctx context.Context, a *attempt) {
	a.guarded = nil
	c.client.tel.attempts.Add(ctx, 1, c.route.tel.attemptOpts(a.kind).metric...)
}

// unpaidAtPick settles a free fail-over retry after its pick: it reports
// whether the retry could go only to an endpoint it avoids and the budget
// would not pay for it, so that it was not sent; otherwise it counts it as
// sent. In shadow mode such a retry is sent, and the refusal recorded.
func (c *call) unpaidAtPick(ctx context.Context, a *attempt) bool {
	a.free = false
	if a.creds != nil && a.creds.unpaid {
		if !c.client.o.shadow {
			return true
		}
		c.wouldRefuse(ctx, ReasonBudget)
		a.shadow()
	}
	c.client.tel.attempts.Add(ctx, 1, c.route.tel.attemptOpts(a.kind).metric...)
	return false
}

// unsend undoes begin for an attempt refused at its pick: nothing was sent.
func (c *call) unsend(a *attempt) {
	c.sent--
	switch a.kind {
	case kindRetry:
		c.retries--
	case kindHedge:
		c.hedges--
	}
	a.ticket.Ignore()
	if a.cancel != nil {
		a.cancel()
	}
	if a.span != nil {
		a.span.SetAttributes(AttrSent.Bool(false))
		endSpan(a.span, codes.Unavailable, "stormguard: no other endpoint to fail over to, and no budget")
	}
	atomic.StoreUint32(&a.ended, 1)
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
// refuses, and says so to the hops above.
func (c *call) servedNothing(b *breaker.Breaker, now time.Time) bool {
	return servedNothing(c.route, b, now)
}

func servedNothing(r *route, b *breaker.Breaker, now time.Time) bool {
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
	if c.hasDeadline && (!c.ctxHasDL || c.deadline.Before(c.ctxDeadline)) {
		dl = c.deadline
	}
	var perTry time.Duration
	if p := c.route.perAttempt; p > 0 && mode == plainAttempt {
		// Only a reply that is not a proto message (a custom codec) is
		// retried on a per-attempt timeout here; the others are run by
		// the hedger, which does not cancel the slow attempt.
		if pdl := now.Add(p); (!c.hasDeadline || pdl.Before(c.deadline)) && c.mayFollow(ctx) {
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
		a.pt = c.newPerTry(ctx, perTry, a.cancel)
	case !dl.IsZero():
		ctx, a.cancel = context.WithDeadline(ctx, dl)
	case mode != plainAttempt:
		ctx, a.cancel = context.WithCancel(ctx)
	}
	return ctx
}

// withdrawAt takes a token from b (nil: no budget) at now, on the Client's
// clock.
func (c *Client) withdrawAt(b *budget.Budget, now time.Time) bool {
	return b.WithdrawAt(now) // a nil budget grants
}

// withdraw takes a token from the budget for a retry or a hedge that is
// about to be sent: ("", true) when it did, (ReasonBudget, false) when the
// budget refuses. In shadow mode a refusal is recorded and granted:
// (ReasonBudget, true).
func (c *call) withdraw(ctx context.Context, now time.Time) (Reason, bool) {
	b := c.route.budget
	if b == nil {
		return "", true
	}
	ok := b.WithdrawAt(now)
	if !ok && c.client.o.shadow {
		c.wouldRefuse(ctx, ReasonBudget)
		return ReasonBudget, true
	}
	if !ok {
		return ReasonBudget, false
	}
	return "", true
}

// end reports an attempt's outcome: to the breaker, the latency tracker and
// its span. abandoned is true for a hedge cancelled because another attempt
// won, which says nothing about the target.
func (c *call) end(callCtx context.Context, a *attempt, err error, abandoned bool) {
	if !atomic.CompareAndSwapUint32(&a.ended, 0, 1) {
		return // a stream attempt may be ended by its receiver and by the caller leaving
	}
	code := status.Code(err)
	now := a.start
	if code != codes.OK || c.timed || a.span != nil {
		// A success needs no fresh reading unless something measures it:
		// the breaker and the endpoint table count it in the slot of its
		// start (or the newest).
		now = c.client.now()
	}
	switch {
	case abandoned || (code == codes.Canceled && callCtx.Err() != nil):
		a.ticket.Ignore()
		if abandoned && c.route.lat != nil {
			c.route.lat.observe(now.Sub(a.start)) // a lower bound: it was cut short
		}
	case a.shadowed:
		a.ticket.Ignore()
	default:
		failed := code != codes.OK && c.client.failures.Has(code)
		a.ticket.DoneAt(failed, now)
		c.route.endpoints.record(a.peer(), failed, now)
		if c.route.lat != nil && (code == codes.OK || !c.route.retryable.Has(code)) {
			c.route.lat.observe(now.Sub(a.start))
		}
	}
	if a.cancel != nil {
		a.cancel()
	}
	if a.span != nil {
		msg := ""
		if err != nil {
			msg = status.Convert(err).Message()
			if p := a.peer(); p != nil && a.span.IsRecording() {
				a.span.SetAttributes(AttrPeer.String(p.String()))
			}
		}
		endSpan(a.span, code, msg)
	}
}

func (a *attempt) peer() net.Addr {
	if a.creds != nil && a.creds.last != nil {
		return a.creds.last
	}
	if a.peerp != nil {
		return a.peerp.Addr
	}
	return nil
}

// attemptCreds are the call credentials an attempt is sent with. grpc asks
// them for metadata when the transport builds the attempt's headers: after
// the pick (the endpoint is known) and right before the headers go out. So
// the stormguard-deadline-ms header states the time left at that moment,
// not before a wait for a connection, and costs nothing on the
// interceptor's path; and the attempt learns which endpoint it went to
// without a grpc.Peer option. The caller's own call credentials, if any,
// are wrapped, not replaced.
//
// One attemptCreds serves the attempts of a call one after the other. The
// call's goroutine sets it up before an attempt (prepare) and reads it
// after (collect); grpc calls GetRequestMetadata in between, on the same
// goroutine for a unary call, possibly on another for a stream's
// transparent retry: mu guards what it writes.
type attemptCreds struct {
	client   *Client
	deadline time.Time // zero: no deadline, no header
	user     credentials.PerRPCCredentials
	md       map[string]string // reused: grpc copies it before returning
	budget   *budget.Budget    // pays for a free retry that cannot fail over
	avoid    []net.Addr        // endpoints a pick re-picks...
	last     net.Addr          // the endpoint of the last attempt, as collected

	guard   bool // refuse (in shadow mode: note), rather than send, a pick still among avoid after the re-picks
	refused bool // the pick was refused for good (guard); set on the call's goroutine by collect
	free    bool // a fail-over retry: the budget pays if its pick is still among avoid after the re-picks
	unpaid  bool // ...and it would not: the retry was not sent (in shadow mode: was); set by collect
	eps     *endpoints
	// count says to count grpc-go's attempts (n), for a call whose
	// grpc-go retries are watched (see grpcRetries); tries is n of the
	// last invocation, set by collect.
	count bool
	n     atomic.Int32
	tries int32

	called  atomic.Bool // GetRequestMetadata ran since prepare
	mu      sync.Mutex
	addr    net.Addr
	vetoed  bool // the last pick was refused: invoke again
	refusal bool // the last pick was refused for good
	repick  int  // ...at most this many more times
	paid    bool // free, but the budget paid for it at a pick
	noPay   bool // free, and the budget would not pay at the last pick
}

// errAvoided fails the pick of an endpoint an attempt avoids, before
// anything is sent; the Client picks again.
var errAvoided = status.Error(codes.Unavailable, "stormguard: endpoint avoided (it fails while the others serve); picking another")

// GetRequestMetadata implements credentials.PerRPCCredentials.
func (a *attemptCreds) GetRequestMetadata(ctx context.Context, uri ...string) (map[string]string, error) {
	if a.count {
		a.n.Add(1)
	}
	if p, ok := peer.FromContext(ctx); ok {
		a.mu.Lock()
		a.addr = p.Addr
		avoided := slices.Contains(a.avoid, p.Addr)
		veto := avoided && a.repick > 0
		refuse := avoided && !veto && a.guard
		noPay := false
		if veto {
			a.repick--
			a.vetoed = true
		}
		if avoided && !veto && a.free && !a.paid {
			// Every pick of a fail-over retry went to an endpoint it
			// avoids (maxFreeRepicks+1 picks: round_robin over two
			// endpoints would have offered the other one): grpc has
			// nowhere else to send it. It fails over to nothing, and the
			// budget pays for it.
			now := a.client.now()
			if a.eps != nil {
				a.eps.nowhereElse(now)
			}
			a.paid = a.client.withdrawAt(a.budget, now)
			noPay = !a.paid
		}
		a.refusal, a.noPay = refuse, noPay
		a.mu.Unlock()
		a.called.Store(true)
		if veto || ((refuse || noPay) && !a.client.o.shadow) {
			return nil, errAvoided
		}
	}
	if a.md == nil {
		a.md = make(map[string]string, 2)
	}
	clear(a.md)
	if a.user != nil {
		umd, err := a.user.GetRequestMetadata(ctx, uri...)
		if err != nil {
			return nil, err
		}
		for k, v := range umd {
			a.md[k] = v
		}
	}
	if !a.deadline.IsZero() {
		a.md[deadline.MetadataKey] = deadline.FormatHeader(a.client.dl.Downstream(a.deadline.Sub(a.client.now())))
	}
	return a.md, nil
}

// RequireTransportSecurity implements credentials.PerRPCCredentials: only
// as much as the caller's own call credentials require.
func (a *attemptCreds) RequireTransportSecurity() bool {
	return a.user != nil && a.user.RequireTransportSecurity()
}

// collect runs after an invocation: it notes the endpoint the attempt
// went to, and reports whether its pick was refused (see errAvoided), in
// which case the caller invokes again. Nothing to lock when grpc never
// asked (the attempt failed before a pick, or no transport ran).
func (a *attemptCreds) collect() (vetoed bool) {
	if a == nil {
		return false
	}
	if a.count {
		a.tries = a.n.Load()
	}
	if !a.called.Load() {
		return false
	}
	a.mu.Lock()
	vetoed, a.vetoed = a.vetoed, false
	a.refused, a.refusal = a.refusal, false
	a.unpaid, a.noPay = a.noPay, false
	a.last = a.addr
	if vetoed || ((a.refused || a.unpaid) && !a.client.o.shadow) {
		a.last = nil
	}
	a.mu.Unlock()
	a.called.Store(false)
	return vetoed
}

// recount starts counting grpc-go's attempts again, before an attempt is
// invoked again (see collect).
func (a *attemptCreds) recount() {
	if a.count {
		a.n.Store(0)
	}
}

// triesSoFar returns how many attempts grpc-go has made so far of a
// watched stream attempt (see grpcRetries).
func (a *attemptCreds) triesSoFar() int32 {
	if !a.count {
		return 0
	}
	return a.n.Load()
}

// prepare sets a up for the next attempt of c: every attempt avoids the
// target's outlier endpoints (those that fail while the others serve), by
// picking again, at most maxRepicks times, when grpc picked one of them.
// No GetRequestMetadata runs concurrently: grpc calls it only once the
// attempt is invoked.
func (a *attemptCreds) prepare(c *call, at *attempt) {
	a.last, a.avoid, a.repick, a.refused = nil, c.avoid, 0, false
	a.guard = at.guarded != nil
	a.free, a.unpaid, a.paid = at.free, false, false
	a.budget, a.eps = c.route.budget, c.route.endpoints
	a.count, a.tries = c.watched != nil, 0
	a.n.Store(0)
	switch {
	case len(c.avoid) > 0 && at.free:
		a.repick = maxFreeRepicks
	case len(c.avoid) > 0:
		a.repick = maxRepicks
	}
}

// reset prepares a for a new call.
func (a *attemptCreds) reset(c *call, cs *callSettings) {
	a.client, a.deadline, a.user = c.client, time.Time{}, nil
	if c.hasDeadline {
		a.deadline = c.deadline
	}
	if cs.hasCreds {
		a.user = cs.userCreds.Creds
	}
	a.last, a.avoid, a.repick, a.guard, a.refused = nil, nil, 0, false, false
	a.free, a.unpaid, a.paid, a.budget, a.eps = false, false, false, nil, nil
	a.count, a.tries = false, 0
}

// newAttemptCreds returns credentials for one attempt of c, and the call
// option that sends them.
func newAttemptCreds(c *call, cs *callSettings) (*attemptCreds, grpc.CallOption) {
	a := &attemptCreds{}
	a.reset(c, cs)
	return a, grpc.PerRPCCredentials(a)
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
