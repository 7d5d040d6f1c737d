package interceptor_test

import (
	"context"
	"fmt"
	"hash/fnv"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
	"github.com/stormguard/stormguard/overload"
	"github.com/stormguard/stormguard/semconv"
)

// A hedge is sent when the hedging delay passes on the Client's timers, the
// stalled first attempt is cancelled, and its goroutine is gone when the
// call returns (the bubble, and goleak, check).
func TestHedgeIsSentAfterTheDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		inv := &invoker{script: func(n int) reply { return reply{block: n == 1} }}
		ic := interceptor.NewClient(append(noopProviders(),
			interceptor.WithHedging(10*time.Millisecond, 2), interceptor.WithBudget(nil))...).Unary()
		cc := dialPassthrough(t)
		err := ic(t.Context(), put, &echov1.PutRequest{}, &echov1.PutResponse{}, cc, inv.invoke)
		require.NoError(t, err)
		calls := inv.attempts()
		require.Len(t, calls, 2)
		assert.Equal(t, 10*time.Millisecond, calls[1].at.Sub(calls[0].at), "hedge after exactly the delay")
		assert.Equal(t, []string{"1"}, calls[1].md.Get(semconv.PreviousAttemptsKey))
		assert.ErrorIs(t, calls[0].ctx.Err(), context.Canceled, "the loser was cancelled")
	})
}

// firstAttemptStalls makes the first attempt of every request (the one
// without grpc-previous-rpc-attempts) hang until its caller gives up, and
// later attempts answer at once; every attempt says which one it is in a
// header and a trailer.
func firstAttemptStalls(c origin.Call) origin.Reply {
	prev := c.Metadata.Get(semconv.PreviousAttemptsKey)
	n := "0"
	if len(prev) == 1 {
		n = prev[0]
	}
	r := origin.Reply{Header: metadata.Pairs("attempt", n), Trailer: metadata.Pairs("attempt", n)}
	if n == "0" {
		r.Delay = time.Hour
	}
	return r
}

func TestHedgeWinsAndFillsCallOptionsFromTheWinner(t *testing.T) {
	e := newEnv(t, firstAttemptStalls, interceptor.WithHedging(5*time.Millisecond, 2))
	var hdr, tr metadata.MD
	resp, err := e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: "h"}, grpc.Header(&hdr), grpc.Trailer(&tr))
	require.NoError(t, err)
	assert.Equal(t, "h", resp.GetRequestId())
	assert.Equal(t, []string{"1"}, hdr.Get("attempt"), "the hedge's header")
	assert.Equal(t, []string{"1"}, tr.Get("attempt"), "the hedge's trailer")
	// The stalled first attempt may have been cancelled before it reached
	// the origin (on a loaded machine it can be slower than the hedge).
	assert.Contains(t, []int{1, 2}, e.origin.CountID(put, "h"))
}

// Get has an adaptive hedging policy in the proto: warmed up with fast
// calls, it hedges a call whose first attempt hangs, and the hedge's reply
// is the call's.
func TestHedgeReplyIsTheWinnersMessage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var attempts atomic.Int64
		invoke := func(ctx context.Context, _ string, req, reply any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
			attempts.Add(1)
			md, _ := metadata.FromOutgoingContext(ctx)
			hedge := len(md.Get(semconv.PreviousAttemptsKey)) > 0
			d := time.Millisecond
			if req.(*echov1.GetRequest).GetRequestId() == "slow" && !hedge {
				d = time.Hour
			}
			timer := time.NewTimer(d)
			defer timer.Stop()
			select {
			case <-timer.C:
				reply.(*echov1.GetResponse).Value = []byte(fmt.Sprintf("hedge=%v", hedge))
				return nil
			case <-ctx.Done():
				return status.FromContextError(ctx.Err()).Err()
			}
		}
		ic := interceptor.NewClient(append(noopProviders(), interceptor.WithBudget(nil))...).Unary()
		cc := dialPassthrough(t)
		for i := range 40 {
			resp := &echov1.GetResponse{}
			require.NoError(t, ic(t.Context(), get, &echov1.GetRequest{RequestId: fmt.Sprint(i)}, resp, cc, invoke))
			assert.Equal(t, "hedge=false", string(resp.GetValue()), "call %d: a fast call is not hedged", i)
		}
		require.EqualValues(t, 40, attempts.Load(), "no fast call was hedged")
		resp := &echov1.GetResponse{}
		require.NoError(t, ic(t.Context(), get, &echov1.GetRequest{RequestId: "slow"}, resp, cc, invoke))
		assert.Equal(t, "hedge=true", string(resp.GetValue()))
		assert.EqualValues(t, 42, attempts.Load(), "the first attempt and one hedge")
	})
}

func TestHedgingStopsWhenTheCallerCancels(t *testing.T) {
	e := newEnv(t, origin.Sleep(time.Hour), interceptor.WithHedging(time.Millisecond, 3), interceptor.WithBudget(nil))
	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		for e.origin.Total() < 3 {
			time.Sleep(time.Millisecond)
		}
		cancel()
	}()
	_, err := e.echo.Put(ctx, &echov1.PutRequest{RequestId: "c"})
	assert.Equal(t, codes.Canceled, status.Code(err))
	assert.Equal(t, 3, e.origin.Total())
	// goleak in TestMain checks that no attempt goroutine outlived the call.
}

