package breaker

import "testing"

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
