package fleetsim

import (
	"fmt"
	"testing"
	"time"

	"github.com/stormguard/stormguard/budget"
)

// claimClients is the fleet the claims are checked at: 100,000 clients,
// or 2,000 under the race detector, which makes a run ten times slower,
// and with -short (each client decides alone: the bounds are per client
// all the same; CI runs the claims at 100,000 clients without the race
// detector).
func claimClients() int {
	if raceEnabled || testing.Short() {
		return 2_000
	}
	return 100_000
}

// sized returns a target that serves 2.4 times the calls of n clients at
// rate r: 3 backends of as many 10 ms workers as that takes, 32 queued
// requests per worker.
func sized(n int, r float64) Backends {
	w := max(1, int(2.4*float64(n)*r*0.010/3+0.999))
	return Backends{M: 3, Workers: w, Queue: 32 * w, Service: 10 * time.Millisecond, RTT: time.Millisecond}
}

// claimConfig is a fleet of n clients at rate r, healthy for 10 s (the
// budget's JudgeWindow: a warm fleet), then failing independently at p for
// 15 s.
func claimConfig(n int, r, p float64, client *ClientPolicy, server *ServerPolicy) Config {
	return Config{
		Groups:   []Group{{Clients: n, Rate: r, Jitter: 1}},
		Backends: sized(n, r),
		Failure:  Failure{Mode: Independent, P: p, Start: 10 * time.Second, End: 25 * time.Second},
		Duration: 25 * time.Second, Seed: 7, Client: client, Server: server,
	}
}

// carried sums, at the failure's fifth second, the credit the suite's
// clients hold (in retries): what they may spend from then on beyond a
// tenth of their calls (the budget's guarantee: Ratio × the requests plus
// the credit held when the interval begins).
func carried(cfg *Config, sum *float64) {
	cfg.ProbeAt = cfg.Failure.Start + DefaultSettle
	cfg.Probe = func(clients []Client, now time.Time) {
		for _, c := range clients {
			*sum += max(0, c.(*suiteClient).Credit(now))
		}
	}
}

// TestFleetBoundAtScale: a fleet of 100,000 clients with the suite's
// defaults (each client its own budget and breaker, the servers the
// suite's), warm, then failing for 15 s. Its calls succeed at least as
// often as with no retries, and over the whole failure the attempts it
// sends are at most 1.10× its calls plus the budget's Burst per client
// (the servers' own budgets then bound what reaches the handlers, the
// suite's retries charged as anyone's: TestServerBoundsTheHandler). Once
// the failure's first 5 s are past, at most 1.10× its calls, at a call a
// second, every 2 s and every 10 s per client, with no allowance for the
// credit the clients banked while healthy.
//
// A quiet client's budget would lend for 3 s from its own first failed
// call, which may come 10 s into the failure; it does not start a loan
// once the server, which sees the fleet, says its own budget could not
// pay for the retry (stormguard-budget-dry; see Server.Done). And a client
// that calls every 2 s, whose breaker never sees enough attempts to open,
// would spend its banked credit on retries that dry servers refuse: after
// a dry answer its retry avoids every backend that failed one of its
// attempts in the last 10 s, and is not sent when none is left (the
// engine's step: Outcome.BudgetDry). And a quiet client's retry that
// avoids the backend it failed on only because it has not heard from the
// others is paid for by its budget, not a free fail-over.
func TestFleetBoundAtScale(t *testing.T) {
	n := claimClients()
	for _, r := range []float64{1, 0.5, 0.1} {
		for _, p := range []float64{0.5, 1} {
			if r == 1 && p == 1 {
				continue // the breakers open: r = 0.5 shows it, at half the cost
			}
			t.Run(fmt.Sprintf("N=%d/r=%g/p=%g", n, r, p), func(t *testing.T) {
				t.Parallel()
				var held float64
				cfg := claimConfig(n, r, p, PolicySuite(), PolicySuiteServer())
				carried(&cfg, &held)
				res, err := RunAll([]Config{cfg, claimConfig(n, r, p, PolicyNone(), nil)})
				if err != nil {
					t.Fatal(err)
				}
				s, none := res[0], res[1]
				w, a := s.Window, s.After
				t.Logf("%d clients × %g/s, p = %g: after 5 s %.4f× (%d ÷ %d; credit held at 5 s %.0f; at the handler %.4f×), whole %.4f× (%+.2f retries per client beyond 1.10×; at the handler %.4f×), ok %.2f%% (no retries %.2f%%), wall %v",
					n, r, p, a.Load(), a.Sent, a.Calls, held, a.HandlerLoad(), w.Load(), s.BurstPerClient, w.HandlerLoad(), w.OKPercent(), none.Window.OKPercent(), s.Wall)
				if a.Load() > 1.10+1e-9 {
					t.Errorf("after the first 5 s: %d attempts for %d calls, %.4f×, want ≤ 1.10× (credit held at 5 s: %.0f retries)", a.Sent, a.Calls, a.Load(), held)
				}
				if limit := 1.1*float64(w.Calls) + budget.DefaultBurst*float64(n); float64(w.Sent) > limit {
					t.Errorf("over the failure: %d attempts for %d calls, want ≤ 1.10× + %d per client = %.0f", w.Sent, w.Calls, budget.DefaultBurst, limit)
				}
				if w.OKPercent() < none.Window.OKPercent() {
					t.Errorf("ok %.2f%%, below no retries' %.2f%%", w.OKPercent(), none.Window.OKPercent())
				}
			})
		}
	}
}

