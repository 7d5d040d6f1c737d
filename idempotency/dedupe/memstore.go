package dedupe

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Defaults of MemoryConfig.
const (
	DefaultMaxEntries = 100_000
	DefaultMaxBytes   = 64 << 20
	// DefaultTTL is how long a completed record is kept by default: a day,
	// long enough for any client's retries (and for a person pressing
	// "pay" again the next morning) to be recognised, room permitting.
	DefaultTTL = 24 * time.Hour
	// DefaultRetryHorizon is how long a completed record is protected from
	// eviction by default: longer than the retries of any one call.
	DefaultRetryHorizon = time.Minute
)

// MemoryConfig configures a MemoryStore. The zero value gives the defaults.
type MemoryConfig struct {
	// MaxEntries bounds the entries held, in flight and completed;
	// 0 (or less): DefaultMaxEntries.
	MaxEntries int
	// MaxBytes bounds the heap the store holds: each entry's bookkeeping,
	// key and record (Record.Size), and each identity's bookkeeping, as
	// the Go allocator sizes them; 0 (or less): DefaultMaxBytes.
	MaxBytes int64
	// MaxEntriesPerIdentity bounds the entries one identity holds (the
	// identity "" of anonymous callers included); 0 (or less): a quarter
	// of MaxEntries, at least 1. At most MaxEntries.
	MaxEntriesPerIdentity int
	// MaxBytesPerIdentity bounds the bytes one identity's entries hold;
	// 0 (or less): a quarter of MaxBytes. At most MaxBytes.
	MaxBytesPerIdentity int64
	// TTL is how long a completed record is kept after completion (a hit
	// does not extend it); 0 (or less): DefaultTTL.
	TTL time.Duration
	// RetryHorizon is how long after completion a record may not be
	// evicted to make room: a claim that would need to evict a younger
	// record is refused instead. 0: DefaultRetryHorizon; negative: no
	// protection (the oldest record is evicted, however young).
	RetryHorizon time.Duration
}

// MemoryStore is the in-process [Store]: a map of entries bounded in count
// and bytes, in total and per identity, with a TTL.
//
// Room is made by evicting the oldest completed records: the identity's
// own when it is at its share, never another identity's; any identity's
// when the store as a whole is full. An entry in flight or a record younger
// than RetryHorizon is never evicted: a Claim that would need that fails
// with codes.ResourceExhausted and a RetryInfo, before the handler runs. A
// record that does not fit is kept as a tombstone (see [Store]). Expiry is
// lazy: no goroutine runs in the background. Ages (TTL, RetryHorizon) are
// measured on the real clock, as the deadlines of the calls it serves are.
// The rules, and why they are these, are in README.md in this directory.
//
// Create one with [NewMemoryStore]; the zero MemoryStore is not usable. A
// MemoryStore is safe for concurrent use. A waiter wakes when the
// execution it waits for completes or is released, or when its context is
// done; nothing is left behind.
type MemoryStore struct {
	maxEntries, maxEntriesPerID int
	maxBytes, maxBytesPerID     int64
	ttl, horizon                time.Duration

	mu       sync.Mutex
	entries  map[Scope]*entry
	ids      map[string]*identity
	root     entry // sentinel of the list of completed entries, oldest first
	inFlight int
	bytes    int64
	stats    MemoryStats
}

// MemoryStats is a snapshot of a MemoryStore's size and counters.
type MemoryStats struct {
	// Entries and InFlight count the entries held, and those in flight.
	Entries, InFlight int
	// Identities counts the identities that hold entries.
	Identities int
	// Bytes is the heap held, as counted against MaxBytes.
	Bytes int64
	// Evictions counts completed entries dropped for room before their TTL.
	Evictions uint64
	// Expirations counts completed entries dropped at their TTL.
	Expirations uint64
	// Oversized counts records kept as a tombstone because they did not
	// fit: larger than the identity's share, or their room held by entries
	// in flight and records younger than RetryHorizon. Their calls were
	// answered; they count neither as Busy nor as OverQuota.
	Oversized uint64
	// Busy counts Claims refused with ResourceExhausted because the
	// store's bounds were taken by entries in flight and records younger
	// than RetryHorizon. It counts refused Claims only.
	Busy uint64
	// OverQuota counts Claims refused with ResourceExhausted because the
	// caller's identity held its share in entries in flight and records
	// younger than RetryHorizon. It counts refused Claims only.
	OverQuota uint64
}

type entryState uint8

const (
	inFlight entryState = iota
	completed
	released
)

