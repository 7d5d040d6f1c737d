package interceptor_test

import (
	"context"
	"fmt"
	"hash/fnv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// A fleet: many quiet clients, each with its own Client (so its own budget
// and breaker), calling one dependency whose attempts fail independently.
// The budget must bound the fleet as it bounds one busy client: from 5 s
// into the failure on, the fleet's attempts are at most 1.10× its calls
// (plus the credit its clients hold at 5 s: at most two retries each,
// which the tests allow as one per client); over the whole failure,
// 1.10× plus the start-up burst of 5 retries per client.

// drawFails decides, the same way in every run, whether attempt n of call
// id fails with probability p.
func drawFails(id string, n int, p float64) bool {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s/%d", id, n)
	return float64(h.Sum64()%1_000_000)/1e6 < p
}

// fleetTally counts a fleet's calls and attempts, in total and from 5 s on.
type fleetTally struct {
	calls, attempts, ok, firstOK atomic.Int64
	callsAfter, attemptsAfter    atomic.Int64
}

func (f *fleetTally) String() string {
	return fmt.Sprintf("%d calls, %d attempts (%.3f×), from 5 s on %d calls, %d attempts (%.3f×), ok %d (no retries %d)",
		f.calls.Load(), f.attempts.Load(), float64(f.attempts.Load())/float64(f.calls.Load()),
		f.callsAfter.Load(), f.attemptsAfter.Load(), float64(f.attemptsAfter.Load())/float64(f.callsAfter.Load()),
		f.ok.Load(), f.firstOK.Load())
}

// runFleetOfClients runs n Clients made by newClient, each at rate calls a
// second (open loop, each client with its own phase) for dur, through a
// scripted invoker whose attempts fail with probability p. It runs in a
// synctest bubble: the Clients' clocks and timers are the bubble's.
func runFleetOfClients(t *testing.T, n int, rate, p float64, dur time.Duration, newClient func() *interceptor.Client) *fleetTally {
	t.Helper()
	var f fleetTally
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		period := time.Duration(float64(time.Second) / rate)
		var wg sync.WaitGroup
		for c := range n {
			guard := newClient()
			unary := guard.Unary()
			wg.Go(func() {
				defer guard.Close()
				time.Sleep(time.Duration(c) * period / time.Duration(n)) // phase
				var calls sync.WaitGroup
				for i := 0; time.Since(start) < dur; i++ {
					id := fmt.Sprint(c, "-", i)
					after := time.Since(start) >= 5*time.Second
					calls.Go(func() {
						attempts := 0
						inv := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, opts ...grpc.CallOption) error {
							attempts++
							if drawFails(id, attempts, p) {
								return status.Error(codes.Unavailable, "fails")
							}
							if attempts == 1 {
								f.firstOK.Add(1)
							}
							return nil
						}
						err := unary(context.Background(), put, &echov1.PutRequest{RequestId: id}, &echov1.PutResponse{}, nil, inv)
						f.calls.Add(1)
						f.attempts.Add(int64(attempts))
						if after {
							f.callsAfter.Add(1)
							f.attemptsAfter.Add(int64(attempts))
						}
						if err == nil {
							f.ok.Add(1)
						}
					})
					time.Sleep(period)
				}
				calls.Wait()
			})
		}
		wg.Wait()
	})
	return &f
}

// TestFleetOfClientsIsBounded: fleets of Clients with the defaults, at a
// few of the budget's grid points (the budget package's TestFleetBound
// runs the whole grid on the Budget alone).
func TestFleetOfClientsIsBounded(t *testing.T) {
	type cell struct {
		n    int
		rate float64
	}
	cells := []cell{{200, 5}, {20, 50}, {500, 1}}
	if raceEnabled {
		cells = []cell{{50, 5}, {5, 50}}
	}
	for _, c := range cells {
		for _, p := range []float64{0.3, 0.5, 0.9} {
			t.Run(fmt.Sprintf("N=%d/r=%g/p=%g", c.n, c.rate, p), func(t *testing.T) {
				f := runFleetOfClients(t, c.n, c.rate, p, 30*time.Second, func() *interceptor.Client {
					return interceptor.NewClient(noopProviders()...)
				})
				t.Log(f)
				after, whole := float64(f.attemptsAfter.Load()), float64(f.attempts.Load())
				if limit := 1.10*float64(f.callsAfter.Load()) + float64(c.n); after > limit {
					t.Errorf("from 5 s on: %v attempts, want ≤ 1.10× the calls + 1 per client = %v", after, limit)
				}
				if limit := 1.10*float64(f.calls.Load()) + 5*float64(c.n); whole > limit {
					t.Errorf("over 30 s: %v attempts, want ≤ 1.10× the calls + 5 per client = %v", whole, limit)
				}
				if f.ok.Load() < f.firstOK.Load() {
					t.Errorf("%d ok, fewer than no retries' %d", f.ok.Load(), f.firstOK.Load())
				}
			})
		}
	}
}

// TestFleetOfHedgingClientsIsBounded: hedges are paid from the same budget,
// so a fleet of hedging clients whose attempts are all slower than the
// hedging delay sends at most 1.10× its calls (plus the start-up burst and
// the credit of each client) too. (Put has no hedging policy in the demo
// proto, so WithHedging's fixed delay applies.)
func TestFleetOfHedgingClientsIsBounded(t *testing.T) {
	const n, rate = 100, 5
	var calls, attempts atomic.Int64
	synctest.Test(t, func(t *testing.T) {
		slow := origin.Script(func(origin.Call) origin.Reply { return origin.Reply{Delay: 200 * time.Millisecond} })
		o := origin.New(slow)
		l := origin.Bufconn()
		srv := origin.Serve(l, o)
		defer srv.Stop()
		start := time.Now()
		var wg sync.WaitGroup
		for c := range n {
			guard := interceptor.NewClient(append(noopProviders(), interceptor.WithHedging(20*time.Millisecond, 3))...)
			cc, err := l.Dial(guard.DialOptions()...)
			if err != nil {
				t.Fatal(err)
			}
			echo := echov1.NewEchoServiceClient(cc)
			wg.Go(func() {
				defer cc.Close()
				defer guard.Close()
				time.Sleep(time.Duration(c) * time.Second / rate / n)
				var inflight sync.WaitGroup
				for i := 0; time.Since(start) < 10*time.Second; i++ {
					inflight.Go(func() {
						_, _ = echo.Put(context.Background(), &echov1.PutRequest{RequestId: fmt.Sprint(c, "-", i)})
						calls.Add(1)
					})
					time.Sleep(time.Second / rate)
				}
				inflight.Wait()
			})
		}
		wg.Wait()
		attempts.Store(int64(o.Total()))
	})
	t.Logf("%d calls, %d attempts (%.3f×)", calls.Load(), attempts.Load(), float64(attempts.Load())/float64(calls.Load()))
	if limit := 1.10*float64(calls.Load()) + 5*n + 2*n; float64(attempts.Load()) > limit {
		t.Errorf("%d attempts for %d calls: want ≤ 1.10× + the burst and credit of each client = %v", attempts.Load(), calls.Load(), limit)
	}
}
