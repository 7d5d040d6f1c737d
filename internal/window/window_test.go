package window_test

import (
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/stormguard/stormguard/internal/window"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var base = time.Unix(1_700_000_000, 0)

func TestCountsExpireWithTheirSlot(t *testing.T) {
	c := window.New(4, time.Second)
	c.Add(base, 1, 0)
	c.Add(base.Add(1500*time.Millisecond), 0, 2)
	for _, tt := range []struct {
		at   time.Duration
		a, b int64
	}{
		{0, 1, 0},
		{1500 * time.Millisecond, 1, 2},
		{3999 * time.Millisecond, 1, 2},
		{4 * time.Second, 0, 2}, // the first slot has left the window
		{5 * time.Second, 0, 0},
	} {
		if a, b := c.Counts(base.Add(tt.at)); a != tt.a || b != tt.b {
			t.Errorf("at %v: %d, %d; want %d, %d", tt.at, a, b, tt.a, tt.b)
		}
	}
	if got := c.Window(); got != 4*time.Second {
		t.Errorf("Window = %v", got)
	}
}

func TestARingTurnResetsTheSlot(t *testing.T) {
	c := window.New(2, time.Second)
	c.Add(base, 5, 5)
	c.Add(base.Add(2*time.Second), 1, 0) // the same slot, two turns on
	if a, b := c.Counts(base.Add(2 * time.Second)); a != 1 || b != 0 {
		t.Fatalf("%d, %d; want 1, 0", a, b)
	}
	c.Add(base, 7, 7) // stale: dropped
	if a, b := c.Counts(base.Add(2 * time.Second)); a != 1 || b != 0 {
		t.Fatalf("after a stale count: %d, %d; want 1, 0", a, b)
	}
}

func TestConcurrentAddsWithinASlot(t *testing.T) {
	c := window.New(4, time.Hour)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				c.Add(base, 1, 2)
			}
		})
	}
	wg.Wait()
	if a, b := c.Counts(base); a != 8000 || b != 16000 {
		t.Fatalf("%d, %d; want 8000, 16000", a, b)
	}
}

func TestAddDoesNotAllocate(t *testing.T) {
	c := window.New(4, time.Second)
	if n := testing.AllocsPerRun(100, func() { c.Add(base, 1, 0) }); n != 0 {
		t.Fatalf("%v allocations", n)
	}
}