const (
	allList = 0 // every completed entry, oldest first
	idList  = 1 // one identity's completed entries, oldest first
)

type links struct{ prev, next *entry }

type entry struct {
	store     *MemoryStore
	id        *identity
	key       string
	fp        Fingerprint
	state     entryState
	rec       *Record
	size      int64
	completed time.Time
	done      chan struct{} // made by the first waiter; closed on complete or release
	links     [2]links      // in both lists only while completed and held
}

// identity is what one identity holds.
type identity struct {
	name    string
	entries int
	bytes   int64 // its entries', against MaxBytesPerIdentity
	cost    int64 // its own, against MaxBytes
	root    entry // sentinel of links[idList]
}

// insertBefore links x into list l right before e (at the back, when e is
// a sentinel).
func (e *entry) insertBefore(x *entry, l int) {
	p := e.links[l].prev
	x.links[l] = links{prev: p, next: e}
	p.links[l].next = x
	e.links[l].prev = x
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

func initList(root *entry, l int) { root.links[l] = links{prev: root, next: root} }

// NewMemoryStore returns an empty MemoryStore configured by c.
func NewMemoryStore(c MemoryConfig) *MemoryStore {
	m := &MemoryStore{
		maxEntries:      c.MaxEntries,
		maxBytes:        c.MaxBytes,
		maxEntriesPerID: c.MaxEntriesPerIdentity,
		maxBytesPerID:   c.MaxBytesPerIdentity,
		ttl:             c.TTL,
		horizon:         c.RetryHorizon,
		entries:         map[Scope]*entry{},
		ids:             map[string]*identity{},
	}
	if m.maxEntries <= 0 {
		m.maxEntries = DefaultMaxEntries
	}
	if m.maxBytes <= 0 {
		m.maxBytes = DefaultMaxBytes
	}
	if m.maxEntriesPerID <= 0 {
		m.maxEntriesPerID = max(m.maxEntries/4, 1)
	}
	m.maxEntriesPerID = min(m.maxEntriesPerID, m.maxEntries)
	if m.maxBytesPerID <= 0 {
		m.maxBytesPerID = m.maxBytes / 4
	}
	m.maxBytesPerID = min(m.maxBytesPerID, m.maxBytes)
	if m.ttl <= 0 {
		m.ttl = DefaultTTL
	}
	if m.horizon == 0 {
		m.horizon = DefaultRetryHorizon
	}
	initList(&m.root, allList)
	return m
}

// Stats returns a snapshot of the store's size and counters.
func (m *MemoryStore) Stats() MemoryStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.stats
	s.Entries, s.InFlight, s.Identities, s.Bytes = len(m.entries), m.inFlight, len(m.ids), m.bytes
	return s
}

// Claim implements [Store]. It fails with codes.ResourceExhausted when a
// new key does not fit without evicting an entry in flight or a record
// younger than RetryHorizon.
func (m *MemoryStore) Claim(_ context.Context, scope Scope, fp Fingerprint) (Claim, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	m.expireLocked(now)
	if e, ok := m.entries[scope]; ok {
		switch {
		case e.state == inFlight:
			return Claim{State: InFlight, Scope: scope, Holder: e.fp, Token: e}, nil
		case now.Before(e.completed.Add(m.ttl)):
			return Claim{State: Done, Scope: scope, Holder: e.fp, Record: e.rec}, nil
		default: // expired, with a clock that went back
			m.dropLocked(e)
			m.stats.Expirations++
		}
	}
	size := entryCost(scope.Key)
	id := m.ids[scope.Identity]
	total := size // what the store takes in all
	if id == nil {
		total += identityCost(scope.Identity)
	}
	if r := m.roomLocked(id, 1, size, total, now); r != nil {
		if r.quota {
			m.stats.OverQuota++
		} else {
			m.stats.Busy++
		}
		return Claim{}, r.err()
	}
	if id = m.ids[scope.Identity]; id == nil { // new, or emptied to make room
		id = &identity{name: scope.Identity, cost: identityCost(scope.Identity)}
		initList(&id.root, idList)
		m.ids[id.name] = id
		m.bytes += id.cost
	}
	e := &entry{store: m, id: id, key: scope.Key, fp: fp, state: inFlight, size: size}
	m.entries[Scope{Identity: id.name, Key: scope.Key}] = e
	m.inFlight++
	m.add(id, 1, size)
	return Claim{State: Owned, Scope: scope, Holder: fp, Token: e}, nil
}

