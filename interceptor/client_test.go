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

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// These tests judge the Client's defaults (NewClient) on storms and on
// partial failures: a dead origin, a flaky one, a second wave, recovery
// after an outage, independent failures from a fresh and a warm client,
// and fleets of quiet clients. Protection must never cost availability
// that no retries at all would have had.

// A dead origin, one hop: 50 concurrent callers, the origin answers
// UNAVAILABLE to everything. With the defaults it sees at most 1.05x the
// calls; with a naive three attempts and no budget, 3x. The callers are
// one wave (inStep): on a loaded machine, the first failures could
// otherwise come back, and open the breaker, before the last callers
// have sent their first attempts (31 of 50 reached the origin so, with
// two CPU-bound processes beside the test).
func TestDeadOriginOneHop(t *testing.T) {
	for _, tt := range []struct {
		name string
		opts []interceptor.ClientOption
		max  int
		min  int
	}{
		{"defaults", nil, 52, 50}, // at most 1.05x
		{"naive 3 attempts", naive, 150, 150},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, inStep(50, origin.Always(codes.Unavailable)), tt.opts...)
			ok, _ := concurrently(50, func(i int) error {
				_, err := e.echo.Get(t.Context(), &echov1.GetRequest{RequestId: fmt.Sprint(i)}, interceptor.NoHedging())
				return err
			})
			assert.Equal(t, 0, ok)
			seen := e.origin.Total()
			t.Logf("%s: origin saw %d requests for 50 calls (%.2fx)", tt.name, seen, float64(seen)/50)
			assert.LessOrEqual(t, seen, tt.max)
			assert.GreaterOrEqual(t, seen, tt.min)
		})
	}
}

// inStep holds every first attempt until n first attempts have arrived
// (or 5 s have passed), so that a wave of n concurrent callers is one
// wave: every caller has deposited into the budget before any failure
// comes back, whatever the scheduler does.
func inStep(n int, script origin.Script) origin.Script {
	var mu sync.Mutex
	arrived := 0
	all := make(chan struct{})
	return func(c origin.Call) origin.Reply {
		if c.Attempt == 1 {
			mu.Lock()
			if arrived++; arrived == n {
				close(all)
			}
			mu.Unlock()
			select {
			case <-all:
			case <-time.After(5 * time.Second):
			}
		}
		return script(c)
	}
}

// A flaky origin: of 50 concurrent callers, 5 fail once. Every call
// succeeds, at no more than one retry per failure: the budget is
// invisible.
//
// It runs in a bubble: on real time, on a loaded machine, the client may
// not have read the 45 successes the origin has already sent when the
// failed calls' retries are due, and the target then looks as if it served
// nothing (3 failures, no success), which refuses them.
func TestFlakyOriginEveryCallSucceeds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, inStep(50, func(c origin.Call) origin.Reply {
			var n int
			fmt.Sscan(c.RequestID, &n)
			if n < 5 && c.Attempt == 1 {
				return origin.Reply{Code: codes.Unavailable}
			}
			return origin.Reply{}
		}))
		ok, _ := concurrently(50, func(i int) error {
			_, err := e.echo.Get(t.Context(), &echov1.GetRequest{RequestId: fmt.Sprint(i)}, interceptor.NoHedging())
			return err
		})
		assert.Equal(t, 50, ok)
		assert.LessOrEqual(t, e.origin.Total(), 55)
	})
}

// Once the breaker has opened on a wave of 50 callers of a dead origin, a
// second wave never reaches the origin.
func TestSecondWaveAfterTheBreakerOpened(t *testing.T) {
	e := newEnv(t, origin.Always(codes.Unavailable))
	call := func(i int) error {
		_, err := e.echo.Get(t.Context(), &echov1.GetRequest{RequestId: fmt.Sprint(i)}, interceptor.NoHedging())
		return err
	}
	concurrently(50, call)
	first := e.origin.Total()
	_, seen := concurrently(50, func(i int) error { return call(100 + i) })
	assert.Equal(t, first, e.origin.Total(), "the second wave sent nothing")
	assert.Equal(t, 50, seen[codes.Unavailable])
}

