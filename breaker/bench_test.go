package breaker

import (
	"testing"
	"time"
)

// The hot path is a closed breaker: Allow (or Admit) and the report of a
// successful attempt, on the real clock.

func BenchmarkAllowDone(b *testing.B) {
	br := New(Config{})
	b.ReportAllocs()
	for b.Loop() {
		done, err := br.Allow()
		if err != nil {
			b.Fatal(err)
		}
		done(false)
	}
}

func BenchmarkAllowDoneParallel(b *testing.B) {
	br := New(Config{})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			done, err := br.Allow()
			if err != nil {
				b.Fatal(err)
			}
			done(false)
		}
	})
}

var sinkDone func(bool)

// BenchmarkAllowDoneEscaping stores done where the compiler cannot follow
// it, as a caller that keeps it in a struct would: the closure and its
// ticket move to the heap.
func BenchmarkAllowDoneEscaping(b *testing.B) {
	br := New(Config{})
	b.ReportAllocs()
	for b.Loop() {
		done, err := br.Allow()
		if err != nil {
			b.Fatal(err)
		}
		sinkDone = done
		done(false)
	}
}

func BenchmarkAdmitDone(b *testing.B) {
	br := New(Config{})
	b.ReportAllocs()
	for b.Loop() {
		t, err := br.Admit()
		if err != nil {
			b.Fatal(err)
		}
		t.Done(false)
	}
}

func BenchmarkAdmitDoneParallel(b *testing.B) {
	br := New(Config{})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			t, err := br.Admit()
			if err != nil {
				b.Fatal(err)
			}
			t.Done(false)
		}
	})
}

// BenchmarkAllowOpen is a refusal by an open breaker.
func BenchmarkAllowOpen(b *testing.B) {
	br := New(Config{MinAttempts: 1, OpenTimeout: time.Hour})
	done, _ := br.Allow()
	done(true)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := br.Allow(); err != ErrOpen {
			b.Fatal(err)
		}
	}
}

func BenchmarkRegistryFor(b *testing.B) {
	r := NewRegistry(Config{})
	r.For("payments:443")
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			r.For("payments:443")
		}
	})
}

// TestAllowDoneDoesNotAllocate keeps the allocation promise: if Allow stops
// being inlinable, its done closure escapes and this fails.
func TestAllowDoneDoesNotAllocate(t *testing.T) {
	br := New(Config{})
	if n := testing.AllocsPerRun(1000, func() {
		done, _ := br.Allow()
		done(false)
	}); n != 0 {
		t.Errorf("Allow+done: %v allocs, want 0", n)
	}
	if n := testing.AllocsPerRun(1000, func() {
		tk, _ := br.Admit()
		tk.Done(false)
	}); n != 0 {
		t.Errorf("Admit+Done: %v allocs, want 0", n)
	}
}
