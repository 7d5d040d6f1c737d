// Package window counts events over a sliding window of time: a ring of
// slots, each counting what happened in one slot-width of time, lock-free.
// It serves every part of the suite that judges what happened lately.
package window

import (
	"sync/atomic"
	"time"
)

// Counter counts two kinds of events (say, successes and failures) over
// the last Slots × Width of time, in slots of Width: a count stops
// counting between (Slots−1) × Width and Slots × Width after it was made.
//
// The zero Counter is not usable; make one with New. A Counter is safe for
// concurrent use: Add is lock-free and does not allocate; a count made at
// a slot boundary, while another goroutine starts the slot, may be lost
// (the counts are for judging, not for accounting).
type Counter struct {
	width int64 // ns per slot
	slots []slot
}

type slot struct {
	n    atomic.Int64 // the slot number it counts for
	a, b atomic.Int64
	_    [40]byte // one slot per cache line: slots are written concurrently
}

// New returns a Counter of slots slots of width each (at least 1 and
// 1 ns).
func New(slots int, width time.Duration) *Counter {
	return &Counter{width: max(int64(width), 1), slots: make([]slot, max(slots, 1))}
}

// Window is the span the Counter covers: slots × width.
func (c *Counter) Window() time.Duration { return time.Duration(c.width * int64(len(c.slots))) }

// Add counts a events of the first kind and b of the second at now.
// Counts at a time older than the window are dropped.
func (c *Counter) Add(now time.Time, a, b int64) {
	n := now.UnixNano() / c.width
	s := &c.slots[uint64(n)%uint64(len(c.slots))]
	if old := s.n.Load(); old != n {
		// A slot from an older turn of the ring: the first to see it
		// resets it.
		if old > n || !s.n.CompareAndSwap(old, n) {
			if s.n.Load() != n {
				return // a stale count
			}
		} else {
			s.a.Store(0)
			s.b.Store(0)
		}
	}
	if a != 0 {
		s.a.Add(a)
	}
	if b != 0 {
		s.b.Add(b)
	}
}

// Counts returns the counts of both kinds in the window ending at now.
func (c *Counter) Counts(now time.Time) (a, b int64) {
	n := now.UnixNano() / c.width
	for i := range c.slots {
		s := &c.slots[i]
		if sn := s.n.Load(); sn > n-int64(len(c.slots)) && sn <= n {
			a += s.a.Load()
			b += s.b.Load()
		}
	}
	return a, b
}
