package interceptor

import (
	"context"
	"hash/maphash"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"
	"unsafe"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/stormguard/stormguard/idempotency"
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
// (outerGate): now and then (every half a second while such tries are
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
	// A locked route sends a probe every outerProbeEvery while the tries
	// it refuses arrive at outerProbeRate a second or more, every
	// outerProbeSparse otherwise (see outerGate.probeDue).
	outerProbeEvery  = 500 * time.Millisecond
	outerProbeRate   = 10
	outerProbeSparse = 4 * time.Second

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

// returnTable holds the failed calls a Client remembers: sharded maps
// from (scope, route) to the chain of requests that failed there, and in
// front of them a filter, counting the keys of each hash slot, read
// without a lock.
type returnTable struct {
	seed   maphash.Seed
	filter [1 << returnFilterBits]atomic.Uint32
	shards [returnShards]returnShard
}

type returnShard struct {
	mu      sync.Mutex
	m       map[scopeRoute]*returned
	bytes   int
	inserts int // since the last sweep
	_       [32]byte
}

// scopeRoute is the key of a caller's calls of one route: the scope's
// interface words (its type and data pointers: the scope is held while
// it is a key, so that no other channel or context takes its address),
// and the route.
type scopeRoute struct {
	id    [2]unsafe.Pointer
	route *route
}

// returned is a failed logical call, as a try of it that comes back needs
// it. It is not changed once stored, but for next, which is read and
// written under its shard's lock.
type returned struct {
	scope    any // the caller's ctx.Done(), or its context when it has none
	key      scopeRoute
	digest   uint64     // of the request's content
	code     codes.Code // of the last try's last attempt
	msg      string     // its message, cut to maxRememberedMsg
	at       time.Time  // when the last try that was sent ended
	attempts int        // attempts sent by the tries so far
	idemKey  string     // the idempotency key the suite made for the call, if any
	next     *returned  // another request of the same scope and route
}

// size is what e costs, in bytes.
func (e *returned) size() int { return returnEntryBytes + len(e.msg) + len(e.idemKey) }

// err is the status of the last try, as remembered.
func (e *returned) err() error { return status.Error(e.code, e.msg) }

// eface is the layout of an interface value.
type eface struct{ typ, data unsafe.Pointer }

func words(v any) [2]unsafe.Pointer {
	e := (*eface)(unsafe.Pointer(&v))
	return [2]unsafe.Pointer{e.typ, e.data}
}

// hash mixes a key's data pointer and route (Fibonacci hashing: the top
// bits of one multiplication).
func (k scopeRoute) hash() uint64 {
	return (uint64(uintptr(k.id[1])) ^ uint64(uintptr(unsafe.Pointer(k.route)))>>3) * 0x9e3779b97f4a7c15
}

func (t *returnTable) slot(h uint64) *atomic.Uint32 { return &t.filter[h>>(64-returnFilterBits)] }

// shard uses the bits below the filter's: a product's low bits depend
// only on the low bits of what was multiplied, which are zero in aligned
// pointers.
func (t *returnTable) shard(h uint64) *returnShard {
	return &t.shards[(h>>(64-returnFilterBits-6))&(returnShards-1)]
}

// digest returns a digest of req's content (its deterministic wire form),
// or false for a request that is not a proto message: such calls are not
// recognised.
func (t *returnTable) digest(req any) (uint64, bool) {
	m, ok := req.(proto.Message)
	if !ok {
		return 0, false
	}
	bp := digestBufs.Get().(*[]byte)
	b, err := proto.MarshalOptions{Deterministic: true, AllowPartial: true}.MarshalAppend((*bp)[:0], m)
	if err != nil {
		digestBufs.Put(bp)
		return 0, false
	}
	h := maphash.Bytes(t.seed, b)
	if cap(b) <= 64<<10 {
		*bp = b[:0]
	}
	digestBufs.Put(bp)
	return h, true
}

var digestBufs = sync.Pool{New: func() any { b := make([]byte, 0, 256); return &b }}

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

// live reports whether e may still come back at now: its scope is not
// done, its window has not passed, and its route has not healed since.
func (e *returned) live(now time.Time) bool {
	if now.Sub(e.at) > returnWindow || e.at.UnixNano() <= e.key.route.outer.healed.Load() {
		return false
	}
	if d, ok := e.scope.(<-chan struct{}); ok {
		select {
		case <-d:
			return false
		default:
		}
	}
	return true
}

// remembers reports whether a call that failed with code is remembered.
func (c *Client) remembers(k *call, code codes.Code) bool {
	return transientCodes.Has(code) || c.failures.Has(code) || k.rule.retryable.Has(code)
}

// noteFailed remembers unary call k, which failed with err, so that a try
// of it that comes back is known. Only a call that sent an attempt is
// remembered (a try the suite refused before sending anything leaves its
// logical call as it was: refusals extend nothing), with a code a loop
// retries, while the caller's context is not done (a loop checks it
// before trying again).
func (c *Client) noteFailed(k *call, err error) {
	o := &k.outer
	if o.scope == nil || k.tally.sent == 0 || o.callerDone() {
		return
	}
	last := k.lastErr
	if last == nil {
		last = err
	}
	st := status.Convert(last)
	if !c.remembers(k, st.Code()) {
		return
	}
	t := c.table()
	d, ok := t.digest(o.req)
	if !ok {
		return
	}
	now := c.now()
	e := &returned{scope: o.scope, key: scopeRoute{words(o.scope), k.route}, digest: d, code: st.Code(),
		msg: strings.Clone(cut(st.Message(), maxRememberedMsg)), at: now, attempts: k.tally.prior + k.tally.sent, idemKey: o.madeKey}
	t.store(e, now)
	if n := now.UnixNano(); n > c.lastFailed.Load() {
		c.lastFailed.Store(n) // a benign race may keep an earlier time
	}
}

// table returns the Client's table, made on first use.
func (c *Client) table() *returnTable {
	if t := c.returns.Load(); t != nil {
		return t
	}
	c.returns.CompareAndSwap(nil, &returnTable{seed: maphash.MakeSeed()})
	return c.returns.Load()
}

// store remembers e, in place of the entry of the same request if any.
func (t *returnTable) store(e *returned, now time.Time) {
	h := e.key.hash()
	sh := t.shard(h)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.m == nil {
		sh.m = make(map[scopeRoute]*returned)
	}
	head := sh.m[e.key]
	if head == nil {
		t.slot(h).Add(1)
	}
	// e first, then the others of the chain, up to returnChain in all.
	e.next = nil
	last, n := e, 1
	for p := head; p != nil; {
		next := p.next
		if p.digest != e.digest && n < returnChain {
			p.next, last.next = nil, p
			last, n = p, n+1
		} else {
			sh.bytes -= p.size()
		}
		p = next
	}
	sh.m[e.key] = e
	sh.bytes += e.size()
	sh.inserts++
	if sh.bytes > returnMaxBytes/returnShards || sh.inserts > len(sh.m)+64 {
		t.sweep(sh, now)
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

// remove drops e from its chain, under sh's lock.
func (t *returnTable) remove(sh *returnShard, e *returned) {
	t.keep(sh, e.key, func(p *returned) bool { return p != e })
}

// keep keeps, of the chain of key, the entries keep says to, under sh's
// lock; a chain left empty drops its key.
func (t *returnTable) keep(sh *returnShard, key scopeRoute, keep func(*returned) bool) {
	head, ok := sh.m[key]
	if !ok {
		return
	}
	var first, last *returned
	for p := head; p != nil; {
		next := p.next
		if keep(p) {
			p.next = nil
			if last == nil {
				first = p
			} else {
				last.next = p
			}
			last = p
		} else {
			sh.bytes -= p.size()
		}
		p = next
	}
	if first == nil {
		delete(sh.m, key)
		t.slot(key.hash()).Add(^uint32(0))
		return
	}
	sh.m[key] = first
}

// sweep drops the entries of sh that can no longer come back, and, while
// sh is over its share of returnMaxBytes, the oldest, down to three
// quarters of it (under sh's lock).
func (t *returnTable) sweep(sh *returnShard, now time.Time) {
	sh.inserts = 0
	live := func(p *returned) bool { return p.live(now) }
	for k := range sh.m {
		t.keep(sh, k, live)
	}
	limit := returnMaxBytes / returnShards
	if sh.bytes <= limit {
		return
	}
	var ats []time.Time
	for _, head := range sh.m {
		for p := head; p != nil; p = p.next {
			ats = append(ats, p.at)
		}
	}
	slices.SortFunc(ats, time.Time.Compare)
	// Entries cost about the same: drop the oldest share.
	cut := ats[min(len(ats)-1, len(ats)*(sh.bytes-limit*3/4)/sh.bytes)]
	newer := func(p *returned) bool { return p.at.After(cut) }
	for k := range sh.m {
		t.keep(sh, k, newer)
	}
}

// cut returns s cut to at most n bytes, at a rune boundary, marked "…".
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := n - len("…")
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + "…"
}

// outerGate is a route's state for the tries of loops outside the suite
// that its budget or breaker refuses: it is locked when they are refused
// while the target has served nothing lately, and then lets one through
// now and then as a probe (see probeDue), until a call of the route
// succeeds. The zero value is unlocked and has never healed.
type outerGate struct {
	locked  atomic.Int64 // when (UnixNano, the Client's clock) it was locked; 0: it is not
	last    atomic.Int64 // when the last probe was sent (or the lock began)
	refused atomic.Int64 // tries refused since then
	seen    atomic.Int64 // when an attempt of the route last failed while it was locked
	healed  atomic.Int64 // when the last lock ended: the calls remembered until then are forgotten
}

// probeDue reports whether a try that came back, refused at now, is sent
// as a probe. A route that is not locked is locked now if its target has
// not served lately (served false). A locked route sends a probe
// outerProbeEvery after the last, while the tries it refuses arrive at
// outerProbeRate a second or more (workers stuck in a library's loop, a
// poller: a probe costs them at most a fifth of what they would send),
// and outerProbeSparse after it otherwise (a quiet client: the longest a
// breaker waits before its half-open probe). No probe is sent within that
// time of another attempt's failure (a new call's first attempt): the
// suite knows, without one, that the target still fails.
func (g *outerGate) probeDue(now time.Time, served bool) bool {
	n := now.UnixNano()
	if g.locked.Load() == 0 {
		if !served && g.locked.CompareAndSwap(0, n) {
			g.last.Store(n)
			g.refused.Store(0)
		}
		return false
	}
	refused := g.refused.Add(1)
	last := g.last.Load()
	elapsed := time.Duration(n - last)
	wait := outerProbeEvery
	if float64(refused) < outerProbeRate*elapsed.Seconds() {
		wait = outerProbeSparse
	}
	if elapsed < wait || time.Duration(n-g.seen.Load()) < wait {
		return false
	}
	if !g.last.CompareAndSwap(last, n) {
		return false // another try is the probe
	}
	g.refused.Store(0)
	return true
}

// failed notes that an attempt of the route failed at now.
func (g *outerGate) failed(now time.Time) {
	if g.locked.Load() != 0 {
		g.seen.Store(now.UnixNano())
	}
}

// heal ends the route's lock, if any: a call of it succeeded at now, so
// its target serves. The calls remembered until now no longer come back:
// the next try of each is a call of its own.
func (g *outerGate) heal(now time.Time) {
	if g.locked.Swap(0) != 0 {
		g.healed.Store(now.UnixNano())
	}
}

// servedLately reports whether the route's target answered an attempt
// with success lately: in the last one to two seconds of its endpoints'
// window, or, while no endpoint is known, in its breaker's window.
func (r *route) servedLately(now time.Time) bool {
	if served, known := r.endpoints.servedRecently(now); known {
		return served
	}
	if b := r.breaker; b != nil {
		st := b.StatsAt(now)
		return st.Attempts > st.Failures
	}
	return false
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
