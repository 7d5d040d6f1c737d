package interceptor

import (
	"context"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/internal/engine"
)

// Retry loops outside the suite.
//
// A client library may retry in an interceptor installed outside the
// user's (etcd's clientv3 does, up to 100 times; the Google Cloud
// libraries back off up to a minute), as may go-grpc-middleware's retry or
// a loop in the caller's code. Each of its tries enters the suite as a new
// call: without more, it would deposit into the budget as one and send its
// first attempt whatever the budget says. But a try is the same call as
// the one that failed: the same route, the same request content, and the
// same caller's context, or one derived from it for the try
// (go-grpc-middleware adds a header), whose Done channel is the caller's.
// So the Client remembers the calls that failed, by that Done channel (or
// by the context itself when it has none), route and a digest of the
// request's content; a call that matches one is a try of the same logical
// call coming back. It is charged as a retry: no deposit, and its first
// attempt takes a token from the budget (and is refused, before anything
// is sent, when the budget or the breaker refuses a retry), with the last
// try's status, annotated.
//
// What is remembered, and for how long:
//
//   - a call that failed with a code a loop retries (transientCodes, and
//     the Client's failure and retryable codes), after at least one of its
//     attempts was sent, while the caller's context is not done;
//   - until that context is done, the logical call succeeds, or
//     returnWindow has passed since its last try that was sent: a try the
//     suite refuses extends nothing;
//   - in at most returnMaxBytes per Client, statuses included (their
//     messages cut to maxRememberedMsg, their details dropped).
//
// A refused try must not outlast its cause. When a try that came back is
// refused while its target has served nothing lately, the route is locked
// (engine.Probes): now and then (every half a second while such tries are
// many, every four seconds otherwise), one is sent all the same, as a probe
// the budget does not pay for (as a breaker's half-open probe is); and the
// first success of any call of the route ends the lock and heals it: the
// calls remembered until then are forgotten, so that every loop's next try
// is a call of its own, sent.
//
// The success path pays one atomic load while no call has failed lately,
// and a hash and one more atomic load (the filter) after: the table is
// looked at under a lock, and the request digested, only for a call whose
// context and route have a remembered failure.
const (
	// returnWindow bounds how long after its last sent try failed a call
	// is remembered, for a context that is never done: longer than the
	// backoffs of the loops that retry for minutes.
	returnWindow = 10 * time.Minute
	// returnMaxBytes bounds the memory of the remembered calls of one
	// Client, in bytes.
	returnMaxBytes = 16 << 20
	// maxRememberedMsg bounds the status message a remembered call keeps.
	maxRememberedMsg = 256
	// returnEntryBytes is what a remembered call costs beside its message
	// and key: the entry, its map slot, the context or channel it holds.
	returnEntryBytes = 256
	// returnChain bounds the requests remembered per context and route (a
	// reused context that failed with many requests keeps the latest).
	returnChain = 8

	returnShards     = 64 // 6 bits
	returnFilterBits = 13
)

// transientCodes are the codes after which a call is remembered besides
// the Client's failure and retryable codes: those retry loops retry. A
// call answered NOT_FOUND, INVALID_ARGUMENT, PERMISSION_DENIED and the
// like was served: a loop that sends it again adds no load to a failing
// dependency, and it is not remembered.
var transientCodes = idempotency.Codes(codes.Unavailable, codes.DeadlineExceeded, codes.ResourceExhausted,
	codes.Internal, codes.Aborted, codes.Unknown, codes.DataLoss, codes.Canceled)

// cameBack returns the failed call that a call of route r, in the
// caller's scope (see callerScope; nil: none) with req, starting at now,
// is a try of, or nil.
func (c *Client) cameBack(scope any, r *route, req any, now time.Time) *returned {
	t := c.returns.Load()
	if t == nil || scope == nil {
		return nil
	}
	if now.UnixNano()-c.lastFailed.Load() > int64(returnWindow) {
		c.returns.CompareAndSwap(t, nil) // nothing failed for a window: let it all go
		return nil
	}
	k := scopeRoute{words(scope), r}
	h := k.hash()
	if t.slot(h).Load() == 0 {
		return nil
	}
	sh := t.shard(h)
	sh.mu.Lock()
	found := sh.m[k] != nil
	sh.mu.Unlock()
	if !found {
		return nil
	}
	d, ok := t.digest(req) // outside the lock
	if !ok {
		return nil
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	for e := sh.m[k]; e != nil; e = e.next {
		if e.digest != d {
			continue
		}
		if !e.live(now) {
			t.remove(sh, e)
			return nil
		}
		return e
	}
	return nil
}

// remembers reports whether call c, failed with code, is remembered.
func (c *call) remembers(code codes.Code) bool {
	return transientCodes.Has(code) || c.client.failures.Has(code) || c.e.Rule.Retryable.Has(engine.Code(code))
}

// remember remembers unary call c, with request req, which failed with
// err, so that a try of it that comes back is known. Only a call that sent
// an attempt is remembered (a try the suite refused before sending
// anything leaves its logical call as it was: refusals extend nothing),
// with a code a loop retries, while the caller's context is not done (a
// loop checks it before trying again).
func (c *call) remember(req any, err error) {
	if c.scope == nil || c.e.Sent() == 0 || callerDone(c.scope) {
		return
	}
	last := c.lastErr
	if last == nil {
		last = err
	}
	st := status.Convert(last)
	if !c.remembers(st.Code()) {
		return
	}
	cl := c.client
	t := cl.table()
	d, ok := t.digest(req)
	if !ok {
		return
	}
	now := cl.now()
	e := &returned{scope: c.scope, key: scopeRoute{words(c.scope), c.route}, digest: d, code: st.Code(),
		msg: strings.Clone(cut(st.Message(), maxRememberedMsg)), at: now, attempts: c.e.Prior() + c.e.Sent(), idemKey: c.madeKey}
	t.store(e, now)
	if n := now.UnixNano(); n > cl.lastFailed.Load() {
		cl.lastFailed.Store(n) // a benign race may keep an earlier time
	}
}

// forget drops the entry of a logical call that has succeeded.
func (c *Client) forget(e *returned) {
	t := c.returns.Load()
	if t == nil {
		return
	}
	sh := t.shard(e.key.hash())
	sh.mu.Lock()
	t.remove(sh, e)
	sh.mu.Unlock()
}

// RecordRefusals returns a copy of ctx in which the Client records the
// retries, hedges and calls it refuses (the reasons RefusedBy reports) of
// the calls made with ctx or a context derived from it, and a function
// that returns the reason of the latest ("" while there is none).
//
// It is for code that cannot see a refused call's status: a retry loop
// outside the suite (a client library's own) that keeps trying until the
// deadline and then returns only the context's error. The record is
// written on the refusal path only, and is safe for concurrent use.
func RecordRefusals(ctx context.Context) (context.Context, func() Reason) {
	rec := &refusalRecord{}
	return context.WithValue(ctx, refusalRecordKey{}, rec), rec.latest
}

type refusalRecordKey struct{}

type refusalRecord struct {
	mu sync.Mutex
	r  Reason
}

func (r *refusalRecord) latest() Reason {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.r
}

// recordOn records reason in ctx's refusal record, if it has one.
func recordOn(ctx context.Context, reason Reason) {
	if rec, ok := ctx.Value(refusalRecordKey{}).(*refusalRecord); ok {
		rec.mu.Lock()
		rec.r = reason
		rec.mu.Unlock()
	}
}
