package interceptor_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
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

	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
	"github.com/stormguard/stormguard/semconv"
)

// libraryLoop is a client library's own retry interceptor, installed
// outside the suite (grpc.WithUnaryInterceptor, which grpc-go runs outside
// every interceptor of the dial options), in the shape of the Google Cloud
// client libraries' retries (gax-go) rather than etcd's clientv3: it
// retries UNAVAILABLE, ABORTED and UNKNOWN; it backs off exponentially
// with full jitter, from initial, times mult after each try, up to max (a
// minute); it gives a call without a deadline a default one; and when the
// deadline passes it returns only the context's error, not the last
// status. Every try calls the rest of the chain with the same context and
// request.
type libraryLoop struct {
	initial, max   time.Duration
	mult           float64
	defaultTimeout time.Duration
	codes          []codes.Code

	mu  sync.Mutex
	rng *rand.Rand

	tries atomic.Int64
	// onTry, when set, is told each try's start, context and outcome.
	onTry func(start time.Time, ctx context.Context, err error)
}

// newLibraryLoop returns a loop with the libraries' usual settings: 100 ms
// growing by 1.3 up to 60 s, and a 60 s default deadline.
func newLibraryLoop() *libraryLoop {
	return &libraryLoop{initial: 100 * time.Millisecond, max: time.Minute, mult: 1.3, defaultTimeout: time.Minute,
		codes: []codes.Code{codes.Unavailable, codes.Aborted, codes.Unknown}, rng: rand.New(rand.NewPCG(1, 2))}
}

func (l *libraryLoop) jitter(d time.Duration) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return time.Duration(l.rng.Int64N(int64(d) + 1))
}

func (l *libraryLoop) unary() grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if _, ok := ctx.Deadline(); !ok && l.defaultTimeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, l.defaultTimeout)
			defer cancel()
		}
		for cur := l.initial; ; cur = min(time.Duration(float64(cur)*l.mult), l.max) {
			l.tries.Add(1)
			if n, ok := ctx.Value(tryCounterKey{}).(*atomic.Int64); ok {
				n.Add(1)
			}
			start := time.Now()
			err := invoker(ctx, method, req, reply, cc, opts...)
			if l.onTry != nil {
				l.onTry(start, ctx, err)
			}
			if err == nil {
				return nil
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if !slices.Contains(l.codes, status.Code(err)) {
				return err
			}
			if werr := sleepCtx(ctx, l.jitter(cur)); werr != nil {
				return werr
			}
		}
	}
}

// libEnv is an origin over bufconn whose script a test switches, and an
// echo client of it through the library's loop and, unless alone, the
// suite (dialed with DialOptions and its defaults).
type libEnv struct {
	origin *origin.Origin
	echo   echov1.EchoServiceClient
	loop   *libraryLoop
	guard  *interceptor.Client // nil: the library alone
}

// newLibEnv must be called inside a synctest bubble.
func newLibEnv(t *testing.T, loop *libraryLoop, alone bool, script origin.Script, opts ...interceptor.ClientOption) *libEnv {
	t.Helper()
	e := &libEnv{origin: origin.New(script), loop: loop}
	l := origin.Bufconn()
	srv := origin.Serve(l, e.origin)
	dial := []grpc.DialOption{grpc.WithUnaryInterceptor(loop.unary())}
	if !alone {
		e.guard = interceptor.NewClient(append(noopProviders(), opts...)...)
		dial = append(dial, e.guard.DialOptions()...)
	} else {
		dial = append(dial, grpc.WithDisableRetry())
	}
	cc, err := l.Dial(dial...)
	require.NoError(t, err)
	t.Cleanup(func() { cc.Close(); srv.Stop() })
	e.echo = echov1.NewEchoServiceClient(cc)
	return e
}

// downFor answers code at once (a dependency that lost its quorum, or a
// transaction service aborting everything) while down is set, and OK after
// 20 ms of work otherwise.
func downFor(down *atomic.Bool, code codes.Code) origin.Script {
	return func(origin.Call) origin.Reply {
		if down.Load() {
			return origin.Reply{Code: code, Message: "dependency down"}
		}
		return origin.Reply{Delay: 20 * time.Millisecond}
	}
}

