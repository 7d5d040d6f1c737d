package window_test

import (
	"math"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"pgregory.net/rapid"

	"github.com/stormguard/stormguard/internal/window"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var base = time.Unix(1_700_000_000, 0).UnixNano()

func at(d time.Duration) int64 { return base + int64(d) }

func TestCountsExpireWithTheirSlot(t *testing.T) {
	c := window.New(4, 2, time.Second)
	c.Add(at(0), 0, 1)
	c.Add(at(1500*time.Millisecond), 1, 2)
	for _, tt := range []struct {
		at   time.Duration
		a, b int64
	}{
		{1500 * time.Millisecond, 1, 2},
		{3999 * time.Millisecond, 1, 2},
		{4 * time.Second, 0, 2}, // the first slot has left the window
		{5 * time.Second, 0, 0},
	} {
		if a, b := c.Counts(at(tt.at)); a != tt.a || b != tt.b {
			t.Errorf("at %v: %d, %d; want %d, %d", tt.at, a, b, tt.a, tt.b)
		}
	}
	if got := c.Window(); got != 4*time.Second {
		t.Errorf("Window = %v", got)
	}
	if c.Slots() != 4 || c.Width() != time.Second {
		t.Errorf("Slots, Width = %d, %v", c.Slots(), c.Width())
	}
}

// TestTheWindowOnlyMovesForward: a reading at a time before the newest
// slot counted in reads the window ending at that slot, so that a reader
// whose clock reading is a little older than a writer's sees what the
// writer counted, and nothing that left the window.
func TestTheWindowOnlyMovesForward(t *testing.T) {
	c := window.New(4, 2, time.Second)
	c.Add(at(0), 0, 1)
	c.Add(at(4500*time.Millisecond), 1, 1)
	if a, b := c.Counts(at(0)); a != 0 || b != 1 {
		t.Fatalf("read at an old time: %d, %d; want 0, 1", a, b)
	}
}

// TestTheWindowIsSlotsLongNotTheRing: the ring is rounded up to a power of
// two (16 for 10 slots), but counts leave after 10 slots.
func TestTheWindowIsSlotsLongNotTheRing(t *testing.T) {
	c := window.New(10, 1, 100*time.Millisecond)
	c.Add(at(0), 0, 1)
	if a, _ := c.Counts(at(999 * time.Millisecond)); a != 1 {
		t.Fatalf("after 0.999 s: %d, want 1", a)
	}
	if a, _ := c.Counts(at(time.Second)); a != 0 {
		t.Fatalf("after 1 s: %d, want 0", a)
	}
}

func TestARingTurnResetsTheSlot(t *testing.T) {
	c := window.New(2, 2, time.Second)
	c.Add(at(0), 0, 5)
	c.Add(at(0), 1, 5)
	c.Add(at(2*time.Second), 0, 1) // the same slot, two turns on
	if a, b := c.Counts(at(2 * time.Second)); a != 1 || b != 0 {
		t.Fatalf("%d, %d; want 1, 0", a, b)
	}
	c.Add(at(0), 0, 7) // stale: dropped
	c.Add(at(0), 1, 7)
	if a, b := c.Counts(at(2 * time.Second)); a != 1 || b != 0 {
		t.Fatalf("after a stale count: %d, %d; want 1, 0", a, b)
	}
}

// TestALateCountWithinTheWindowCounts: a count made at a time before the
// newest slot, but within the window, counts in its own slot, and leaves
// the window with it.
func TestALateCountWithinTheWindowCounts(t *testing.T) {
	c := window.New(4, 2, time.Second)
	c.Add(at(3*time.Second), 0, 1)
	c.Add(at(1*time.Second), 1, 1) // late, within the window ending at 3 s
	if a, b := c.Counts(at(3 * time.Second)); a != 1 || b != 1 {
		t.Fatalf("%d, %d; want 1, 1", a, b)
	}
	if a, b := c.Counts(at(5 * time.Second)); a != 1 || b != 0 {
		t.Fatalf("once its slot left: %d, %d; want 1, 0", a, b)
	}
	c.Add(at(1*time.Second), 1, 1) // now older than the window: dropped
	if a, b := c.Counts(at(5 * time.Second)); a != 1 || b != 0 {
		t.Fatalf("after a count older than the window: %d, %d; want 1, 0", a, b)
	}
}

// TestSumOfTheNewestSlots: Sum reads the slots of a range of ages, for
// each kind of a histogram-like Counter.
func TestSumOfTheNewestSlots(t *testing.T) {
	c := window.New(8, 3, time.Second)
	for s := range 8 {
		c.Add(at(time.Duration(s)*time.Second), s%3, int64(s+1))
	}
	now := at(7 * time.Second)
	for _, r := range [][2]int{{0, 1}, {0, 2}, {0, 3}, {1, 3}, {2, 8}, {0, 8}, {0, 100}, {5, 100}, {3, 3}, {-2, 1}, {8, 9}} {
		var got [3]int64
		c.Sum(now, r[0], r[1], got[:])
		// Slot s (age 7−s) has s+1 events of kind s%3.
		var want [3]int64
		for age := max(r[0], 0); age < min(r[1], 8); age++ {
			s := 7 - age
			want[s%3] += int64(s + 1)
		}
		if got != want {
			t.Errorf("Sum(ages %d to %d) = %v, want %v", r[0], r[1], got, want)
		}
	}
	var two [2]int64
	c.Sum(now, 0, 8, two[:]) // fewer kinds asked for than counted
	if two != [2]int64{12, 15} {
		t.Errorf("Sum into 2 = %v", two)
	}
	var four [4]int64
	c.Sum(now, 0, 8, four[:]) // more kinds asked for than counted
	if four != [4]int64{12, 15, 9, 0} {
		t.Errorf("Sum into 4 = %v", four)
	}
}

func TestNegativeTimesRoundDown(t *testing.T) {
	c := window.New(2, 1, time.Second)
	if got := c.Slot(-1); got != -1 {
		t.Fatalf("Slot(-1ns) = %d, want -1", got)
	}
	if got := c.Slot(-int64(time.Second)); got != -1 {
		t.Fatalf("Slot(-1s) = %d, want -1", got)
	}
	c.Add(-1, 0, 1)
	c.Add(0, 0, 1)
	if a, _ := c.Counts(0); a != 2 {
		t.Fatalf("%d, want 2: -1 ns and 0 are in adjacent slots", a)
	}
	if a, _ := c.Counts(int64(time.Second)); a != 1 {
		t.Fatalf("%d, want 1", a)
	}
}

func TestSlotsSaturate(t *testing.T) {
	c := window.New(1, 1, time.Second)
	c.Add(base, 0, math.MaxUint32-1)
	c.Add(base, 0, 5)
	if a, _ := c.Counts(base); a != math.MaxUint32 {
		t.Fatalf("%d, want %d", a, uint32(math.MaxUint32))
	}
	c.Add(base, 0, 1)
	if a, _ := c.Counts(base); a != math.MaxUint32 {
		t.Fatalf("%d after one more, want %d", a, uint32(math.MaxUint32))
	}
	c.Add(base, 0, math.MaxInt64)
	if a, _ := c.Counts(base); a != math.MaxUint32 {
		t.Fatalf("%d after a huge count, want %d", a, uint32(math.MaxUint32))
	}
}

func TestNothingCountsButPositiveCountsOfKnownKinds(t *testing.T) {
	c := window.New(2, 2, time.Second)
	c.Add(base, 0, 0)
	c.Add(base, 0, -3)
	c.Add(base, 2, 1)
	c.Add(base, -1, 1)
	if a, b := c.Counts(base); a != 0 || b != 0 {
		t.Fatalf("%d, %d; want 0, 0", a, b)
	}
	if _, ok := c.Latest(); ok {
		t.Fatal("Latest reports a count")
	}
}

func TestResetKeepsTheWindowInPlace(t *testing.T) {
	c := window.New(4, 2, time.Second)
	c.Add(at(0), 0, 3)
	c.Add(at(2*time.Second), 1, 3)
	c.Reset()
	if a, b := c.Counts(at(2 * time.Second)); a != 0 || b != 0 {
		t.Fatalf("after Reset: %d, %d", a, b)
	}
	c.Add(at(2*time.Second), 0, 1)
	if a, b := c.Counts(at(2 * time.Second)); a != 1 || b != 0 {
		t.Fatalf("a count after Reset: %d, %d; want 1, 0", a, b)
	}
	if l, ok := c.Latest(); !ok || l != at(2*time.Second) {
		t.Fatalf("Latest = %d, %v", l, ok)
	}
}

func TestLatest(t *testing.T) {
	c := window.New(4, 1, time.Second)
	if _, ok := c.Latest(); ok {
		t.Fatal("a fresh Counter reports a count")
	}
	c.Add(at(2500*time.Millisecond), 0, 1)
	c.Add(at(1500*time.Millisecond), 0, 1)
	if l, ok := c.Latest(); !ok || l != at(2*time.Second) {
		t.Fatalf("Latest = %d, %v; want the start of the slot of 2.5 s", l, ok)
	}
}

func TestConcurrentAddsWithinASlot(t *testing.T) {
	c := window.New(4, 2, time.Hour)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				c.Add(base, 0, 1)
				c.Add(base, 1, 2)
			}
		})
	}
	wg.Wait()
	if a, b := c.Counts(base); a != 8000 || b != 16000 {
		t.Fatalf("%d, %d; want 8000, 16000", a, b)
	}
}

