package interceptor_test

import (
	"context"
	"fmt"
	"strconv"
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
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// clientv3Retry is a retry loop installed outside the suite, as etcd's
// clientv3 installs its own (grpc.WithUnaryInterceptor, outside the
// interceptors of its Config.DialOptions): every try calls the rest of the
// chain again with the same context and request, up to tries times, while
// the status is UNAVAILABLE and the context is not done, waiting backoff
// between tries. tried counts the tries.
func clientv3Retry(tries int, backoff time.Duration, tried *atomic.Int64) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		var err error
		for i := range tries {
			if i > 0 {
				if werr := sleepCtx(ctx, backoff); werr != nil {
					return err
				}
			}
			tried.Add(1)
			if err = invoker(ctx, method, req, reply, cc, opts...); err == nil || status.Code(err) != codes.Unavailable {
				return err
			}
		}
		return err
	}
}

// middlewareRetry is go-grpc-middleware's retry loop: each try after the
// first gets a context of its own, the caller's with an attempt header.
func middlewareRetry(tries int, backoff time.Duration, tried *atomic.Int64) grpc.UnaryClientInterceptor {
	return func(parent context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		var err error
		for i := range tries {
			ctx := parent
			if i > 0 {
				if werr := sleepCtx(parent, backoff); werr != nil {
					return err
				}
				ctx = metadata.AppendToOutgoingContext(parent, "x-retry-attempty", strconv.Itoa(i))
			}
			tried.Add(1)
			if err = invoker(ctx, method, req, reply, cc, opts...); err == nil || status.Code(err) != codes.Unavailable {
				return err
			}
		}
		return err
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// outerEnv is an origin over bufconn and a client of it with a retry loop
// outside the suite.
type outerEnv struct {
	origin  *origin.Origin
	echo    echov1.EchoServiceClient
	budgets *budget.Registry
	tried   atomic.Int64
}

func newOuterEnv(t *testing.T, script origin.Script, loop func(int, time.Duration, *atomic.Int64) grpc.UnaryClientInterceptor, opts ...interceptor.ClientOption) *outerEnv {
	return newOuterEnvTries(t, 100, script, loop, opts...)
}

func newOuterEnvTries(t *testing.T, tries int, script origin.Script, loop func(int, time.Duration, *atomic.Int64) grpc.UnaryClientInterceptor, opts ...interceptor.ClientOption) *outerEnv {
	t.Helper()
	e := &outerEnv{origin: origin.New(script), budgets: budget.NewRegistry(budgetNoBurst())}
	l := origin.Bufconn()
	srv := origin.Serve(l, e.origin)
	guard := interceptor.NewClient(append(append(noopProviders(), fast, interceptor.WithBudget(e.budgets)), opts...)...)
	cc, err := l.Dial(append([]grpc.DialOption{grpc.WithUnaryInterceptor(loop(tries, time.Millisecond, &e.tried))}, guard.DialOptions()...)...)
	require.NoError(t, err)
	t.Cleanup(func() { cc.Close(); srv.Stop() })
	e.echo = echov1.NewEchoServiceClient(cc)
	return e
}

// calls makes n Puts from 8 workers, each with its own request and a 5 s
// deadline, and returns how many succeeded.
func (e *outerEnv) calls(t *testing.T, prefix string, n int) int {
	var next, ok atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
				_, err := e.echo.Put(ctx, &echov1.PutRequest{RequestId: fmt.Sprint(prefix, i)})
				cancel()
				if err == nil {
					ok.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return int(ok.Load())
}

// switchable serves OK until down is set, then UNAVAILABLE at once (etcd
// without a quorum answering "no leader").
func switchable(down *atomic.Bool) origin.Script {
	return func(origin.Call) origin.Reply {
		if down.Load() {
			return origin.Reply{Code: codes.Unavailable, Message: "etcdserver: no leader"}
		}
		return origin.Reply{}
	}
}

// A retry loop outside the suite (clientv3's: same context and request,
// up to 100 tries) is seen and bounded: a try that comes back is charged
// to the budget as a retry, and refused before the network when the
// budget says no. With the dependency answering UNAVAILABLE at once (a
// lost quorum), at most 1.2 requests reach it per logical call.
func TestOuterRetryLoopQuorumLost(t *testing.T) {
	for name, loop := range map[string]func(int, time.Duration, *atomic.Int64) grpc.UnaryClientInterceptor{
		"clientv3":           clientv3Retry,
		"go-grpc-middleware": middlewareRetry,
	} {
		t.Run(name, func(t *testing.T) {
			const healthy, outage = 100, 200
			var down atomic.Bool
			e := newOuterEnv(t, switchable(&down), loop)
			require.Equal(t, healthy, e.calls(t, "h", healthy))
			require.Equal(t, healthy, e.origin.Total(), "healthy: one request per call")
			down.Store(true)
			e.tried.Store(0)
			ok := e.calls(t, "o", outage)
			sent := e.origin.Total() - healthy
			perCall := float64(sent) / outage
			var st budget.Stats
			e.budgets.Range(func(_ string, b *budget.Budget) bool { st = b.Stats(); return true })
			t.Logf("%s: %d logical calls, %d tries, %d requests: %.2f requests per call; budget %+v", name, outage, e.tried.Load(), sent, perCall, st)
			assert.Zero(t, ok)
			assert.LessOrEqual(t, perCall, 1.2)
			assert.Greater(t, e.tried.Load(), int64(outage), "the outer loop did try again")
		})
	}
}

// Healthy calls through an outer loop are unchanged: one try, one request
// and one deposit per call.
func TestOuterRetryLoopHealthy(t *testing.T) {
	e := newOuterEnv(t, origin.Succeed(), clientv3Retry)
	const n = 300
	require.Equal(t, n, e.calls(t, "h", n))
	assert.Equal(t, n, e.origin.Total())
	assert.Equal(t, int64(n), e.tried.Load())
	var deposits uint64
	e.budgets.Range(func(_ string, b *budget.Budget) bool { deposits += b.Stats().Requests; return true })
	assert.Equal(t, uint64(n), deposits)
}

// Only the same logical call comes back: a new request sent with the
// context of a failed call is a new call (it deposits, and is sent even
// with the budget empty), and so is a request re-sent with
// context.Background(), which every caller shares.
func TestOuterRetryLoopNewCallsAreNotRetries(t *testing.T) {
	var down atomic.Bool
	down.Store(true)
	e := newOuterEnv(t, switchable(&down), clientv3Retry)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	_, err := e.echo.Put(ctx, &echov1.PutRequest{RequestId: "a"})
	require.Equal(t, codes.Unavailable, status.Code(err))
	sent := e.origin.Total()
	require.Less(t, sent, 5, "the outer loop's tries were refused")
	down.Store(false)
	_, err = e.echo.Put(ctx, &echov1.PutRequest{RequestId: "b"})
	require.NoError(t, err, "a new request with the same context is a new call")

	down.Store(true)
	req := &echov1.PutRequest{RequestId: "c"}
	_, err = e.echo.Put(context.Background(), req)
	require.Equal(t, codes.Unavailable, status.Code(err))
	down.Store(false)
	before := e.origin.Total()
	_, err = e.echo.Put(context.Background(), req)
	require.NoError(t, err, "context.Background() identifies no call")
	assert.Equal(t, before+1, e.origin.Total())
}

// A method that may not be repeated, re-sent by an outer loop, is the
// outer loop's choice: the suite sends each try at most once, as without
// it, and only while the budget would fund a retry. Its 100 tries, 1 ms
// apart, take 100 ms: less than the half second after which a locked
// route lets a try through as a probe (in a bubble, so that a loaded
// machine's stalls do not stretch them past it).
func TestOuterRetryLoopUnmarkedMethod(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newOuterEnv(t, origin.Always(codes.Unavailable), clientv3Retry)
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		_, err := e.echo.Notify(ctx, &echov1.NotifyRequest{RequestId: "n"})
		assert.Equal(t, codes.Unavailable, status.Code(err))
		t.Logf("%d tries, %d requests", e.tried.Load(), e.origin.Total())
		assert.Equal(t, int64(100), e.tried.Load(), "the outer loop tried 100 times")
		assert.Equal(t, 1, e.origin.Total(), "one deposit at 10% funds no retry: the tries after the first were refused")
		assert.Equal(t, interceptor.ReasonBudget, interceptor.RefusedBy(err))
	})
}

// A try of a retry_with_key method that comes back sends the idempotency
// key of the logical call's first try, so that the server deduplicates
// the outer loop's tries.
func TestOuterRetryLoopKeepsIdempotencyKey(t *testing.T) {
	var mu sync.Mutex
	keys := map[string]int{}
	var calls atomic.Int64
	e := newOuterEnv(t, func(c origin.Call) origin.Reply {
		if c.Method != charge {
			return origin.Reply{}
		}
		mu.Lock()
		keys[c.Metadata.Get(idempotency.MetadataKey)[0]]++
		mu.Unlock()
		if calls.Add(1) <= 4 {
			return origin.Reply{Code: codes.Unavailable}
		}
		return origin.Reply{}
	}, clientv3Retry, interceptor.WithBudget(nil))
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	for i := range 10 { // the target serves: its failures are not all it does lately
		_, err := e.echo.Put(ctx, &echov1.PutRequest{RequestId: fmt.Sprint(i)})
		require.NoError(t, err)
	}
	e.tried.Store(0)
	_, err := e.echo.Charge(ctx, &echov1.ChargeRequest{RequestId: "k", Account: "acct", AmountCents: 1})
	require.NoError(t, err)
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d tries of the Charge, keys %v", e.tried.Load(), keys)
	assert.Greater(t, e.tried.Load(), int64(1), "the suite's own attempts ran out and the outer loop tried again")
	require.Len(t, keys, 1, "one key for every attempt of every try")
	for k := range keys {
		assert.NoError(t, idempotency.ValidateKey(k))
	}
}

// A try that the suite refuses extends nothing, and a locked route is
// probed: with the budget empty and the breaker off, a try that comes back
// is refused before anything is sent; the route is then locked (its target
// served nothing lately), and while tries come back 20 a second, one is
// sent as a probe every half a second, which the budget does not pay for.
// The probe that succeeds heals the route: the call is forgotten, and the
// next try is a call of its own.
func TestOuterRetryLoopRefusedTriesAreProbed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var down atomic.Bool
		down.Store(true)
		e := newOuterEnvTries(t, 1, switchable(&down), clientv3Retry, interceptor.WithBreaker(nil))
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		req := &echov1.PutRequest{RequestId: "w"}
		_, err := e.echo.Put(ctx, req) // one deposit at 10% funds no retry
		require.Equal(t, codes.Unavailable, status.Code(err))
		require.Equal(t, 1, e.origin.Total())
		time.Sleep(4 * time.Second)
		_, err = e.echo.Put(ctx, req)
		assert.Equal(t, interceptor.ReasonBudget, interceptor.RefusedBy(err), "a retry the budget refuses")
		assert.Equal(t, 1, e.origin.Total(), "refused before anything was sent")
		var sent []int
		for i := range 40 { // 2 s, a try every 50 ms
			time.Sleep(50 * time.Millisecond)
			before := e.origin.Total()
			_, err = e.echo.Put(ctx, req)
			require.Error(t, err)
			if e.origin.Total() > before {
				sent = append(sent, i)
			}
		}
		t.Logf("tries sent as probes: %v", sent)
		require.GreaterOrEqual(t, len(sent), 3, "a probe about every half a second")
		assert.LessOrEqual(t, len(sent), 5)
		assert.GreaterOrEqual(t, sent[0], 7, "the first probe half a second after the lock")
		for i := 1; i < len(sent); i++ {
			assert.GreaterOrEqual(t, sent[i]-sent[i-1], 8, "probes at least 0.45 s apart")
		}
		down.Store(false)
		recovered := time.Now()
		for err != nil {
			time.Sleep(50 * time.Millisecond)
			_, err = e.echo.Put(ctx, req)
		}
		assert.LessOrEqual(t, time.Since(recovered), time.Second, "a probe succeeded within a second of recovery")
		down.Store(true)
		before := e.origin.Total()
		_, err = e.echo.Put(ctx, req)
		require.Equal(t, codes.Unavailable, status.Code(err))
		assert.Equal(t, before+1, e.origin.Total(), "healed: a call of its own, sent")
	})
}
