package dedupe

import (
	"context"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Defaults of MemoryConfig.
const (
	DefaultMaxEntries = 10_000
	DefaultMaxBytes   = 64 << 20
	// DefaultTTL is how long a completed record is kept by default: a day,
	// long enough for any client's retries (and for a person pressing
	// "pay" again the next morning) to be recognised.
	DefaultTTL = 24 * time.Hour
)

// EntryOverhead is what [MemoryStore] counts, in bytes, for the
// bookkeeping of each entry (the entry itself, its map slot and its Record
// header), on top of its scope, method and Record.Size.
const EntryOverhead = 320

// MemoryConfig configures a MemoryStore. The zero value gives the defaults.
type MemoryConfig struct {
	// MaxEntries bounds the entries held, in flight and completed;
	// 0 (or less): DefaultMaxEntries.
	MaxEntries int
	// MaxBytes bounds the bytes held, as counted per entry (EntryOverhead
	// + scope + method + Record.Size); 0 (or less): DefaultMaxBytes.
	MaxBytes int64
	// TTL is how long a completed record is kept after completion (a hit
	// does not extend it); 0 (or less): DefaultTTL.
	TTL time.Duration
	// Now is the clock; nil: time.Now.
	Now func() time.Time
}

// MemoryStore is the in-process [Store]: a map of entries bounded in count
// and bytes, with TTL and least-recently-used eviction of completed
// entries.
//
//   - Completed records expire TTL after completion. Expiry is lazy (no
//     background goroutine): expired entries are dropped, oldest first,
//     whenever a key is claimed or completed, and an expired entry found by
//     Claim is treated as absent.
//   - When a new key or a completed record needs room, the least recently
//     used completed entries (a replayed hit counts as a use) are evicted
//     until the entry fits. In-flight entries are never evicted.
//   - In-flight entries count toward both bounds. When the bounds are taken
//     by in-flight entries alone, Claim of a new key fails with
//     codes.ResourceExhausted: the handler has not run, so the caller may
//     retry later, and memory does not grow past the bounds.
//   - A record that does not fit even after evicting every completed entry
//     (larger than MaxBytes, or the rest is in flight) is not stored.
//     Instead the key keeps a small tombstone whose replay is
//     codes.Internal "response too large to keep": the request ran once
//     and must not run again, and its response is gone.
//
// Create one with [NewMemoryStore]; the zero MemoryStore is not usable. A
// MemoryStore is safe for concurrent use. A waiter wakes when the
// execution it waits for completes or is released, or when its context is
// done; nothing is left behind.
type MemoryStore struct {
	maxEntries int
	maxBytes   int64
	ttl        time.Duration
	now        func() time.Time

	mu       sync.Mutex
	entries  map[Scope]*entry
	root     entry // sentinel of the LRU list (links[lruList]) and expiry list (links[fifoList])
	inFlight int
	bytes    int64
	stats    MemoryStats
}

// MemoryStats is a snapshot of a MemoryStore's size and counters.
type MemoryStats struct {
	// Entries and InFlight count the entries held, and those in flight.
	Entries, InFlight int
	// Bytes is the bytes held, as counted against MaxBytes.
	Bytes int64
	// Evictions counts completed entries dropped for room before their TTL.
	Evictions uint64
	// Expirations counts completed entries dropped at their TTL.
	Expirations uint64
	// Oversized counts records kept as a tombstone because they did not
	// fit.
	Oversized uint64
	// Busy counts Claims refused with ResourceExhausted because the bounds
	// were taken by in-flight entries.
	Busy uint64
}

type entryState uint8

const (
	inFlight entryState = iota
	completed
	released
)

const (
	lruList  = 0 // front: most recently used
	fifoList = 1 // front: completed first, so expires first
)

type links struct{ prev, next *entry }

type entry struct {
	store   *MemoryStore
	scope   Scope
	fp      Fingerprint
	state   entryState
	rec     *Record
	size    int64
	expires time.Time
	done    chan struct{} // made by the first waiter; closed on complete or release
	links   [2]links      // in both lists only while completed and held
}

// insertAfter links x into list l right after e.
func (e *entry) insertAfter(x *entry, l int) {
	n := e.links[l].next
	x.links[l] = links{prev: e, next: n}
	e.links[l].next = x
	n.links[l].prev = x
}

// unlink takes e out of list l, if it is in it.
func (e *entry) unlink(l int) {
	p, n := e.links[l].prev, e.links[l].next
	if p == nil {
		return
	}
	p.links[l].next = n
	n.links[l].prev = p
	e.links[l] = links{}
}

// NewMemoryStore returns an empty MemoryStore configured by c.
func NewMemoryStore(c MemoryConfig) *MemoryStore {
	m := &MemoryStore{
		maxEntries: c.MaxEntries,
		maxBytes:   c.MaxBytes,
		ttl:        c.TTL,
		now:        c.Now,
		entries:    map[Scope]*entry{},
	}
	if m.maxEntries <= 0 {
		m.maxEntries = DefaultMaxEntries
	}
	if m.maxBytes <= 0 {
		m.maxBytes = DefaultMaxBytes
	}
	if m.ttl <= 0 {
		m.ttl = DefaultTTL
	}
	if m.now == nil {
		m.now = time.Now
	}
	for l := range m.root.links {
		m.root.links[l] = links{prev: &m.root, next: &m.root}
	}
	return m
}

// Stats returns a snapshot of the store's size and counters.
func (m *MemoryStore) Stats() MemoryStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.stats
	s.Entries, s.InFlight, s.Bytes = len(m.entries), m.inFlight, m.bytes
	return s
}