// After an outage, the breaker's probe finds the target healed 1 s after
// it opened (plus at most 20% jitter; the old defaults: 5 s, growing to
// 40 s), and calls go through again: protection does not outlast its cause.
func TestRecoveryAfterAnOutage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var down atomic.Bool
		down.Store(true)
		e := newEnv(t, func(origin.Call) origin.Reply {
			if down.Load() {
				return origin.Reply{Code: codes.Unavailable}
			}
			return origin.Reply{}
		})
		for i := range 25 {
			_, _ = e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: fmt.Sprint(i)}, interceptor.MaxAttempts(1))
		}
		down.Store(false)
		before := e.origin.Total()
		_, err := e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: "healed"})
		assert.Equal(t, interceptor.ReasonBreaker, interceptor.RefusedBy(err), "open: the healed target is not known yet")
		assert.Equal(t, before, e.origin.Total())
		time.Sleep(1200 * time.Millisecond)
		_, err = e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: "probe"})
		require.NoError(t, err, "1.2 s later the probe goes through")
		_, err = e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: "next"})
		require.NoError(t, err, "and the breaker is closed")
	})
}

// failDraw fails an attempt with probability p, by a hash of its request id
// and attempt number: the first attempts of every row draw the same.
func failDraw(p float64) origin.Script {
	return func(c origin.Call) origin.Reply {
		h := fnv.New64a()
		fmt.Fprintf(h, "%s/%d", c.RequestID, c.Attempt)
		if float64(h.Sum64()%1_000_000) < p*1_000_000 {
			return origin.Reply{Code: codes.Unavailable, Message: "drawn to fail"}
		}
		return origin.Reply{}
	}
}

// run makes calls Puts from workers goroutines through a fresh client (opts
// nil: no retries) of a fresh origin, and returns the calls that succeeded
// and the requests the origin saw.
func run(t *testing.T, script origin.Script, calls, workers int, opts []interceptor.ClientOption) (ok, requests int) {
	t.Helper()
	o := origin.New(script)
	l := origin.Bufconn()
	srv := origin.Serve(l, o)
	defer srv.Stop()
	var dial = l.Dial
	if opts != nil {
		guard := interceptor.NewClient(append(noopProviders(), opts...)...)
		cc, err := dial(guard.DialOptions()...)
		require.NoError(t, err)
		defer cc.Close()
		return workload(t, echov1.NewEchoServiceClient(cc), calls, workers), o.Total()
	}
	cc, err := dial()
	require.NoError(t, err)
	defer cc.Close()
	return workload(t, echov1.NewEchoServiceClient(cc), calls, workers), o.Total()
}

// Independent failures at p = 0.05, 0.3 and 0.5 from a fresh client with 8
// concurrent workers: at least as many calls succeed as with no retries (the
// old breaker opened at 50% failures: 0.5% ok at p = 0.5), and the load
// stays within the budget (the ratio's 10%, plus its credit of one retry
// and its start-up burst).
func TestIndependentFailuresDoNoHarm(t *testing.T) {
	const calls, workers = 2000, 8
	for _, p := range []float64{0.05, 0.3, 0.5} {
		t.Run(fmt.Sprint(p), func(t *testing.T) {
			okBare, _ := run(t, failDraw(p), calls, workers, nil)
			ok, requests := run(t, failDraw(p), calls, workers, []interceptor.ClientOption{})
			load := float64(requests) / calls
			t.Logf("p=%g: no retries %d ok; defaults %d ok at %.3fx", p, okBare, ok, load)
			assert.GreaterOrEqual(t, ok, okBare)
			assert.LessOrEqual(t, float64(requests), 1.10*calls+1+budget.DefaultBurst)
		})
	}
}