// TestServerBoundsTheHandler: behind the suite's server, the attempts
// that reach the handler once the failure's first 5 s are past are at most
// 1.10× the calls, whatever the clients run, as long as their retries say
// they are retries (grpc-previous-rpc-attempts): grpc-go's retryPolicy
// with and without its throttle, SRE's throttle in front of it, and the
// suite's own clients, whose retries the server charges as anyone's (their
// "budgeted" header buys nothing from a server that does not trust them).
// A fleet of 100,000 clients at a call a second, and one at a call every
// 10 s. (What the suite's clients send is bounded by their own budgets,
// which start no loan once the server says it is dry:
// TestFleetBoundAtScale. Clients of other libraries are not told: their
// retries are sent and refused before the handler.)
func TestServerBoundsTheHandler(t *testing.T) {
	n := claimClients()
	for _, r := range []float64{1, 0.1} {
		for _, c := range []*ClientPolicy{PolicyGRPC(), PolicyGRPCThrottled(), PolicySRE(), PolicySuite()} {
			t.Run(fmt.Sprintf("%s/r=%g", c.Key, r), func(t *testing.T) {
				t.Parallel()
				res, err := Run(claimConfig(n, r, 0.5, c, PolicySuiteServer()))
				if err != nil {
					t.Fatal(err)
				}
				a, w := res.After, res.Window
				t.Logf("%s × %g/s behind the suite's server: sent %.4f×, at the handler %.4f× after 5 s (%d ÷ %d), %.4f× over the failure; ok %.2f%%; server refused %d; wall %v",
					c.Name, r, a.Load(), a.HandlerLoad(), a.Handled, a.Calls, w.HandlerLoad(), w.OKPercent(), res.ServerRefused, res.Wall)
				if a.HandlerLoad() > 1.10+1e-9 {
					t.Errorf("%s: %d attempts at the handler for %d calls after the first 5 s, %.4f×, want ≤ 1.10×", c.Name, a.Handled, a.Calls, a.HandlerLoad())
				}
			})
		}
	}
}

// TestRecoveryAfterCapacityDrop: 100,000 clients at a call every 10 s
// against a target that serves 2.4 times that, whose capacity drops to a
// fifth for 30 s: once the drop ends, the suite's defaults (client and
// server) have every 100 ms step at least 90% ok within 1 s.
func TestRecoveryAfterCapacityDrop(t *testing.T) {
	n := claimClients()
	cfg := Config{
		Groups:   []Group{{Clients: n, Rate: 0.1, Jitter: 1}},
		Backends: sized(n, 0.1),
		Failure:  Failure{Mode: CapacityDrop, Factor: 5, Start: 10 * time.Second, End: 40 * time.Second},
		Duration: 60 * time.Second, Seed: 7, Client: PolicySuite(), Server: PolicySuiteServer(),
	}
	r, err := Run(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("ok %.1f%% in the drop, recovery %v, load %.3f×, wall %v", r.Window.OKPercent(), r.Recovery, r.Window.Load(), r.Wall)
	if !r.Ended || r.Recovery < 0 || r.Recovery > time.Second {
		t.Errorf("goodput back %v after the drop's end, want within 1 s", r.Recovery)
	}
}