// A hedge the budget cannot pay for is not sent: the first attempt runs on
// to the deadline alone. In a synctest bubble, so that the first attempt
// reaches the origin before the deadline however busy the machine is (on
// real time, a 50 ms deadline on a loaded machine could pass first).
func TestHedgeRefusedByBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, firstAttemptStalls, interceptor.WithHedging(time.Millisecond, 2),
			interceptor.WithBudget(budget.NewRegistry(budgetNoBurst())))
		ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
		defer cancel()
		_, err := e.echo.Put(ctx, &echov1.PutRequest{RequestId: "b"})
		assert.Equal(t, codes.DeadlineExceeded, status.Code(err))
		assert.Equal(t, 1, e.origin.Total(), "no token, no hedge")
	})
}

// A long tail: 5% of first attempts take 300 ms, the rest 1 ms. Adaptive
// hedging learns the latency of the route during a warm-up, then sends a
// hedge after about its 92.5th percentile, here three times its median: every
// slow call is rescued by its hedge (about 4 ms instead of 300), no fast
// call is hedged, and the load is 1.05x. Deterministic: the attempts take
// their time on the bubble's clock.
func TestAdaptiveHedgingCutsTheTail(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const warmup, calls = 40, 400
		var attempts atomic.Int64
		invoke := func(ctx context.Context, _ string, req, _ any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
			attempts.Add(1)
			id := req.(*echov1.PutRequest).GetRequestId()
			d := time.Millisecond
			if md, _ := metadata.FromOutgoingContext(ctx); len(md.Get(semconv.PreviousAttemptsKey)) == 0 && strings.HasSuffix(id, "slow") {
				d = 300 * time.Millisecond
			}
			timer := time.NewTimer(d)
			defer timer.Stop()
			select {
			case <-timer.C:
				return nil
			case <-ctx.Done():
				return status.FromContextError(ctx.Err()).Err()
			}
		}
		ic := interceptor.NewClient(append(noopProviders(), interceptor.WithHedging(0, 2), interceptor.WithBudget(nil))...).Unary()
		cc := dialPassthrough(t)
		var slowLatencies []time.Duration
		slow := 0
		for i := range warmup + calls {
			id := fmt.Sprint(i)
			if i >= warmup && i%20 == 0 {
				id += "-slow"
				slow++
			}
			start := time.Now()
			require.NoError(t, ic(t.Context(), put, &echov1.PutRequest{RequestId: id}, &echov1.PutResponse{}, cc, invoke))
			if strings.HasSuffix(id, "slow") {
				slowLatencies = append(slowLatencies, time.Since(start))
			}
		}
		require.Len(t, slowLatencies, slow)
		for _, l := range slowLatencies {
			assert.Less(t, l, 5*time.Millisecond, "a slow call was rescued by its hedge")
		}
		load := float64(attempts.Load()) / (warmup + calls)
		t.Logf("%d slow calls of %d, each done in %v; load %.3fx", slow, calls, slowLatencies[0], load)
		assert.EqualValues(t, warmup+calls+slow, attempts.Load(), "exactly one hedge per slow call, none for the fast ones")
		assert.LessOrEqual(t, load, 1.10)
	})
}

// A fresh client whose first calls are all slow hedges them on the loan of
// its budget, but only on half of it: the failure that comes next is still
// retried. Before hedges borrowed half the loan, the hedges of a client's
// first slow calls spent all of it and stopped the budget lending, and the
// failure after them went without its retry.
func TestHedgesLeaveTheLoanToRetries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		attempts := map[string]int{}
		invoke := func(ctx context.Context, _ string, req, _ any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
			id := req.(*echov1.PutRequest).GetRequestId()
			mu.Lock()
			attempts[id]++
			n := attempts[id]
			mu.Unlock()
			switch {
			case n > 1:
				return nil
			case id == "fails-once":
				return status.Error(codes.Unavailable, "a blip")
			}
			timer := time.NewTimer(50 * time.Millisecond) // slow: hedged after 10 ms
			defer timer.Stop()
			select {
			case <-timer.C:
				return nil
			case <-ctx.Done():
				return status.FromContextError(ctx.Err()).Err()
			}
		}
		c := interceptor.NewClient(append(noopProviders(), interceptor.WithHedging(10*time.Millisecond, 2))...)
		ic := c.Unary()
		cc := dialPassthrough(t)
		const slow = 8
		for i := range slow {
			require.NoError(t, ic(t.Context(), put, &echov1.PutRequest{RequestId: fmt.Sprint("slow-", i)}, &echov1.PutResponse{}, cc, invoke))
		}
		hedges := 0
		for i := range slow {
			hedges += attempts[fmt.Sprint("slow-", i)] - 1
		}
		// Burst 5: hedges may be lent while at most 2.5 is owed.
		t.Logf("%d of %d slow calls hedged", hedges, slow)
		assert.Positive(t, hedges, "a fresh client hedges its first slow calls")
		assert.LessOrEqual(t, hedges, 3, "hedges borrow at most half the loan")
		err := ic(t.Context(), put, &echov1.PutRequest{RequestId: "fails-once"}, &echov1.PutResponse{}, cc, invoke)
		require.NoError(t, err, "the failure after the hedges is retried on the rest of the loan")
		assert.Equal(t, 2, attempts["fails-once"])
	})
}