// The same from a warm client: 2,000 calls to a healthy target first (the
// breaker's window full of successes, the budget's credit full), then the
// failures. Success stays at least that of no retries, and the failure
// phase's load within the same bound as a fresh client's: healthy calls
// bank one retry at most, and what the budget lends at the failure's onset
// (up to a tenth of the last second's calls) is repaid by the calls that
// follow.
func TestIndependentFailuresDoNoHarmWarm(t *testing.T) {
	const calls, workers = 2000, 8
	for _, p := range []float64{0.05, 0.3, 0.5} {
		t.Run(fmt.Sprint(p), func(t *testing.T) {
			okBare, _ := run(t, failDraw(p), calls, workers, nil)
			var failing atomic.Bool
			draw := failDraw(p)
			o := origin.New(func(c origin.Call) origin.Reply {
				if !failing.Load() {
					return origin.Reply{}
				}
				return draw(c)
			})
			l := origin.Bufconn()
			srv := origin.Serve(l, o)
			defer srv.Stop()
			guard := interceptor.NewClient(noopProviders()...)
			cc, err := l.Dial(guard.DialOptions()...)
			require.NoError(t, err)
			defer cc.Close()
			echo := echov1.NewEchoServiceClient(cc)
			warmUp(t, echo, calls, workers)
			failing.Store(true)
			before := o.Total()
			ok := workload(t, echo, calls, workers)
			requests := o.Total() - before
			owed := -min(guard.Targets()[0].Budget.Credit, 0)
			t.Logf("p=%g: no retries %d ok; warm defaults %d ok at %.3fx (owed %.1f retries at the end)",
				p, okBare, ok, float64(requests)/calls, owed)
			assert.GreaterOrEqual(t, ok, okBare)
			assert.LessOrEqual(t, float64(requests), 1.10*calls+1+budget.DefaultBurst)
		})
	}
}

// warmUp makes calls healthy Puts from workers goroutines.
func warmUp(t *testing.T, c echov1.EchoServiceClient, calls, workers int) {
	t.Helper()
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= calls {
					return
				}
				_, err := c.Put(t.Context(), &echov1.PutRequest{RequestId: fmt.Sprint("warm-", i)})
				assert.NoError(t, err)
			}
		})
	}
	wg.Wait()
}

// A fresh client whose first callers fail once at 10%, one by one or all
// at once, rescues every one of them: the budget lends its start-up burst,
// and then a tenth of the calls of the last second.
func TestFreshClientFirstFailuresAreRescued(t *testing.T) {
	failOnce := func(every int) origin.Script {
		return func(c origin.Call) origin.Reply {
			var n int
			fmt.Sscan(c.RequestID, &n)
			if n%every == 0 && c.Attempt == 1 {
				return origin.Reply{Code: codes.Unavailable, Message: "first attempt fails"}
			}
			return origin.Reply{}
		}
	}
	t.Run("one by one", func(t *testing.T) {
		ok, requests := run(t, failOnce(10), 50, 1, []interceptor.ClientOption{})
		assert.Equal(t, 50, ok)
		assert.Equal(t, 55, requests)
	})
	t.Run("all at once", func(t *testing.T) {
		ok, requests := run(t, failOnce(10), 100, 100, []interceptor.ClientOption{})
		assert.Equal(t, 100, ok)
		assert.Equal(t, 110, requests)
	})
}

// A fleet: many quiet clients, each with its own Client (so its own budget
// and breaker), calling one dependency whose attempts fail independently.
// The budget must bound the fleet as it bounds one busy client: from 5 s
// into the failure on, the fleet's attempts are at most 1.10× its calls
// (plus the credit its clients hold at 5 s: at most two retries each,
// which the tests allow as one per client); over the whole failure,
// 1.10× plus the start-up burst of 5 retries per client.

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
