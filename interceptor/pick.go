package interceptor

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/deadline"
	"github.com/stormguard/stormguard/internal/engine"
	"github.com/stormguard/stormguard/priority"
	"github.com/stormguard/stormguard/semconv"
)

// What did the pick do? grpc-go picks an attempt's endpoint inside the
// invocation, after the interceptor has handed the attempt over; the
// suite learns of the pick, and judges it (engine.Pick: avoid an outlier,
// refuse a guarded first attempt, pay for a fail-over with nowhere else
// to go), through the attempt's call credentials, which grpc asks for
// metadata once the endpoint is known.

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
// transparent retry: mu guards what it writes (the pick and staged).
type attemptCreds struct {
	client   *Client
	deadline time.Time         // zero: no deadline, no header
	prio     priority.Priority // Default: no header
	user     credentials.PerRPCCredentials
	md       map[string]string // reused: grpc copies it before returning
	// count says to count grpc-go's attempts (n), for a call whose
	// grpc-go retries are watched (see grpcRetries); tries is n of the
	// last invocation, set by collect.
	count bool
	n     atomic.Int32
	tries int32

	called    atomic.Bool // GetRequestMetadata ran since prepare
	mu        sync.Mutex
	pick      engine.Pick // the attempt's picks, judged under mu
	staged    pickSeen    // what the last pick decided, written under mu
	committed pickSeen    // what the attempt's last pick decided, once the invocation returned (collect)
}

// pickSeen is what a pick decided.
type pickSeen struct {
	addr    net.Addr // where it went (committed: nil when it was not sent there)
	again   bool     // the endpoint is avoided: the attempt is invoked again
	refused bool     // refused for good (a guarded pick, an unpaid fail-over); in shadow mode sent all the same
	stands  bool     // ...and the refusal stands
}

// errAvoided fails the pick of an endpoint an attempt avoids, before
// anything is sent; the Client picks again.
var errAvoided = status.Error(codes.Unavailable, "stormguard: endpoint avoided (it fails while the others serve); picking another")

// GetRequestMetadata implements credentials.PerRPCCredentials.
func (a *attemptCreds) GetRequestMetadata(ctx context.Context, uri ...string) (map[string]string, error) {
	if a.count {
		a.n.Add(1)
	}
	paid := false
	if p, ok := peer.FromContext(ctx); ok {
		a.mu.Lock()
		v := a.pick.Judge(p.Addr)
		if v == engine.PickPay {
			v = a.pick.Pay(a.client.now())
		}
		refused, stands := v >= engine.PickRefused, a.pick.Stands(v)
		a.staged = pickSeen{addr: p.Addr, again: v == engine.PickAgain, refused: refused, stands: stands}
		paid = a.pick.Paid()
		a.mu.Unlock()
		a.called.Store(true)
		if v == engine.PickAgain || (refused && stands) {
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
	if paid {
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

// collect runs after an invocation: it commits what the last pick
// decided (a.committed), and reports whether the pick was of an endpoint the
// attempt avoids (see errAvoided), in which case the caller invokes
// again. Nothing to lock when grpc never asked (the attempt failed before
// a pick, or no transport ran).
func (a *attemptCreds) collect() (again bool) {
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
	a.committed, a.staged = a.staged, pickSeen{}
	a.mu.Unlock()
	if a.committed.again || (a.committed.refused && a.committed.stands) {
		a.committed.addr = nil // not sent there
	}
	a.called.Store(false)
	return a.committed.again
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

// prepare sets a up for attempt at of c (see engine.Pick). No
// GetRequestMetadata runs concurrently: grpc calls it only once the
// attempt is invoked.
func (a *attemptCreds) prepare(c *call, at *attempt) {
	a.pick, a.staged, a.committed = c.e.Pick(&at.Attempt), pickSeen{}, pickSeen{}
	a.count, a.tries = c.watched != nil, 0
	if a.n.Load() != 0 { // a load is cheaper than a store
		a.n.Store(0)
	}
}

// reset prepares a for a new call (nil: none, as in the pool). What an
// attempt of it judges its picks with is set up by prepare.
func (a *attemptCreds) reset(c *call, cs *callSettings) {
	a.client, a.deadline, a.user, a.prio = nil, time.Time{}, nil, priority.Default
	if c != nil {
		a.client, a.prio, a.deadline = c.client, c.prio, c.e.Deadline
	} else {
		a.pick, a.staged, a.committed = engine.Pick{}, pickSeen{}, pickSeen{}
		a.count, a.tries = false, 0
	}
	if cs != nil && cs.hasCreds {
		a.user = cs.userCreds.Creds
	}
}

// newAttemptCreds returns credentials for one attempt of c, and the call
// option that sends them.
func newAttemptCreds(c *call, cs *callSettings) (*attemptCreds, grpc.CallOption) {
	a := &attemptCreds{}
	a.reset(c, cs)
	return a, grpc.PerRPCCredentials(a)
}

// needsCreds reports whether attempt a of c has work for its call
// credentials: a deadline or priority header to write, endpoints to
// avoid, a pick an open breaker guards, grpc-go's attempts to count, or
// the caller's own credentials to wrap (inside grpc they cost a few
// allocations per attempt).
func (c *call) needsCreds(a *attempt, cs *callSettings) bool {
	return !c.e.Deadline.IsZero() || cs.hasCreds || len(c.e.Avoid()) > 0 || a.AtPick() || c.watched != nil || c.prio != priority.Default
}

// atPick settles what attempt a's pick decided, once its sender has sent
// it (see engine.Call.Picked): a first attempt an open breaker sent to
// the pick was refused there if it picked an endpoint that served
// nothing; a fail-over retry with nowhere to go was not sent if the
// budget would not pay for it. Such an attempt was never sent: atPick
// returns why, with the status a first attempt fails with. Otherwise the
// attempt is counted as sent. In shadow mode nothing is refused at the
// pick; what would have been is recorded.
func (c *call) atPick(a *attempt) (Reason, error) {
	if !a.AtPick() {
		return "", nil
	}
	refused := a.creds != nil && a.creds.committed.refused
	now := c.client.now()
	adm := c.e.Picked(&a.Attempt, refused, now)
	if adm.Would != 0 {
		c.wouldRefuse(reasonOf(adm.Would))
	}
	if adm.Refused == 0 {
		c.client.tel.attempts.Add(c.ctx, 1, c.route.tel.attemptOpts(a.Kind).metric...)
		return "", nil
	}
	err := c.gateError(adm, now)
	msg := "stormguard: no other endpoint to fail over to, and no budget"
	if err != nil {
		msg = status.Convert(err).Message()
	}
	a.unsent(msg)
	return reasonOf(adm.Refused), err
}

// unsent ends the span of an attempt refused at its pick: it was never
// sent, and its outcome is nobody's.
func (a *attempt) unsent(msg string) {
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
