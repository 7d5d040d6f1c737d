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

	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/deadline"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// Issue 14's rule: protection must never cost availability that no retries
// at all would have had. These tests measure the defaults against no
// retries on partial failures.

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

// A target that serves nothing gets no retries once three attempts in a
// row have failed: a dead dependency's first callers are not retried
// (before the breaker has the twenty failures it opens on), so that the hop
// next to it refuses and says so to the hops above.
func TestServedNothingStopsRetries(t *testing.T) {
	e := newEnv(t, origin.Always(codes.Unavailable), interceptor.WithBudget(nil))
	var err error
	for i := range 3 {
		_, err = e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: fmt.Sprint(i)})
	}
	assert.Equal(t, 3, e.origin.CountID(put, "0"), "three failures: the third attempt is the evidence")
	assert.Equal(t, 1, e.origin.CountID(put, "1"))
	assert.Equal(t, 1, e.origin.CountID(put, "2"))
	assert.Equal(t, interceptor.ReasonBreaker, interceptor.RefusedBy(err))
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

// A target that dies after serving well: its endpoints' window forgets the
// successes within 4 s, and from then on its callers get no retries, though
// the breaker (whose window is 10 s) is still closed.
func TestServedNothingAfterHealthyTraffic(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var down atomic.Bool
		e := newEnv(t, func(origin.Call) origin.Reply {
			if down.Load() {
				return origin.Reply{Code: codes.Unavailable}
			}
			return origin.Reply{}
		}, interceptor.WithBudget(nil))
		for i := range 20 {
			_, err := e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: fmt.Sprint("ok", i)})
			require.NoError(t, err)
		}
		down.Store(true)
		// Still served lately: the failed call is retried.
		_, err := e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: "early"})
		require.Error(t, err)
		assert.Equal(t, 3, e.origin.CountID(put, "early"))
		time.Sleep(5 * time.Second)
		for i := range 3 {
			_, _ = e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: fmt.Sprint("down", i)}, interceptor.MaxAttempts(1))
		}
		_, err = e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: "late"})
		assert.Equal(t, interceptor.ReasonBreaker, interceptor.RefusedBy(err))
		assert.Equal(t, 1, e.origin.CountID(put, "late"), "served nothing lately: no retry")
		assert.Equal(t, "closed", e.guard.Targets()[0].Breakers[0].State)
	})
}

// Short deadlines: a call with 1 to 6 ms left, to a handler that answers
// at once, succeeds through the suite's client and server at least as
// often as through plain grpc-go, with the default margin and with none.
// The margin the client takes off the header never takes more than a share
// of what is left, and the header's whole milliseconds never turn time
// left into "expired" (the old client refused every one of these calls:
// with its 5 ms margin a call needed about 7 ms left, with none 2 ms).
//
// The two kinds of call alternate, so that both see the same load, and a
// stall of the machine fails a few calls of either kind in a row: a round
// whose figures differ by more than a tenth of a row's calls is run again,
// up to three rounds in all, and the test judges the last.
func TestShortDeadlinesDoNoHarm(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  deadline.ClientConfig
	}{
		{"default margin", deadline.ClientConfig{}},
		{"no margin", deadline.ClientConfig{Margin: -1}},
	} {
		t.Run(tc.name, func(t *testing.T) { shortDeadlines(t, tc.cfg) })
	}
}

func shortDeadlines(t *testing.T, cfg deadline.ClientConfig) {
	o := origin.New(nil)
	lp := origin.Bufconn()
	defer origin.Serve(lp, o).Stop()
	plainCC, err := lp.Dial()
	require.NoError(t, err)
	defer plainCC.Close()
	srv := interceptor.NewServer(interceptor.WithDedupe(nil))
	ls := origin.Bufconn()
	defer origin.Serve(ls, o, grpc.ChainUnaryInterceptor(srv.Unary()), grpc.ChainStreamInterceptor(srv.Stream())).Stop()
	guard := interceptor.NewClient(append(noopProviders(), interceptor.WithDeadline(cfg))...)
	suiteCC, err := ls.Dial(guard.DialOptions()...)
	require.NoError(t, err)
	defer suiteCC.Close()
	plain, suite := echov1.NewEchoServiceClient(plainCC), echov1.NewEchoServiceClient(suiteCC)
	for _, c := range []echov1.EchoServiceClient{plain, suite} { // connect
		_, err := c.Notify(t.Context(), &echov1.NotifyRequest{RequestId: "warm"})
		require.NoError(t, err)
	}
	call := func(c echov1.EchoServiceClient, left time.Duration, id string) bool {
		ctx, cancel := context.WithTimeout(t.Context(), left)
		defer cancel()
		_, err := c.Notify(ctx, &echov1.NotifyRequest{RequestId: id})
		return err == nil
	}
	const n = 30 // calls of each kind per row
	var okPlain, okSuite int
	for round := 1; round <= 3; round++ {
		okPlain, okSuite = 0, 0
		for ms := 1; ms <= 6; ms++ {
			left := time.Duration(ms) * time.Millisecond
			var p, s int
			for i := range n {
				if call(plain, left, fmt.Sprint("plain-", round, "-", ms, "-", i)) {
					p++
				}
				if call(suite, left, fmt.Sprint("suite-", round, "-", ms, "-", i)) {
					s++
				}
			}
			t.Logf("round %d, %d ms left: plain grpc-go %d/%d ok, the suite %d/%d", round, ms, p, n, s, n)
			okPlain += p
			okSuite += s
		}
		if okSuite >= okPlain-n/10 {
			break
		}
	}
	assert.GreaterOrEqual(t, okSuite, okPlain-n/10, "the suite completes what plain grpc-go completes (within %d calls of %d)", n/10, 6*n)
}
