package outlier

import (
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
	"time"
)

// exactTail is fisherTail computed with big rationals.
func exactTail(x, n, k, N int) float64 {
	sum := new(big.Rat)
	total := new(big.Int).Binomial(int64(N), int64(n))
	for i := x; i <= min(k, n); i++ {
		if n-i > N-k {
			continue
		}
		num := new(big.Int).Mul(new(big.Int).Binomial(int64(k), int64(i)), new(big.Int).Binomial(int64(N-k), int64(n-i)))
		sum.Add(sum, new(big.Rat).SetFrac(num, total))
	}
	f, _ := sum.Float64()
	return f
}

func TestFisherTail(t *testing.T) {
	// 10 of 10 failed on one endpoint, 0 of 10 on the other: 1/C(20,10).
	if got, want := fisherTail(10, 10, 10, 20, 1), 1.0/184756; math.Abs(got-want) > 1e-12 {
		t.Errorf("fisherTail(10,10,10,20) = %g, want %g", got, want)
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		N := 2 + r.IntN(120)
		n := 1 + r.IntN(N-1)
		k := r.IntN(N + 1)
		x := r.IntN(min(n, k) + 1)
		got, want := fisherTail(x, n, k, N, 1), exactTail(x, n, k, N)
		if x == 0 {
			want = 1
		}
		if math.Abs(got-want) > 1e-9*max(1, want) && !(want < 1e-12 && got < 1e-12) {
			t.Fatalf("fisherTail(%d, %d, %d, %d) = %g, want %g", x, n, k, N, got, want)
		}
		// With a level, the answer is exact at or below it, and above it
		// when the tail is.
		if got := fisherTail(x, n, k, N, 1e-3); (want <= 1e-3) != (got <= 1e-3) {
			t.Fatalf("fisherTail(%d, %d, %d, %d, 1e-3) = %g, exact %g", x, n, k, N, got, want)
		}
	}
	// Large counts stay finite and fast.
	if got := fisherTail(50_000, 100_000, 60_000, 200_000, alpha); got > alpha {
		t.Errorf("50%% vs 10%% of 100,000 each: tail %g", got)
	}
	if got := fisherTail(30_000, 100_000, 60_000, 200_000, alpha); got <= alpha {
		t.Errorf("equal ratios: tail %g", got)
	}
}

// judge is the decision on one window of counts: what decide does for
// each endpoint when only one window is tried.
func judge(f, n []int, ratio float64) (ejected []int) {
	tf, tn := 0, 0
	for i := range f {
		tf += f[i]
		tn += n[i]
	}
	for i := range f {
		fr, nr := tf-f[i], tn-n[i]
		if n[i] < defaultMinRequests || nr < defaultMinRequests {
			continue
		}
		if standsOut(f[i], n[i], fr, nr, ratio) && fisherTail(f[i], n[i], tf, tn, alpha/8) <= alpha/8 {
			ejected = append(ejected, i)
		}
	}
	return ejected
}

// TestEvenFailuresNeverStandOut draws, with a fixed seed, up to 20,000
// windows per case (fewer for large windows) in which every endpoint fails each request with the same
// probability, and finds no endpoint that would be ejected; and one that
// always fails is found from 15 requests each among endpoints that never
// fail, from 25 among endpoints that fail 5% of requests.
func TestEvenFailuresNeverStandOut(t *testing.T) {
	r := rand.New(rand.NewPCG(2026, 14))
	for _, k := range []int{2, 3, 5, 10} {
		for _, n := range []int{10, 20, 50, 200, 1000} {
			for _, p := range []float64{0.05, 0.3, 0.5, 0.7, 0.9, 0.99} {
				f, ns := make([]int, k), make([]int, k)
				false_, trials := 0, min(20_000, 200_000/n)
				for range trials {
					for j := range k {
						ns[j], f[j] = n, binomial(r, n, p)
					}
					if len(judge(f, ns, defaultFailureRatio)) > 0 {
						false_++
					}
				}
				if false_ > 0 {
					t.Errorf("%d endpoints, %d requests each, p=%g: %d of %d windows eject one", k, n, p, false_, trials)
				}
			}
		}
	}
	for _, k := range []int{2, 3, 5} {
		for p, n := range map[float64]int{0: 15, 0.05: 25} {
			f, ns := make([]int, k), make([]int, k)
			for range 1000 {
				for j := range k {
					ns[j], f[j] = n, binomial(r, n, p)
				}
				f[0] = n
				if got := judge(f, ns, defaultFailureRatio); len(got) != 1 || got[0] != 0 {
					t.Fatalf("%d endpoints, %d requests each, one dead, the others p=%g: ejected %v, want [0]", k, n, p, got)
				}
			}
		}
	}
}