func (m *MemoryStore) add(id *identity, entries int, bytes int64) {
	id.entries += entries
	id.bytes += bytes
	m.bytes += bytes
}

// roomLocked evicts completed entries until id (nil for an identity that
// holds nothing yet) can take n more entries and size more bytes within
// its share, and the store n more entries and total more bytes within its
// bounds. It evicts the identity's own oldest records for its share, and
// the oldest of all for the store's bounds, but never a record younger
// than the retry horizon: then it returns the refusal, with the time until
// one is old enough. It counts evictions, not refusals: a refused Claim
// counts as Busy or OverQuota, a record that does not fit as Oversized.
func (m *MemoryStore) roomLocked(id *identity, n int, size, total int64, now time.Time) *refusal {
	if id != nil {
		for id.entries+n > m.maxEntriesPerID || id.bytes+size > m.maxBytesPerID {
			if wait, ok := m.evictOldestLocked(&id.root, idList, now); !ok {
				return &refusal{quota: true, wait: wait}
			}
		}
	} else if int64(n) > int64(m.maxEntriesPerID) || size > m.maxBytesPerID {
		return &refusal{quota: true, wait: busyPushback}
	}
	for len(m.entries)+n > m.maxEntries || m.bytes+total > m.maxBytes {
		if wait, ok := m.evictOldestLocked(&m.root, allList, now); !ok {
			return &refusal{wait: wait}
		}
	}
	return nil
}

// busyPushback is when to come back after a refusal while only entries in
// flight hold the room: they usually finish well within a second.
const busyPushback = time.Second

// refusal says why roomLocked found no room: the identity's share (quota)
// or the store's bounds are held by entries in flight and records younger
// than the retry horizon, and when to come back.
type refusal struct {
	quota bool
	wait  time.Duration
}

// err returns the ResourceExhausted status of a claim refused for r.
func (r *refusal) err() error {
	why := "the store is full"
	if r.quota {
		why = "this caller holds its share of the store"
	}
	return resourceExhausted("dedupe: "+why+" in requests in flight and records younger than the retry horizon; "+
		"the request did not run; try again in "+r.wait.Round(time.Millisecond).String(), r.wait)
}

// evictOldestLocked drops the oldest completed entry of list l (whose
// sentinel is root), unless it is younger than the retry horizon or the
// list is empty: then it says false, and how long until the oldest is old
// enough (busyPushback for an empty list).
func (m *MemoryStore) evictOldestLocked(root *entry, l int, now time.Time) (time.Duration, bool) {
	e := root.links[l].next
	if e == root {
		return busyPushback, false
	}
	if m.horizon > 0 {
		if wait := e.completed.Add(m.horizon).Sub(now); wait > 0 {
			return wait, false
		}
	}
	m.dropLocked(e)
	m.stats.Evictions++
	return 0, true
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
	now := time.Now()
	m.expireLocked(now)
	// The entry's size already counts a Record (see entryCost).
	grow := rec.Size() - allocSize(recordSize)
	if e.size+grow > m.maxBytesPerID || m.roomLocked(e.id, 0, grow, grow, now) != nil {
		// A tombstone is a Record and nothing else: its message is a
		// shared constant.
		rec = &Record{Fingerprint: e.fp, Code: codes.Internal, Message: tooLarge}
		grow = 0
		m.stats.Oversized++
	}
	m.add(e.id, 0, grow)
	e.size += grow
	e.state = completed
	e.rec = rec
	e.completed = now
	m.inFlight--
	m.root.insertBefore(e, allList)
	e.id.root.insertBefore(e, idList)
	if e.done != nil {
		close(e.done)
		e.done = nil // its waiters hold it
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
	m.inFlight--
	m.dropLocked(e)
	e.state = released
	if e.done != nil {
		close(e.done)
		e.done = nil
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
	for e := m.root.links[allList].next; e != &m.root && !now.Before(e.completed.Add(m.ttl)); e = m.root.links[allList].next {
		m.dropLocked(e)
		m.stats.Expirations++
	}
}

// dropLocked removes the entry e, completed or in flight (the caller
// counts the latter), and its identity once it holds nothing. Its record
// stays reachable by waiters that hold e.
func (m *MemoryStore) dropLocked(e *entry) {
	e.unlink(allList)
	e.unlink(idList)
	id := e.id
	delete(m.entries, Scope{Identity: id.name, Key: e.key})
	m.add(id, -1, -e.size)
	if id.entries == 0 {
		delete(m.ids, id.name)
		m.bytes -= id.cost
	}
}