// Claim implements [Store]. It fails with codes.ResourceExhausted when a
// new key does not fit because the bounds are taken by in-flight entries.
func (m *MemoryStore) Claim(_ context.Context, scope Scope, fp Fingerprint) (Claim, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	m.expireLocked(now)
	if e, ok := m.entries[scope]; ok {
		switch {
		case e.state == inFlight:
			return Claim{State: InFlight, Scope: scope, Holder: e.fp, Token: e}, nil
		case now.Before(e.expires):
			e.unlink(lruList)
			m.root.insertAfter(e, lruList)
			return Claim{State: Done, Scope: scope, Holder: e.fp, Record: e.rec}, nil
		default: // expired, with a clock that went back or an out-of-order expiry list
			m.dropLocked(e)
			m.stats.Expirations++
		}
	}
	size := EntryOverhead + int64(len(scope.Identity)+len(scope.Key)+len(fp.Method))
	for len(m.entries)+1 > m.maxEntries || m.bytes+size > m.maxBytes {
		if !m.evictOldestLocked() {
			m.stats.Busy++
			return Claim{}, status.Error(codes.ResourceExhausted, "dedupe: store full of requests in flight ("+
				strconv.Itoa(m.inFlight)+" entries); try again later")
		}
	}
	e := &entry{store: m, scope: scope, fp: fp, state: inFlight, size: size}
	m.entries[scope] = e
	m.inFlight++
	m.bytes += size
	return Claim{State: Owned, Scope: scope, Holder: fp, Token: e}, nil
}

// tooLarge is the message of a tombstone's replay.
const tooLarge = "dedupe: this request was executed, but its response was too large to keep for replay; it is not executed again"

// Complete implements [Store]. A record that does not fit is replaced by a
// tombstone (see MemoryStore).
func (m *MemoryStore) Complete(_ context.Context, c Claim, rec *Record) error {
	if rec == nil {
		return status.Error(codes.Internal, "dedupe: Complete with a nil record")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	e, err := m.ownedLocked(c)
	if err != nil {
		return err
	}
	if rec.Fingerprint != e.fp {
		return status.Error(codes.Internal, "dedupe: Complete with a record for another request")
	}
	now := m.now()
	m.expireLocked(now)
	size := e.size + rec.Size()
	fits := size <= m.maxBytes
	for fits && m.bytes-e.size+size > m.maxBytes {
		fits = m.evictOldestLocked()
	}
	if !fits {
		// A tombstone takes no more than the in-flight entry did: its
		// message is a shared constant.
		rec = &Record{Fingerprint: e.fp, Code: codes.Internal, Message: tooLarge}
		size = e.size
		m.stats.Oversized++
	}
	m.bytes += size - e.size
	e.size = size
	e.state = completed
	e.rec = rec
	e.expires = now.Add(m.ttl)
	m.inFlight--
	m.root.insertAfter(e, lruList)
	m.root.links[fifoList].prev.insertAfter(e, fifoList)
	if e.done != nil {
		close(e.done)
	}
	return nil
}

// Release implements [Store].
func (m *MemoryStore) Release(_ context.Context, c Claim) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, err := m.ownedLocked(c)
	if err != nil {
		return err
	}
	delete(m.entries, e.scope)
	m.bytes -= e.size
	m.inFlight--
	e.state = released
	if e.done != nil {
		close(e.done)
	}
	return nil
}

// Wait implements [Store]. The record it returns is the one its execution
// completed with, even if that has since been evicted.
func (m *MemoryStore) Wait(ctx context.Context, c Claim) (*Record, error) {
	e, ok := c.Token.(*entry)
	if !ok || e == nil || e.store != m {
		return nil, status.Error(codes.Internal, "dedupe: Wait with a claim of another store")
	}
	m.mu.Lock()
	if e.state != inFlight {
		rec := e.rec
		m.mu.Unlock()
		return rec, nil
	}
	if e.done == nil {
		e.done = make(chan struct{})
	}
	done := e.done
	m.mu.Unlock()
	select {
	case <-done:
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return e.rec, nil
}

// ownedLocked returns the in-flight entry of the owned claim c.
func (m *MemoryStore) ownedLocked(c Claim) (*entry, error) {
	e, ok := c.Token.(*entry)
	if !ok || e == nil || e.store != m || c.State != Owned {
		return nil, status.Error(codes.Internal, "dedupe: not an owned claim of this store")
	}
	if e.state != inFlight {
		return nil, status.Error(codes.Internal, "dedupe: claim already completed or released")
	}
	return e, nil
}

// expireLocked drops the completed entries whose TTL has passed, oldest
// first.
func (m *MemoryStore) expireLocked(now time.Time) {
	for e := m.root.links[fifoList].next; e != &m.root && !now.Before(e.expires); e = m.root.links[fifoList].next {
		m.dropLocked(e)
		m.stats.Expirations++
	}
}

// evictOldestLocked drops the least recently used completed entry, and
// reports whether there was one.
func (m *MemoryStore) evictOldestLocked() bool {
	e := m.root.links[lruList].prev
	if e == &m.root {
		return false
	}
	m.dropLocked(e)
	m.stats.Evictions++
	return true
}

// dropLocked removes the completed entry e. Its record stays reachable by
// waiters that hold e.
func (m *MemoryStore) dropLocked(e *entry) {
	e.unlink(lruList)
	e.unlink(fifoList)
	delete(m.entries, e.scope)
	m.bytes -= e.size
}
