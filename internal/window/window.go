// Package window counts events over a sliding window of time: a ring of
// slots, each counting what happened in one slot-width of time, lock-free.
// It is the one counter the suite judges "lately" with: the retry budget's
// deposits and withdrawals, the breaker's attempts and failures, the
// overload guard's latency history, the outlier policy's per-endpoint
// outcomes, the server's per-method outcomes (and it fits the interceptor's
// per-endpoint outcomes: a lock-free count that does not allocate, a
// Latest for forgetting idle endpoints).
package window

import (
	"math"
	"math/bits"
	"sync/atomic"
	"time"

	"github.com/stormguard/stormguard/internal/satmath"
)

// Counter counts events of a few kinds (say, successes and failures, or
// the buckets of a histogram) over the last Slots slots of Width each: a
// count stops counting between (Slots−1) × Width and Slots × Width after it
// was made.
//
// Times are nanoseconds on the caller's own time line (UnixNano, or the
// time since an epoch of the caller's choosing): slot n holds the counts
// made at times in [n × Width, (n+1) × Width). The window only moves
// forward: a reading at a time before the newest slot counted in reads the
// window that ends with that slot, and a count made at a time older than
// the window is dropped, so that times read concurrently, a little out of
// order, are all counted.
//
// A slot counts up to 2³²−1 events of each kind; more saturate there. Sums
// are int64.
//
// The zero Counter is not usable; make one with New. A Counter is safe for
// concurrent use: Add is lock-free and does not allocate, Sum and Counts
// take no lock. A count made at a slot boundary, while another goroutine
// starts the slot, may be lost (and may take one count made at the new
// slot's start with it), but is never counted in another slot; a reading
// concurrent with Add or Reset may see part of their effect: the counts
// are for judging, not for accounting.
type Counter struct {
	width int64  // ns per slot (≥ 1)
	slots int64  // slots in the window (≥ 1)
	kinds int    // counts per slot (≥ 1)
	mask  uint64 // ring length − 1: the ring is a power of two ≥ slots
	// head is the newest slot counted in (empty: math.MinInt64).
	head atomic.Int64
	// nums holds, per ring slot, the slot number it counts for (empty:
	// math.MinInt64); counts holds ring slot i's kind k at i×kinds+k.
	nums   []atomic.Int64
	counts []atomic.Uint32
}

// empty marks a ring slot (and the head of a Counter) that has counted
// nothing yet.
const empty = math.MinInt64

// New returns a Counter of kinds kinds (at least 1) over a window of slots
// slots (at least 1) of width each (at least 1 ns). Its memory is fixed:
// about 8 + 4 × kinds bytes per slot, slots rounded up to a power of two.
func New(slots, kinds int, width time.Duration) *Counter {
	slots, kinds = max(slots, 1), max(kinds, 1)
	ring := 1 << bits.Len(uint(slots-1)) // the power of two ≥ slots
	c := &Counter{
		width:  max(int64(width), 1),
		slots:  int64(slots),
		kinds:  kinds,
		mask:   uint64(ring - 1),
		nums:   make([]atomic.Int64, ring),
		counts: make([]atomic.Uint32, ring*kinds),
	}
	c.head.Store(empty)
	for i := range c.nums {
		c.nums[i].Store(empty)
	}
	return c
}

// Width is the span of one slot.
func (c *Counter) Width() time.Duration { return time.Duration(c.width) }

// Slots is the number of slots in the window.
func (c *Counter) Slots() int { return int(c.slots) }

// Window is the span the Counter covers: Slots × Width.
func (c *Counter) Window() time.Duration { return time.Duration(c.width * c.slots) }

// Slot returns the number of the slot that time now falls in: ⌊now/Width⌋.
func (c *Counter) Slot(now int64) int64 {
	s := now / c.width
	if now < 0 && s*c.width != now {
		s-- // round towards −∞, so that every slot is Width long
	}
	return s
}

// Add counts n events (n > 0) of kind (0 ≤ kind < kinds) at time now. A
// count at a time older than the window ending at the newest slot is
// dropped; n ≤ 0 counts nothing.
func (c *Counter) Add(now int64, kind int, n int64) {
	if n <= 0 || uint(kind) >= uint(c.kinds) {
		return
	}
	s := c.Slot(now)
	i := uint64(s) & c.mask
	if c.nums[i].Load() != s && !c.claim(i, s) {
		return
	}
	a := &c.counts[int(i)*c.kinds+kind]
	if n >= math.MaxUint32 {
		a.Store(math.MaxUint32)
		return
	}
	if v := a.Add(uint32(n)); v < uint32(n) {
		a.Store(math.MaxUint32) // it wrapped: saturate
	}
	if c.nums[i].Load() != s {
		// Ring slot i began counting for a newer slot while n was added:
		// n may have landed in it, after its counts were emptied. Take n
		// back; if it landed before, it was emptied with the rest, and
		// this takes back counts made at the newer slot's start, which
		// may be lost. A count is never counted in a slot it was not
		// made in.
		takeBack(a, uint32(n))
	}
}

