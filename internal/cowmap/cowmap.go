// Package cowmap provides a copy-on-write map for read-mostly caches on the
// RPC hot path.
//
// Reads are one atomic load and one map lookup: no lock and no allocation.
// Writes copy the whole map under a mutex, so a Map suits keys that are
// created rarely and read on every call: per-method policies and per-target
// budgets or breakers.
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
	m  atomic.Pointer[map[K]V]
	mu sync.Mutex // serialises writers

	// Max bounds the number of entries; 0 means unbounded. Once the map
	// holds Max entries, LoadOrCreate still returns a value for a new key
	// but does not keep it. Set Max before first use.
	Max int
}

// Load returns the value stored for k, if any. It never blocks and never
// allocates.
func (c *Map[K, V]) Load(k K) (V, bool) {
	if p := c.m.Load(); p != nil {
		v, ok := (*p)[k]
		return v, ok
	}
	var zero V
	return zero, false
}

// LoadOrCreate returns the value stored for k. If there is none, it calls
// create(k) once, under the writers' lock, stores the result (unless the map
// is full, see Max) and returns it. Concurrent callers for the same missing
// key get the same stored value; create must not call back into c.
func (c *Map[K, V]) LoadOrCreate(k K, create func(K) V) V {
	if v, ok := c.Load(k); ok {
		return v
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.m.Load()
	if old != nil {
		if v, ok := (*old)[k]; ok {
			return v
		}
	}
	v := create(k)
	n := 0
	if old != nil {
		n = len(*old)
	}
	if c.Max > 0 && n >= c.Max {
		return v
	}
	next := make(map[K]V, n+1)
	if old != nil {
		for key, val := range *old {
			next[key] = val
		}
	}
	next[k] = v
	c.m.Store(&next)
	return v
}

// Len reports the number of stored entries.
func (c *Map[K, V]) Len() int {
	if p := c.m.Load(); p != nil {
		return len(*p)
	}
	return 0
}

// Range calls f for each entry of a consistent snapshot of the map, in no
// particular order, until f returns false.
func (c *Map[K, V]) Range(f func(K, V) bool) {
	p := c.m.Load()
	if p == nil {
		return
	}
	for k, v := range *p {
		if !f(k, v) {
			return
		}
	}
}