// draw returns a uniform number in [0, 1) for attempt n of call id, the
// same in every run.
func draw(id string, n int) float64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s/%d/draw", id, n)
	return float64(h.Sum64()%1_000_000) / 1e6
}

// TestAdaptiveHedgingCutsALongTailCheaply: 5,000 Gets (adaptive hedging
// in the demo proto) from 10 callers through gRPC on bufconn, on the
// bubble's clock; 1% of attempts take 100 ms, the others 1 ms plus the
// jitter of a network (exponential, mean 100 µs). Hedging cuts the
// p99.9 at least tenfold (the long tail of "The Tail at Scale": 24× for
// 2% more requests) for at most 2% more attempts at the origin.
func TestAdaptiveHedgingCutsALongTailCheaply(t *testing.T) {
	type result struct {
		p999  time.Duration
		extra float64
	}
	run := func(opts ...grpc.CallOption) (r result) {
		synctest.Test(t, func(t *testing.T) {
			e := newEnv(t, func(c origin.Call) origin.Reply {
				if draw(c.RequestID, c.Attempt) < 0.01 {
					return origin.Reply{Delay: 100 * time.Millisecond}
				}
				jitter := -math.Log(1-draw(c.RequestID+"j", c.Attempt)) * float64(100*time.Microsecond)
				return origin.Reply{Delay: time.Millisecond + time.Duration(jitter)}
			})
			const calls, callers = 5000, 10
			lat := make([]time.Duration, calls)
			var wg sync.WaitGroup
			for w := range callers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := w; i < calls; i += callers {
						start := time.Now()
						_, err := e.echo.Get(t.Context(), &echov1.GetRequest{RequestId: fmt.Sprint(i), Key: "k"}, opts...)
						assert.NoError(t, err)
						lat[i] = time.Since(start)
					}
				}()
			}
			wg.Wait()
			slices.Sort(lat)
			r = result{p999: lat[calls*999/1000], extra: float64(e.origin.Total())/calls - 1}
		})
		return r
	}
	without := run(interceptor.NoHedging())
	with := run()
	t.Logf("p99.9: %v without hedging, %v with it (%.1f× less), for %.2f%% more attempts",
		without.p999, with.p999, float64(without.p999)/float64(with.p999), 100*with.extra)
	assert.GreaterOrEqual(t, float64(without.p999), 10*float64(with.p999), "p99.9 cut less than tenfold")
	assert.LessOrEqual(t, with.extra, 0.02, "more than 2%% more attempts")
}

// TestAHedgeLoserCostsTheServerNothingOnceItSeesTheCancel: a Put hedged
// after 5 ms through the suite's client and server on bufconn; the first attempt's
// handler works until its context ends, the hedge answers after 1 ms. The
// winner's answer cancels the loser, whose handler sees it at that
// instant and stops: nothing is left in flight at the server, which
// refused nothing.
func TestAHedgeLoserCostsTheServerNothingOnceItSeesTheCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var stopped time.Time // when the loser's handler saw its context end
		var mu sync.Mutex
		o := origin.New(func(c origin.Call) origin.Reply {
			return origin.Reply{Delay: time.Millisecond}
		})
		loser := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			if md, _ := metadata.FromIncomingContext(ctx); len(md.Get(semconv.PreviousAttemptsKey)) == 0 {
				<-ctx.Done() // works until its caller leaves
				mu.Lock()
				stopped = time.Now()
				mu.Unlock()
				return nil, status.FromContextError(ctx.Err()).Err()
			}
			return handler(ctx, req)
		}
		s := interceptor.NewServer()
		l := origin.Bufconn()
		srv := origin.Serve(l, o, grpc.ChainUnaryInterceptor(s.Unary(), loser))
		client := interceptor.NewClient(append(noopProviders(), interceptor.WithHedging(5*time.Millisecond, 2))...)
		cc, err := l.Dial(grpc.WithChainUnaryInterceptor(client.Unary()))
		require.NoError(t, err)
		defer func() { cc.Close(); srv.Stop() }()
		start := time.Now()
		_, err = echov1.NewEchoServiceClient(cc).Put(t.Context(), &echov1.PutRequest{RequestId: "h"})
		require.NoError(t, err)
		answered := time.Now()
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		assert.Equal(t, 6*time.Millisecond, answered.Sub(start), "the hedge (sent after 5 ms, 1 ms of work) won")
		assert.Equal(t, answered, stopped, "the loser's handler stopped when the winner answered")
		m := interceptor.OverloadOf(s).Method(put)
		assert.Zero(t, m.Inflight(), "the loser still holds a place")
		st := interceptor.OverloadOf(s).Stats()
		assert.Equal(t, overload.Stats{Admitted: 2}, st, "the server refused nothing")
	})
}