// takeBack subtracts n from a, down to 0; a saturated count stays so.
func takeBack(a *atomic.Uint32, n uint32) {
	for {
		v := a.Load()
		if v == math.MaxUint32 || a.CompareAndSwap(v, v-min(v, n)) {
			return
		}
	}
}

// claim makes ring slot i count for slot s, emptying it if it counted for
// an older turn of the ring, and reports whether it does. It reports false
// for a slot that counts for a newer turn, or for an s too old for the
// window: a count at s is stale.
func (c *Counter) claim(i uint64, s int64) bool {
	for {
		old := c.nums[i].Load()
		if old == s {
			return true
		}
		if h := c.head.Load(); old > s || (s < h && uint64(h)-uint64(s) >= uint64(c.slots)) {
			return false
		}
		if c.nums[i].CompareAndSwap(old, s) {
			cs := c.counts[int(i)*c.kinds : (int(i)+1)*c.kinds]
			for k := range cs {
				cs[k].Store(0)
			}
			for h := c.head.Load(); s > h && !c.head.CompareAndSwap(h, s); h = c.head.Load() {
			}
			return true
		}
	}
}

// Sum adds to into[k] the counts of kind k (for k < len(into) and < kinds)
// of the slots from to to−1 slots before the newest slot of the window
// ending at now (or at the newest slot counted in, if that is later).
// Sum(now, 0, 1, into) reads the newest slot; Sum(now, 0, c.Slots(), into)
// the whole window. to is capped at Slots.
func (c *Counter) Sum(now int64, from, to int, into []int64) {
	into = into[:min(len(into), c.kinds)]
	end := max(c.Slot(now), c.head.Load())
	for a := int64(max(from, 0)); a < min(int64(to), c.slots); a++ {
		s := end - a
		i := uint64(s) & c.mask
		if c.nums[i].Load() != s {
			continue
		}
		counts := c.counts[int(i)*c.kinds:]
		for k := range into {
			into[k] += int64(counts[k].Load())
		}
	}
}

// Counts returns the counts of kinds 0 and 1 (0 for a kind the Counter
// does not have) over the whole window ending at now, as Sum does.
func (c *Counter) Counts(now int64) (a, b int64) {
	var s [2]int64
	c.Sum(now, 0, int(c.slots), s[:])
	return s[0], s[1]
}

// Latest returns the start of the newest slot counted in (on the caller's
// time line), and false if nothing was ever counted.
func (c *Counter) Latest() (int64, bool) {
	h := c.head.Load()
	if h == empty {
		return 0, false
	}
	return satmath.Mul(h, c.width), true
}

// Reset forgets every count. The window stays where it is: a count older
// than the window ending at its newest slot is still dropped.
func (c *Counter) Reset() {
	for i := range c.counts {
		c.counts[i].Store(0)
	}
}

// Origin is the zero of a time line that starts at the first time it is
// given, so that a Counter's slots start then, whatever clock drives it: a
// simulation run twice from different instants sees the same slots.
//
// The zero Origin is ready to use; it is safe for concurrent use and must
// not be copied after first use.
type Origin struct {
	v atomic.Int64 // the first time, its sign bit flipped; 0: none yet
}

// Since returns t − the first time given to Since (saturating): 0 for the
// first call.
func (o *Origin) Since(t int64) int64 {
	v := o.v.Load()
	if v == 0 {
		o.v.CompareAndSwap(0, encode(t))
		v = o.v.Load()
	}
	return satmath.Sub(t, v^math.MinInt64)
}

// First returns the first time given to Since, and false if none was.
func (o *Origin) First() (int64, bool) {
	v := o.v.Load()
	return v ^ math.MinInt64, v != 0
}

// encode flips t's sign bit; the one time that would encode to 0 (none
// yet), math.MinInt64, is taken 1 ns later.
func encode(t int64) int64 {
	if t == math.MinInt64 {
		t++
	}
	return t ^ math.MinInt64
}
