package budget_test

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stormguard/stormguard/budget"
)

// fleetCell is one fleet simulation: n clients, each with its own Budget,
// each sending rate calls per second (evenly spaced, each client with its
// own random phase) for a failure of dur, every attempt failing with
// probability p, up to 3 attempts per call, the retries sent at once.
// warm clients run healthy for warmUp before the failure.
type fleetCell struct {
	n    int
	rate float64
	p    float64
	dur  time.Duration
	warm bool
	seed uint64
	// throttle runs grpc-go's retryThrottling {maxTokens 10, tokenRatio
	// 0.1} per client instead of a Budget (transcribed from grpc-go's
	// clientconn.go), for comparison.
	throttle bool
}

// warmUp is how long warm clients run healthy before the failure.
const warmUp = 10 * time.Second

type fleetResult struct {
	calls, attempts, ok       int // whole failure
	callsAfter, attemptsAfter int // from 5 s into the failure on
	noRetryOK                 int // calls whose first attempt succeeded
	// carried is the credit the clients held at 5 s, in retries: what
	// they may spend from then on beyond a tenth of their calls.
	carried float64
}

func (r fleetResult) okPct() float64    { return 100 * float64(r.ok) / float64(r.calls) }
func (r fleetResult) amp() float64      { return float64(r.attempts) / float64(r.calls) }
func (r fleetResult) ampAfter() float64 { return float64(r.attemptsAfter) / float64(r.callsAfter) }

func runFleet(c fleetCell) fleetResult {
	rng := rand.New(rand.NewPCG(c.seed, 42))
	type client struct {
		b      *budget.Budget
		tokens float64
		phase  time.Duration
	}
	period := time.Duration(float64(time.Second) / c.rate)
	clients := make([]client, c.n)
	for i := range clients {
		clients[i] = client{b: budget.New(budget.Config{}), tokens: 10, phase: time.Duration(rng.Int64N(int64(period)))}
	}
	start := base
	if c.warm {
		for i := range clients {
			for t := clients[i].phase; t < warmUp; t += period {
				clients[i].b.DepositAt(start.Add(t))
			}
		}
		start = start.Add(warmUp)
	}
	// Merge the clients' call times in time order: one event per call.
	type ev struct {
		at time.Duration
		i  int
	}
	var evs []ev
	for i := range clients {
		for t := clients[i].phase; t < c.dur; t += period {
			evs = append(evs, ev{t, i})
		}
	}
	slices.SortFunc(evs, func(a, b ev) int { return cmp.Compare(a.at, b.at) })
	var r fleetResult
	carriedAt := -1 // the first event at or after 5 s
	for n, e := range evs {
		if carriedAt < 0 && e.at >= 5*time.Second && !c.throttle {
			carriedAt = n
			for i := range clients {
				r.carried += max(0, clients[i].b.StatsAt(start.Add(e.at)).Credit)
			}
		}
		now := start.Add(e.at)
		cl := &clients[e.i]
		if !c.throttle {
			cl.b.DepositAt(now)
		}
		after := e.at >= 5*time.Second
		attempts, ok := 0, false
		for a := 1; a <= 3; a++ {
			if a > 1 && !c.throttle && !cl.b.WithdrawAt(now) {
				break
			}
			attempts++
			if rng.Float64() >= c.p {
				ok = true
				if a == 1 {
					r.noRetryOK++
				}
				if c.throttle {
					cl.tokens = min(cl.tokens+0.1, 10)
				}
				break
			}
			if c.throttle {
				if cl.tokens = max(cl.tokens-1, 0); cl.tokens <= 5 {
					break
				}
			}
		}
		r.calls++
		r.attempts += attempts
		if ok {
			r.ok++
		}
		if after {
			r.callsAfter++
			r.attemptsAfter += attempts
		}
	}
	return r
}

// TestFleetBound is the fleet bound of the package documentation, over
// the grid of budget/README.md: N clients, each with its own Budget, at r calls a
// second each, every attempt failing with probability p for 30 s, up to 3
// attempts per call; fresh clients, and clients warmed by JudgeWindow of
// healthy calls.
//
//   - From 5 s into the failure on, the fleet's attempts are at most 1.10×
//     its calls; over the whole 30 s, 1.10× plus Burst retries per client.
//   - Its calls succeed at least as often as with no retries, and never
//     less often than with grpc-go's retryThrottling where that sends no
//     more attempts (within half a point).
func TestFleetBound(t *testing.T) {
	type cell struct {
		n    int
		rate float64
	}
	cells := []cell{{1, 1000}, {1, 2000}}
	for _, n := range []int{20, 200, 1000} {
		for _, r := range []float64{1, 5, 50} {
			cells = append(cells, cell{n, r})
		}
	}
	for _, c := range cells {
		if raceEnabled && float64(c.n)*c.rate > 1000 {
			continue
		}
		for _, warm := range []bool{false, true} {
			name := fmt.Sprintf("N=%d/r=%g/fresh", c.n, c.rate)
			if warm {
				name = fmt.Sprintf("N=%d/r=%g/warm", c.n, c.rate)
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				for _, p := range []float64{0.3, 0.5, 0.9, 1} {
					fc := fleetCell{n: c.n, rate: c.rate, p: p, dur: 30 * time.Second, warm: warm, seed: uint64(c.n) ^ math.Float64bits(c.rate)}
					res := runFleet(fc)
					fc.throttle = true
					thr := runFleet(fc)
					okPct, thrPct, nonePct := res.okPct(), thr.okPct(), 100*float64(res.noRetryOK)/float64(res.calls)
					t.Logf("p=%.1f: after 5 s %.4f× (credit held at 5 s: %.1f), whole %.4f× (%+.2f retries per client beyond 1.10×), ok %.1f%% (no retries %.1f%%; throttle %.3f×, %.1f%%)",
						p, res.ampAfter(), res.carried, res.amp(), (float64(res.attempts)-1.1*float64(res.calls))/float64(c.n), okPct, nonePct, thr.amp(), thrPct)
					// From 5 s on: a tenth of the calls, and the credit the
					// clients held at 5 s (at most MaxCredit each).
					if limit := 1.1*float64(res.callsAfter) + res.carried; float64(res.attemptsAfter) > limit+1e-6 {
						t.Errorf("p=%.1f: after the first 5 s, %d attempts for %d calls: %.4f×, want ≤ 1.10× + the %.1f retries of credit held at 5 s", p, res.attemptsAfter, res.callsAfter, res.ampAfter(), res.carried)
					}
					if limit := 1.1*float64(res.calls) + budget.DefaultBurst*float64(c.n); float64(res.attempts) > limit {
						t.Errorf("p=%.1f: %d attempts for %d calls, want ≤ 1.10× + %d per client = %.0f", p, res.attempts, res.calls, budget.DefaultBurst, limit)
					}
					if okPct < nonePct {
						t.Errorf("p=%.1f: %.2f%% ok, less than no retries' %.2f%%", p, okPct, nonePct)
					}
					if thr.attempts <= res.attempts && okPct < thrPct-0.5 {
						t.Errorf("p=%.1f: dominated by grpc-go's throttle: %d attempts and %.2f%% ok against its %d and %.2f%%", p, res.attempts, okPct, thr.attempts, thrPct)
					}
				}
			})
		}
	}
}
