package interceptor_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// concurrently runs n calls of f at once and returns how many succeeded.
func concurrently(n int, f func(i int) error) (ok int, codesSeen map[codes.Code]int) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	codesSeen = map[codes.Code]int{}
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			err := f(i)
			mu.Lock()
			defer mu.Unlock()
			codesSeen[status.Code(err)]++
		}()
	}
	close(start)
	wg.Wait()
	return codesSeen[codes.OK], codesSeen
}

var naive = []interceptor.ClientOption{interceptor.WithBudget(nil), interceptor.WithBreaker(nil)}

// Seed 000, one hop: 50 concurrent callers, the origin answers UNAVAILABLE
// to everything.
func TestSeedOutageOneHop(t *testing.T) {
	for _, tt := range []struct {
		name string
		opts []interceptor.ClientOption
		max  int
		min  int
	}{
		{"defaults", nil, 52, 50}, // issue 14: at most 1.05x
		{"naive 3 attempts", naive, 150, 150},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, origin.Always(codes.Unavailable), tt.opts...)
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
// wave, as in the seed articles: every caller has deposited into the
// budget before any failure comes back, whatever the scheduler does.
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

// Seed 000: 50 callers, 5 of which fail once: the budget is invisible.
func TestSeedFlaky(t *testing.T) {
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
}

// Seed 002: once the breaker has opened, a second wave never reaches the
// origin.
func TestSeedSecondWaveAfterBreakerOpened(t *testing.T) {
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

// hop is one service of a chain: a server with the suite's server
// interceptors whose handlers forward to next through the suite's client.
func startChain(t *testing.T, o *origin.Origin, hops int, clientOpts []interceptor.ClientOption, serverOpts []interceptor.ServerOption) (echov1.EchoServiceClient, func() int) {
	t.Helper()
	l := origin.Bufconn()
	srv := origin.Serve(l, o)
	t.Cleanup(srv.Stop)
	target := l
	var handled atomic.Int64
	for range hops {
		guard := interceptor.NewClient(append([]interceptor.ClientOption{fast}, clientOpts...)...)
		cc, err := target.Dial(grpc.WithChainUnaryInterceptor(guard.Unary()))
		require.NoError(t, err)
		t.Cleanup(func() { cc.Close() })
		next := interceptor.NewServer(serverOpts...)
		hl := origin.Bufconn()
		hs := origin.Serve(hl, &origin.Hop{Next: echov1.NewEchoServiceClient(cc)},
			grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
				handled.Add(1)
				return h(ctx, req)
			}, next.Unary()))
		t.Cleanup(hs.Stop)
		target = hl
	}
	guard := interceptor.NewClient(append([]interceptor.ClientOption{fast}, clientOpts...)...)
	cc, err := target.Dial(grpc.WithChainUnaryInterceptor(guard.Unary()))
	require.NoError(t, err)
	t.Cleanup(func() { cc.Close() })
	return echov1.NewEchoServiceClient(cc), func() int { return int(handled.Load()) }
}

// Seed 000, three services deep: client → A → B → C → dead origin.
func TestSeedChainOfThree(t *testing.T) {
	for _, tt := range []struct {
		name       string
		clientOpts []interceptor.ClientOption
		serverOpts []interceptor.ServerOption
		max, min   int
	}{
		{"defaults", nil, nil, 12, 10},
		{"naive 3 attempts per hop", naive, []interceptor.ServerOption{interceptor.WithoutPushback(), interceptor.WithServerBudget(nil)}, 810, 810},
	} {
		t.Run(tt.name, func(t *testing.T) {
			o := origin.New(origin.Always(codes.Unavailable))
			top, _ := startChain(t, o, 3, tt.clientOpts, tt.serverOpts)
			ok, _ := concurrently(10, func(i int) error {
				_, err := top.Put(t.Context(), &echov1.PutRequest{RequestId: fmt.Sprint(i)})
				return err
			})
			assert.Equal(t, 0, ok)
			t.Logf("%s: origin saw %d requests for 10 calls", tt.name, o.Total())
			assert.LessOrEqual(t, o.Total(), tt.max)
			assert.GreaterOrEqual(t, o.Total(), tt.min)
		})
	}
}