// steady makes logical calls at rate per second for d, each a Put of its
// own through the library's loop with the given timeout (0: none), and
// waits for all of them. It returns how many it made.
func (e *libEnv) steady(prefix string, rate float64, d, timeout time.Duration) int {
	var wg sync.WaitGroup
	every := time.Duration(float64(time.Second) / rate)
	n := int(d / every)
	for i := range n {
		wg.Go(func() {
			ctx, cancel := context.Background(), context.CancelFunc(func() {})
			if timeout > 0 {
				ctx, cancel = context.WithTimeout(ctx, timeout)
			}
			defer cancel()
			_, _ = e.echo.Put(ctx, &echov1.PutRequest{RequestId: fmt.Sprint(prefix, i)})
		})
		time.Sleep(every)
	}
	wg.Wait()
	return n
}

// perLogicalCall runs a steady stream of logical calls through the
// library's loop against a dependency that answers code to every request:
// after warm, healthy, the dependency goes down for the outage, and
// perLogicalCall returns the requests that reached it per logical call
// made during the outage.
func perLogicalCall(t *testing.T, loop *libraryLoop, code codes.Code, rate float64, warm, outage, timeout time.Duration) float64 {
	var down atomic.Bool
	e := newLibEnv(t, loop, false, downFor(&down, code))
	e.steady("warm", rate, warm, timeout)
	before := e.origin.Total()
	down.Store(true)
	loop.tries.Store(0)
	n := e.steady("down", rate, outage, timeout)
	sent := e.origin.Total() - before
	per := float64(sent) / float64(n)
	t.Logf("%d logical calls, %d tries, %d requests: %.3f per logical call", n, loop.tries.Load(), sent, per)

	return per
}

// A library client whose calls arrive at a steady rate while its dependency
// is down (5 s deadlines): however many calls are in flight at once, the
// tries of its loop after the first are paid from the budget.
func TestOuterLoopManyCallsInFlight(t *testing.T) {
	// Under the race detector (7 times slower, and it allows 8,128
	// goroutines) the smallest cell runs; CI runs every cell without it.
	cells := []int{320}
	if !raceEnabled {
		cells = append(cells, 2_560, 10_000)
	}
	for _, inFlight := range cells {
		t.Run(fmt.Sprint(inFlight), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const timeout = 5 * time.Second
				rate := float64(inFlight) / timeout.Seconds()
				per := perLogicalCall(t, newLibraryLoop(), codes.Unavailable, rate, 2*time.Second, 15*time.Second, timeout)
				assert.LessOrEqual(t, per, 1.2)
			})
		})
	}
}

// A loop that backs off up to a minute, and calls without a deadline of
// their own (the library gives them a minute): its tries come back long
// after the last one failed, and are paid all the same. With a client as
// busy as above (64 calls a second), the bound holds. With a quiet one (a
// call a second) and no breaker to refuse its calls' first tries, every
// try after the first is taken for a retry: the budget gets one deposit
// per logical call; what the probes of its dead target add is logged. With
// the breaker (the default), it opens and the bound holds.
func TestOuterLoopLongBackoffWithoutDeadline(t *testing.T) {
	t.Run("busy", func(t *testing.T) {
		rate := 64.0
		if raceEnabled {
			rate = 16 // a quarter of the tries; CI runs 64 without the race detector
		}
		synctest.Test(t, func(t *testing.T) {
			per := perLogicalCall(t, newLibraryLoop(), codes.Unavailable, rate, 2*time.Second, 2*time.Minute, 0)
			assert.LessOrEqual(t, per, 1.2)
		})
	})
	t.Run("quiet with the default breaker", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			per := perLogicalCall(t, newLibraryLoop(), codes.Unavailable, 1, 2*time.Second, 10*time.Minute, 0)
			assert.LessOrEqual(t, per, 1.2)
		})
	})
	t.Run("quiet", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var down atomic.Bool
			loop := newLibraryLoop()
			e := newLibEnv(t, loop, false, downFor(&down, codes.Unavailable), interceptor.WithBreaker(nil))
			warm := e.steady("warm", 1, 2*time.Second, 0)
			down.Store(true)
			n := e.steady("down", 1, 10*time.Minute, 0)
			deposits := e.guard.Targets()[0].Budget.Requests
			t.Logf("%d logical calls, %d tries, %d requests: %.3f per logical call; %d deposits", n, loop.tries.Load(), e.origin.Total()-warm, float64(e.origin.Total()-warm)/float64(n), deposits)
			assert.Equal(t, uint64(warm+n), deposits, "one deposit per logical call: every later try was taken for a retry")
		})
	})
}

