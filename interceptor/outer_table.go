package interceptor

import (
	"hash/maphash"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"
	"unsafe"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// The table of the failed calls a Client remembers, so that a try of one
// that comes back through a retry loop outside the suite is known (see
// outer.go): bounded in bytes, sharded, with a lock-free filter in front.

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

// live reports whether e may still come back at now: its scope is not
// done, its window has not passed, and its route has not healed since.
func (e *returned) live(now time.Time) bool {
	if now.Sub(e.at) > returnWindow || e.at.UnixNano() <= e.key.route.eng.Probes.Healed() {
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
