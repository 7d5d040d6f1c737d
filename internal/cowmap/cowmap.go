// Package cowmap provides a copy-on-write map for read-mostly caches on the
// RPC hot path.
//
// A read of a key that has been in the map for a while is one atomic load
// and one map lookup: no lock and no allocation. New keys first go to a
// small locked map and are copied into the lock-free one in batches, so
// adding n keys costs O(n) copying in all, not O(n²).
package cowmap

import (
	"sync"
	"sync/atomic"
)

// Map is a copy-on-write map from K to V.
//
// The zero value is an empty, unbounded Map ready for use. A Map must not be
// copied after first use. All methods are safe for concurrent use.
type Map[K comparable, V any] struct {
	read     atomic.Pointer[map[K]V] // never modified once stored
	npending atomic.Int32            // len(pending), readable without mu
	full     atomic.Bool             // the map holds Max entries (for good: nothing is removed)

	mu      sync.Mutex
	pending map[K]V // keys not yet in read
	misses  int     // locked reads since the last promotion

	// Max bounds the number of entries; 0 means unbounded. Once the map
	// holds Max entries, LoadOrCreate still returns a value for a new key
	// but does not keep it. Set Max before first use.
	Max int
}

// Load returns the value stored for k, if any. It never allocates; it
// takes a lock only for keys added since the last batch was published.
func (c *Map[K, V]) Load(k K) (V, bool) {
	if p := c.read.Load(); p != nil {
		if v, ok := (*p)[k]; ok {
			return v, true
		}
	}
	var zero V
	if c.npending.Load() == 0 {
		return zero, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.pending[k]
	if ok {
		c.misses++
		c.maybePromoteLocked()
	}
	return v, ok
}

// LoadOrCreate returns the value stored for k. If there is none, it calls
// create(k) once, under the writers' lock, stores the result and returns
// it: concurrent callers for the same missing key get the same stored
// value. Once the map is full (see Max), a missing key's value is created
// on every call, without the lock, and not kept. create must not call
// back into c.
func (c *Map[K, V]) LoadOrCreate(k K, create func(K) V) V {
	if v, ok := c.Load(k); ok {
		return v
	}
	if c.full.Load() {
		return create(k)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	read := c.read.Load()
	if read != nil {
		if v, ok := (*read)[k]; ok {
			return v
		}
	}
	if v, ok := c.pending[k]; ok {
		return v
	}
	v := create(k)
	if c.Max > 0 && c.lenLocked() >= c.Max {
		c.full.Store(true)
		return v
	}
	if c.pending == nil {
		c.pending = map[K]V{}
	}
	c.pending[k] = v
	c.npending.Store(int32(len(c.pending)))
	c.maybePromoteLocked()
	return v
}

// LoadOrCreateIfRoom is LoadOrCreate for values that must not be created
// unless they are kept (they register themselves elsewhere, say): once the
// map is full (see Max), a missing key gets the zero V and false, and
// create is not called. Otherwise it returns the stored value and true.
func (c *Map[K, V]) LoadOrCreateIfRoom(k K, create func(K) V) (V, bool) {
	if v, ok := c.Load(k); ok {
		return v, true
	}
	var zero V
	if c.full.Load() {
		return zero, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if read := c.read.Load(); read != nil {
		if v, ok := (*read)[k]; ok {
			return v, true
		}
	}
	if v, ok := c.pending[k]; ok {
		return v, true
	}
	if c.Max > 0 && c.lenLocked() >= c.Max {
		c.full.Store(true)
		return zero, false
	}
	v := create(k)
	if c.pending == nil {
		c.pending = map[K]V{}
	}
	c.pending[k] = v
	c.npending.Store(int32(len(c.pending)))
	c.maybePromoteLocked()
	return v, true
}

// maybePromoteLocked publishes the pending keys once they are as many as
// the published ones, or once as many locked reads have hit them: each
// copy is paid for by at least as many inserts or reads as it copies.
func (c *Map[K, V]) maybePromoteLocked() {
	n := 0
	if p := c.read.Load(); p != nil {
		n = len(*p)
	}
	if len(c.pending) < n && c.misses < n {
		return
	}
	next := make(map[K]V, n+len(c.pending))
	if p := c.read.Load(); p != nil {
		for k, v := range *p {
			next[k] = v
		}
	}
	for k, v := range c.pending {
		next[k] = v
	}
	c.read.Store(&next)
	c.pending, c.misses = nil, 0
	c.npending.Store(0)
}

func (c *Map[K, V]) lenLocked() int {
	n := len(c.pending)
	if p := c.read.Load(); p != nil {
		n += len(*p)
	}
	return n
}

// Len reports the number of stored entries.
func (c *Map[K, V]) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lenLocked()
}

// Range calls f for each entry of a snapshot of the map, in no particular
// order, until f returns false. f may call back into c.
func (c *Map[K, V]) Range(f func(K, V) bool) {
	c.mu.Lock()
	read := c.read.Load()
	var pending map[K]V
	if len(c.pending) > 0 {
		pending = make(map[K]V, len(c.pending))
		for k, v := range c.pending {
			pending[k] = v
		}
	}
	c.mu.Unlock()
	if read != nil {
		for k, v := range *read {
			if !f(k, v) {
				return
			}
		}
	}
	for k, v := range pending {
		if !f(k, v) {
			return
		}
	}
}