// A loop that retries ABORTED and UNKNOWN too: its tries of calls that
// failed with them are paid.
func TestOuterLoopRetriesAbortedAndUnknown(t *testing.T) {
	for _, code := range []codes.Code{codes.Aborted, codes.Unknown} {
		t.Run(code.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				per := perLogicalCall(t, newLibraryLoop(), code, 64, 2*time.Second, 15*time.Second, 5*time.Second)
				assert.LessOrEqual(t, per, 1.2)
			})
		})
	}
}

// A loop that keeps trying until its deadline returns only the context's
// error, which says nothing of the suite's refusals: a context that
// records them (RecordRefusals) tells the caller that the suite refused
// its call's tries.
func TestOuterLoopRefusalsRecordedOnTheContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var down atomic.Bool
		down.Store(true)
		loop := newLibraryLoop()
		e := newLibEnv(t, loop, false, downFor(&down, codes.Unavailable))
		const n = 200
		var refusedTries, recorded, bare atomic.Int64
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				defer cancel()
				ctx, refused := interceptor.RecordRefusals(ctx)
				id := fmt.Sprint("r", i)
				var tries atomic.Int64
				ctx = withTryCounter(ctx, &tries)
				_, err := e.echo.Put(ctx, &echov1.PutRequest{RequestId: id})
				require.ErrorIs(t, err, context.DeadlineExceeded)
				if interceptor.RefusedBy(err) == "" {
					bare.Add(1)
				}
				if int(tries.Load()) > e.origin.CountID(put, id) {
					refusedTries.Add(1) // the suite sent fewer requests than the loop made tries
					if refused() != "" {
						recorded.Add(1)
					}
				}
			})
			time.Sleep(10 * time.Millisecond)
		}
		wg.Wait()
		t.Logf("%d logical calls: %d with tries the suite refused, %d of them recorded on the context; RefusedBy(err) empty for %d", n, refusedTries.Load(), recorded.Load(), bare.Load())
		assert.Equal(t, int64(n), bare.Load(), "the loop returns only the context's error")
		assert.Greater(t, refusedTries.Load(), int64(n/2))
		assert.Equal(t, refusedTries.Load(), recorded.Load(), "every call whose tries were refused says so")
	})
}

type tryCounterKey struct{}

// withTryCounter returns ctx carrying n, to which the library's loop adds
// each of its tries.
func withTryCounter(ctx context.Context, n *atomic.Int64) context.Context {
	return context.WithValue(ctx, tryCounterKey{}, n)
}

// The calls in flight when the dependency recovers, inside the library's
// loop (128 closed-loop workers, 5 s deadlines, the dependency down from
// 1 s to 4 s), are not locked out: their tries are charged as retries
// while it is down, but once it serves, every try made a second or more
// after it recovered succeeds. Tries refused in that second cost their
// loop its backoff; the test logs how many calls in flight at recovery
// were lost, and how many succeeded in all, with the library's loop alone
// and with the suite.
func TestOuterLoopCallsInFlightRecover(t *testing.T) {
	run := func(t *testing.T, alone bool) (ok, lost int, failedLate []time.Duration) {
		var down atomic.Bool
		loop := newLibraryLoop()
		var mu sync.Mutex
		var recovered time.Time
		loop.onTry = func(at time.Time, ctx context.Context, err error) {
			mu.Lock()
			defer mu.Unlock()
			// A try that ran out of its call's deadline failed for that.
			if err != nil && ctx.Err() == nil && !recovered.IsZero() && at.Sub(recovered) >= time.Second {
				failedLate = append(failedLate, at.Sub(recovered))
			}
		}
		e := newLibEnv(t, loop, alone, downFor(&down, codes.Unavailable))
		start := time.Now()
		var okN, lostN atomic.Int64
		var wg sync.WaitGroup
		workers := 128
		if raceEnabled {
			workers = 32 // a quarter of the calls; CI runs 128 without the race detector
		}
		for w := range workers {
			wg.Go(func() {
				for i := 0; time.Since(start) < 10*time.Second; i++ {
					begun := time.Now()
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					_, err := e.echo.Put(ctx, &echov1.PutRequest{RequestId: fmt.Sprint(w, "/", i)})
					cancel()
					if err == nil {
						okN.Add(1)
						continue
					}
					mu.Lock()
					r := recovered
					mu.Unlock()
					if !r.IsZero() && begun.Before(r) {
						lostN.Add(1) // in flight at recovery, with time left
					}
				}
			})
		}
		time.Sleep(time.Second)
		down.Store(true)
		time.Sleep(3 * time.Second)
		down.Store(false)
		mu.Lock()
		recovered = time.Now()
		mu.Unlock()
		wg.Wait()
		return int(okN.Load()), int(lostN.Load()), failedLate
	}
	var aloneOK, aloneLost int
	synctest.Test(t, func(t *testing.T) { aloneOK, aloneLost, _ = run(t, true) })
	synctest.Test(t, func(t *testing.T) {
		ok, lost, late := run(t, false)
		t.Logf("library alone: %d ok, %d in flight at recovery lost; with the suite: %d ok, %d lost; tries failed a second or more after recovery: %d", aloneOK, aloneLost, ok, lost, len(late))
		assert.Empty(t, late, "every try a second after recovery succeeds")
	})
}