// TestConcurrentAddsAcrossSlots: writers whose times move on through many
// turns of the ring, and readers, together (for the race detector); the
// newest slot holds what the writers counted in it.
func TestConcurrentAddsAcrossSlots(t *testing.T) {
	c := window.New(3, 1, time.Millisecond)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for i := range 2000 {
				c.Add(int64(i/10)*int64(time.Millisecond), 0, 1)
				c.Counts(int64(i/10) * int64(time.Millisecond))
			}
		})
	}
	wg.Wait()
	var s [1]int64
	c.Sum(199*int64(time.Millisecond), 0, 1, s[:])
	if s[0] > 40 || s[0] < 1 {
		t.Fatalf("newest slot: %d, want at most 40 (4 writers × 10)", s[0])
	}
}

func TestAddDoesNotAllocate(t *testing.T) {
	c := window.New(4, 2, time.Second)
	if n := testing.AllocsPerRun(100, func() { c.Add(base, 1, 1) }); n != 0 {
		t.Fatalf("Add: %v allocations", n)
	}
	var s [2]int64
	if n := testing.AllocsPerRun(100, func() { c.Sum(base, 0, 4, s[:]) }); n != 0 {
		t.Fatalf("Sum: %v allocations", n)
	}
}

// TestAgainstAModel: from one goroutine, a Counter counts exactly what a
// list of every count, filtered by slot, says: counts in the window ending
// at the newest slot seen, dropped when older than it.
func TestAgainstAModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		slots := rapid.IntRange(1, 12).Draw(t, "slots")
		kinds := rapid.IntRange(1, 3).Draw(t, "kinds")
		width := int64(rapid.IntRange(1, 1000).Draw(t, "width"))
		c := window.New(slots, kinds, time.Duration(width))
		type count struct{ slot, kind, n int64 }
		var kept []count
		head := int64(math.MinInt64)
		now := rapid.Int64Range(-1e6, 1e6).Draw(t, "start")
		for range rapid.IntRange(1, 200).Draw(t, "steps") {
			now += rapid.Int64Range(-3*width, 5*width).Draw(t, "dt")
			s := floorDiv(now, width)
			if rapid.Bool().Draw(t, "add") {
				kind := rapid.IntRange(0, kinds-1).Draw(t, "kind")
				n := rapid.Int64Range(1, 5).Draw(t, "n")
				c.Add(now, kind, n)
				if head == math.MinInt64 || s > head-int64(slots) {
					kept = append(kept, count{s, int64(kind), n})
					head = max(head, s)
				}
				continue
			}
			from := rapid.IntRange(-1, slots).Draw(t, "from")
			to := rapid.IntRange(0, slots+2).Draw(t, "to")
			got := make([]int64, kinds)
			c.Sum(now, from, to, got)
			end := max(s, head)
			want := make([]int64, kinds)
			for _, k := range kept {
				if age := end - k.slot; age >= int64(max(from, 0)) && age < int64(min(to, slots)) {
					want[k.kind] += k.n
				}
			}
			for k := range want {
				if got[k] != want[k] {
					t.Fatalf("at %d (slot %d, newest %d), ages %d to %d: kind %d = %d, want %d", now, s, head, from, to, k, got[k], want[k])
				}
			}
		}
	})
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a < 0 && q*b != a {
		q--
	}
	return q
}

