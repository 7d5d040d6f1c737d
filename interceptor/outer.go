package interceptor

import (
	"sync/atomic"
	"time"
	"unsafe"

	"google.golang.org/grpc/status"
)

// Retry loops outside the suite.
//
// A client library may retry in an interceptor installed outside the
// user's (etcd's clientv3 does, up to 100 times), as may go-grpc-middleware's
// retry or a loop in the caller's code. Each of its tries enters the suite
// as a new call: without more, it would deposit into the budget as one and
// send its first attempt whatever the budget says. But a try carries what
// the failed try carried: the same request message, and the same context,
// or one derived from it for the try (go-grpc-middleware adds a header),
// whose Done channel is the caller's. So the Client remembers, for a while,
// the calls that failed, by that Done channel (or by the context itself
// when it has none), route and request; a call that matches one is a try
// of the same logical call coming back. It is charged as a retry: no
// deposit, and its first attempt takes a token from the budget (and is
// refused, before anything is sent, when the budget or the breaker refuses
// a retry), with the last try's status, annotated.
//
// The success path pays one atomic load while no call has failed lately
// (returnWindow), and a Done call, a hash and a few atomic loads after:
// the table is filled only by failed calls.
const (
	// returnSlots is the number of failed calls a Client remembers: sets
	// of returnWays slots (a power of two in all). A failure takes the
	// slot of its own call in its set, else a free or the oldest one.
	returnSlots   = 1 << 10
	returnWays    = 4
	returnSetBits = 8 // returnSlots / returnWays sets
	// returnWindow is how long after a try failed one that comes back is
	// taken for a retry of it. Outer loops retry within their backoff (25
	// ms for clientv3, 50 ms for go-grpc-middleware by default).
	returnWindow = 5 * time.Second
)

// returnTable holds the failed calls a Client remembers.
type returnTable [returnSlots]atomic.Pointer[returned]

// returned is a failed logical call, as a try of it that comes back
// needs it. It is not changed once stored.
type returned struct {
	// scope is the caller's ctx.Done(), or the context itself when it has
	// none. It is held, so that no other channel or context takes its
	// address while the entry lives.
	scope any
	id    [2]unsafe.Pointer // scope's type and data words
	// req is the address of the request message. It is not held: a new
	// request at the same address matches only in the same scope, for the
	// same route, within returnWindow.
	req      uintptr
	route    *route
	slot     uint32
	err      error     // the status of the last try's last attempt
	at       time.Time // when the last try ended
	attempts int       // attempts sent by the tries so far
	key      string    // the idempotency key the suite made for the call, if any
}

// eface is the layout of an interface value.
type eface struct{ typ, data unsafe.Pointer }

func words(v any) [2]unsafe.Pointer {
	e := (*eface)(unsafe.Pointer(&v))
	return [2]unsafe.Pointer{e.typ, e.data}
}

// returnSet returns the first slot of the set of a call (Fibonacci
// hashing: the top bits of one multiplication).
func returnSet(id [2]unsafe.Pointer, req uintptr, r *route) uint32 {
	h := (uint64(uintptr(id[1])) ^ uint64(req)<<1 ^ uint64(uintptr(unsafe.Pointer(r)))>>3) * 0x9e3779b97f4a7c15
	return uint32(h>>(64-returnSetBits)) * returnWays
}

// cameBack returns the failed call that a call of route r, in the
// caller's scope (see callerScope; nil: none) with req, starting at now,
// is a try of, or nil.
func (c *Client) cameBack(scope any, r *route, req any, now time.Time) *returned {
	t := c.returns.Load()
	if t == nil || now.UnixNano()-c.lastFailed.Load() > int64(returnWindow) || scope == nil {
		return nil // no call failed lately
	}
	id, rq := words(scope), uintptr(words(req)[1])
	set := returnSet(id, rq, r)
	for i := set; i < set+returnWays; i++ {
		if e := t[i].Load(); e != nil && e.id == id && e.req == rq && e.route == r {
			if now.Sub(e.at) > returnWindow {
				return nil // too old: a new call
			}
			return e
		}
	}
	return nil
}

// noteFailed remembers unary call k, which failed with err, so that a try
// of it that comes back is known: only a failure the breaker counts or a
// retryable one, and only while the caller's context is not done (a loop
// checks it before trying again).
func (c *Client) noteFailed(k *call, err error) {
	code := status.Code(err)
	scope, req := k.outer.scope, k.outer.req
	if !c.failures.Has(code) && !k.rule.retryable.Has(code) || scope == nil || k.outer.callerDone() {
		return
	}
	t := c.returns.Load()
	if t == nil {
		c.returns.CompareAndSwap(nil, new(returnTable))
		t = c.returns.Load()
	}
	last := k.lastErr
	if last == nil {
		last = err // refused before anything was sent
	}
	now := c.now()
	e := &returned{scope: scope, id: words(scope), req: uintptr(words(req)[1]), route: k.route,
		err: last, at: now, attempts: k.tally.prior + k.tally.sent, key: k.outer.madeKey}
	if b := k.outer.back; b != nil && t[b.slot].Load() == b {
		e.slot = b.slot // its own slot
	} else {
		// A free slot of the set, one whose call is over (its
		// window passed), or the oldest.
		set := returnSet(e.id, e.req, e.route)
		e.slot = set
		var oldest time.Time
		for i := set; i < set+returnWays; i++ {
			o := t[i].Load()
			if o == nil || (o.id == e.id && o.req == e.req && o.route == e.route) {
				e.slot = i
				break
			}
			if i == set || o.at.Before(oldest) {
				e.slot, oldest = i, o.at
			}
		}
	}
	t[e.slot].Store(e)
	if n := now.UnixNano(); n > c.lastFailed.Load() {
		c.lastFailed.Store(n) // a benign race may keep an earlier time
	}
}

// forget drops the entry of a logical call that has succeeded.
func (c *Client) forget(e *returned) {
	if t := c.returns.Load(); t != nil {
		t[e.slot].CompareAndSwap(e, nil)
	}
}