func binomial(r *rand.Rand, n int, p float64) int {
	x := 0
	for range n {
		if r.Float64() < p {
			x++
		}
	}
	return x
}

func TestStandsOut(t *testing.T) {
	for _, tc := range []struct {
		fi, ni, fr, nr int
		want           bool
	}{
		{10, 10, 0, 10, true},
		{5, 10, 0, 10, true},    // 0.5 ≥ 0.5, gap 0.5
		{4, 10, 0, 10, false},   // below the ratio
		{9, 10, 8, 10, false},   // gap 0.1
		{10, 10, 8, 10, true},   // gap 0.2
		{0, 0, 0, 10, false},    // no requests
		{10, 10, 0, 0, false},   // no others
		{10, 10, 10, 10, false}, // all fail
	} {
		if got := standsOut(tc.fi, tc.ni, tc.fr, tc.nr, 0.5); got != tc.want {
			t.Errorf("standsOut(%d/%d vs %d/%d) = %v, want %v", tc.fi, tc.ni, tc.fr, tc.nr, got, tc.want)
		}
	}
}

func TestEjectionTime(t *testing.T) {
	cfg := Config{BaseEjectionTime: 5 * time.Second, MaxEjectionTime: 12 * time.Second}
	for times, want := range []time.Duration{5 * time.Second, 5 * time.Second, 10 * time.Second, 12 * time.Second, 12 * time.Second} {
		if got := ejectionTime(cfg, times); got != want {
			t.Errorf("ejection %d: %v, want %v", times, got, want)
		}
	}
	if got := ejectionTime(cfg, math.MaxInt); got != 12*time.Second {
		t.Errorf("ejection MaxInt: %v", got)
	}
	// A cap below the base does not shorten the base.
	cfg.MaxEjectionTime = time.Second
	if got := ejectionTime(cfg, 3); got != 5*time.Second {
		t.Errorf("max below base: %v, want 5s", got)
	}
}

func TestMaxEjections(t *testing.T) {
	cfg := Config{}.withDefaults()
	for n, want := range []int{0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5} {
		if got := maxEjections(n, cfg); got != want {
			t.Errorf("%d endpoints at 50%%: %d, want %d", n, got, want)
		}
	}
	cfg.MaxEjectionPercent = 100
	if got := maxEjections(3, cfg); got != 2 {
		t.Errorf("3 endpoints at 100%%: %d, want 2 (never all)", got)
	}
	cfg.MaxEjectionPercent = 10
	if got := maxEjections(2, cfg); got != 1 {
		t.Errorf("2 endpoints at 10%%: %d, want 1", got)
	}
}

func TestCanonicalAddr(t *testing.T) {
	for in, want := range map[string]string{
		"127.0.0.1:80":          "127.0.0.1:80",
		"[::ffff:127.0.0.1]:80": "127.0.0.1:80",
		"[::1]:443":             "[::1]:443",
		"[0:0:0:0:0:0:0:1]:443": "[::1]:443",
		"example.com:443":       "example.com:443",
		"":                      "",
	} {
		if got := canonicalAddr(in); got != want {
			t.Errorf("canonicalAddr(%q) = %q, want %q", in, got, want)
		}
	}
}
