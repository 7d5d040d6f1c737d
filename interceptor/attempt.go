package interceptor

import (
	"context"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stormguard/stormguard/semconv"

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
	"github.com/stormguard/stormguard/priority"
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
	timeout bool    // the attempt was cut by its per-attempt timeout (see perTry)
	pt      *perTry // the per-attempt timeout of a sequential attempt a retry may follow
	ended   uint32  // 1 once end has run; atomic if shared
	// shared marks a stream attempt, which its receiver and the caller
	// leaving may both end: ended is then set by compare-and-swap. Any
	// other attempt is ended by its call's goroutine alone.
	shared bool
	creds  *attemptCreds // nil when the attempt was sent without
	peerp  *peer.Peer    // filled by grpc.Peer after the attempt, when the call asked for it
	// guarded is the open breaker of a first attempt that goes to the
	// pick: it is refused there if it picks an endpoint that served
	// nothing (see call.guardPick), and counted as sent otherwise.
	guarded *breaker.Breaker
	// shadowed marks, in shadow mode, an attempt the Client would have
	// refused: sent anyway, but its outcome is kept from the breaker and
	// the endpoint table, so that they see what they would have seen.
	shadowed bool
	// probe marks the first attempt of a try that came back, sent as a
	// probe of its locked route although the budget or the breaker
	// refused it (see call.probe): nobody pays for it.
	probe bool
	// free marks a fail-over retry, which the budget did not pay for: if
	// its pick can go only to an endpoint it avoids, it is no fail-over,
	// and the budget pays then, or it is not sent (see attemptCreds). It
	// is counted as sent after its pick.
	free bool
	// paid: the gates withdrew this retry or hedge from the budget (a nil
	// budget grants without paying; in shadow mode the budget enforces
	// nothing): with a budget and out of shadow mode, it is sent marked
	// as paid (semconv.BudgetedKey).
	paid bool
}

// end reports an attempt's outcome: to the breaker, the latency tracker and
// its span. abandoned is true for a hedge cancelled because another attempt
// won, which says nothing about the target. It returns the time it ended
// the attempt at: the Client's clock for a failure, and for a success that
// something measures; the attempt's start otherwise.
func (c *call) end(a *attempt, err error, abandoned bool) time.Time {
	if a.shared {
		if !atomic.CompareAndSwapUint32(&a.ended, 0, 1) {
			return c.client.now() // ended by its receiver, or by the caller leaving
		}
	} else if a.ended != 0 {
		return c.client.now()
	} else {
		a.ended = 1
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
	case abandoned || (code == codes.Canceled && c.ctx.Err() != nil):
		a.ticket.Ignore()
		if abandoned && c.route.lat != nil {
			c.route.lat.observe(now.Sub(a.start)) // a lower bound: it was cut short
		}
	case a.shadowed:
		a.ticket.Ignore()
	default:
		failed := code != codes.OK && c.client.failures.Has(code)
		a.ticket.DoneAt(failed, now)
		if code != codes.OK {
			c.route.outer.failed(now)
		}
		c.route.endpoints.record(a.peer(), failed, now)
		if code == codes.OK {
			c.throttle.Success() // a nil throttle counts nothing
		}
		if c.route.lat != nil && (code == codes.OK || !c.rule.retryable.Has(code)) {
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
				a.span.SetAttributes(semconv.AttrPeer.String(p.String()))
			}
		}
		endSpan(a.span, code, msg)
	}
	return now
}

// unsent ends the span of an attempt refused at its pick: it was never
// sent, and its outcome is nobody's.
func (a *attempt) unsent(msg string) {
	a.ticket.Ignore()
	if a.cancel != nil {
		a.cancel()
	}
	if a.span != nil {
		a.span.SetAttributes(semconv.AttrSent.Bool(false))
		endSpan(a.span, codes.Unavailable, msg)
	}
	if a.shared {
		atomic.StoreUint32(&a.ended, 1)
	} else {
		a.ended = 1
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
	deadline time.Time         // zero: no deadline, no header
	prio     priority.Priority // Default: no header
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
			a.paid = a.budget.WithdrawAt(now) // a nil budget pays
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
	if a.prio != priority.Default {
		a.md[semconv.PriorityKey] = a.prio.String()
	}
	if a.paid && a.budget != nil && !a.client.o.shadow {
		// A fail-over retry with nowhere to go, which the budget paid for
		// at this pick: marked as paid, as open marks the retries the
		// budget paid for before they were sent.
		a.md[semconv.BudgetedKey] = "1"
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
	a.count, a.tries = c.grpc.watched != nil, 0
	if a.n.Load() != 0 { // a load is cheaper than a store
		a.n.Store(0)
	}
	switch {
	case len(c.avoid) > 0 && at.free:
		a.repick = maxFreeRepicks
	case len(c.avoid) > 0:
		a.repick = maxRepicks
	}
}

// reset prepares a for a new call (nil: none, as in the pool).
func (a *attemptCreds) reset(c *call, cs *callSettings) {
	a.client, a.deadline, a.user, a.prio = nil, time.Time{}, nil, priority.Default
	if c != nil {
		a.client, a.prio = c.client, c.prio.p
		if c.dl.ok {
			a.deadline = c.dl.at
		}
	}
	if cs != nil && cs.hasCreds {
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