// A poller (one long-lived context, Get every 50 ms with the same request
// message, or a new message with the same content each time) is not locked
// out by an outage: once the dependency serves, its first success comes
// within a second and every poll after it succeeds.
func TestOuterLoopPollerRecovers(t *testing.T) {
	for _, fresh := range []bool{false, true} {
		t.Run(fmt.Sprintf("fresh message %v", fresh), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var down atomic.Bool
				e := newEnv(t, downFor(&down, codes.Unavailable))
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				req := &echov1.GetRequest{RequestId: "poll", Key: "config"}
				var recovered, firstOK time.Time
				var failedAfter int
				for i := range 150 { // 7.5 s
					switch i {
					case 20:
						down.Store(true)
					case 50:
						down.Store(false)
						recovered = time.Now()
					}
					if fresh {
						req = &echov1.GetRequest{RequestId: "poll", Key: "config"}
					}
					_, err := e.echo.Get(ctx, req)
					switch {
					case err == nil && !recovered.IsZero() && firstOK.IsZero():
						firstOK = time.Now()
					case err != nil && !firstOK.IsZero():
						failedAfter++
					}
					time.Sleep(50 * time.Millisecond)
				}
				require.False(t, firstOK.IsZero(), "no success after the dependency recovered")
				t.Logf("first success %v after recovery; %d polls failed after it", firstOK.Sub(recovered), failedAfter)
				assert.LessOrEqual(t, firstOK.Sub(recovered), time.Second)
				assert.Zero(t, failedAfter)
			})
		})
	}
}

// One long-lived context and one request message reused for each call
// with new content (a pooled or reset message): a call that failed is not
// taken for the ones after it. They are sent as calls of their own, never
// refused for the failure, never answered with its error, never marked as
// retries.
func TestOuterLoopReusedMessageIsNotARetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, func(c origin.Call) origin.Reply {
			if c.RequestID == "bad" {
				return origin.Reply{Code: codes.Internal, Message: "origin: internal error for bad"}
			}
			return origin.Reply{}
		})
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		req := &echov1.PutRequest{}
		req.RequestId = "bad"
		_, err := e.echo.Put(ctx, req)
		require.Equal(t, codes.Internal, status.Code(err))
		var failed, marked int
		for i := range 40 {
			req.Reset()
			req.RequestId, req.Key = fmt.Sprint("good", i), "k"
			if _, err := e.echo.Put(ctx, req); err != nil {
				failed++
				t.Logf("call %d: %v", i, err)
			}
		}
		for _, c := range e.origin.Calls() {
			if c.RequestID != "bad" && len(c.Metadata.Get(semconv.PreviousAttemptsKey)) > 0 {
				marked++
			}
		}
		assert.Zero(t, failed, "calls with new content failed")
		assert.Zero(t, marked, "calls with new content were sent as retries")
		assert.Equal(t, 41, e.origin.Total())
	})
}
