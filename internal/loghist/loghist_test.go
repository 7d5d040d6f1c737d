package loghist

import (
	"testing"
	"time"

	"go.uber.org/goleak"
	"pgregory.net/rapid"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Every latency falls in the bucket whose bounds enclose it, for the two
// layouts in use and a few others.
func TestBucketAndUpperBoundAgree(t *testing.T) {
	for _, l := range []Layout{{2, 128}, {3, 288}, {1, 40}, {4, 100}} {
		rapid.Check(t, func(t *rapid.T) {
			d := time.Duration(rapid.Int64Range(-1e9, 1e13).Draw(t, "d"))
			i := l.Bucket(d)
			if i < 0 || i >= l.N {
				t.Fatalf("%+v: bucket %d of %v out of range", l, i, d)
			}
			if i < l.N-1 && d >= l.UpperBound(i) {
				t.Fatalf("%+v: %v above its bucket %d's bound %v", l, d, i, l.UpperBound(i))
			}
			if i > 0 && d < l.UpperBound(i-1) {
				t.Fatalf("%+v: %v in bucket %d, but below bucket %d's bound %v", l, d, i, i-1, l.UpperBound(i-1))
			}
		})
	}
}

func TestQuantile(t *testing.T) {
	counts := []uint32{0, 5, 0, 5}
	for _, tc := range []struct {
		q    float64
		want int
	}{{0, 1}, {0.49, 1}, {0.5, 3}, {0.99, 3}} {
		i, ok := Quantile(counts, 10, tc.q)
		if !ok || i != tc.want {
			t.Errorf("q=%v: bucket %d, %v; want %d", tc.q, i, ok, tc.want)
		}
	}
	if _, ok := Quantile(counts, 20, 0.9); ok {
		t.Error("a rank past the counts was found")
	}
}