func TestOriginIsTheFirstTime(t *testing.T) {
	var o window.Origin
	if _, ok := o.First(); ok {
		t.Fatal("a zero Origin has a first time")
	}
	if got := o.Since(base); got != 0 {
		t.Fatalf("Since(first) = %d, want 0", got)
	}
	if got := o.Since(base + 5); got != 5 {
		t.Fatalf("Since(first+5) = %d, want 5", got)
	}
	if got := o.Since(base - 7); got != -7 {
		t.Fatalf("Since(first-7) = %d, want -7", got)
	}
	if f, ok := o.First(); !ok || f != base {
		t.Fatalf("First = %d, %v", f, ok)
	}
	// Even times and extremes are exact (no bit of the first time is lost).
	for _, first := range []int64{0, -1, 2, math.MaxInt64, math.MinInt64 + 1} {
		var o window.Origin
		if o.Since(first) != 0 || o.Since(first) != 0 {
			t.Errorf("first %d: not 0", first)
		}
		if f, _ := o.First(); f != first {
			t.Errorf("First = %d, want %d", f, first)
		}
	}
	var o2 window.Origin
	o2.Since(math.MaxInt64)
	if got := o2.Since(math.MinInt64); got != math.MinInt64 {
		t.Errorf("far before a far first time: %d, want saturated", got)
	}
}

// BenchmarkAdd: one count in the current slot, as a breaker records a
// success; parallel: every P counts in the same slot.
func BenchmarkAdd(b *testing.B) {
	c := window.New(10, 2, time.Second)
	b.Run("serial", func(b *testing.B) {
		for b.Loop() {
			c.Add(base, 0, 1)
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				c.Add(base, 0, 1)
			}
		})
	})
}
