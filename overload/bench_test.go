package overload

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkAdmitDone measures one admitted request: Method lookup, Admit
// and Done, with the clock read twice (time.Now), on a method with a warm
// history, from one goroutine and from all.
func BenchmarkAdmitDone(b *testing.B) {
	g := New(Config{})
	const name = "/bench.Svc/Method"
	warm := g.Method(name)
	for range 100 {
		t, _ := warm.Admit(Request{Deadline: time.Now().Add(time.Second)})
		t.Done()
	}
	deadline := time.Now().Add(time.Hour)
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			t, d := g.Method(name).Admit(Request{Deadline: deadline})
			if d.Reason != Admitted {
				b.Fatal(d)
			}
			t.Done()
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				t, d := g.Method(name).Admit(Request{Deadline: deadline})
				if d.Reason != Admitted {
					b.Fatal(d)
				}
				t.Done()
			}
		})
	})
	// Eight methods, as a server with several busy methods has.
	b.Run("parallel-8-methods", func(b *testing.B) {
		var names [8]string
		for i := range names {
			names[i] = fmt.Sprintf("/bench.Svc/M%d", i)
		}
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				i++
				t, _ := g.Method(names[i%8]).Admit(Request{Deadline: deadline})
				t.Done()
			}
		})
	})
	b.Run("off", func(b *testing.B) {
		g := New(Config{NoAdmission: true, NoShedding: true})
		b.ReportAllocs()
		for b.Loop() {
			t, _ := g.Method(name).Admit(Request{Deadline: deadline})
			t.Done()
		}
	})
}

// BenchmarkRefuse measures a refusal on arrival (the path an overloaded
// server takes for most requests).
func BenchmarkRefuse(b *testing.B) {
	g := New(Config{NoAdaptive: true, MaxConcurrency: 1, NoAdmission: true})
	m := g.Method("/bench.Svc/Method")
	hold, _ := m.Admit(Request{})
	defer hold.Done()
	b.ReportAllocs()
	for b.Loop() {
		if _, d := m.Admit(Request{Retry: true}); d.Reason != ShedRetry {
			b.Fatal(d)
		}
	}
}
