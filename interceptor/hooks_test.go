package interceptor_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
	"github.com/stormguard/stormguard/semconv"
)

// syncBuffer is a bytes.Buffer safe for the concurrent writes of a logger.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// logTo returns the option that sends the Client's logs to buf.
func logTo(buf *syncBuffer) interceptor.ClientOption {
	return interceptor.WithTelemetry(interceptor.Telemetry{Logger: slog.New(slog.NewTextHandler(buf, nil))})
}

// goid returns the current goroutine's number, from its stack header.
func goid() string {
	b := make([]byte, 64)
	b = b[:runtime.Stack(b, false)]
	return strings.Fields(string(b))[1]
}

// catch runs f and returns what it panicked with, if anything.
func catch(f func()) (v any) {
	defer func() { v = recover() }()
	f()
	return nil
}

// A panicking OnRetry during a stream's retry: the panic does not reach
// the caller's RecvMsg, the stream is retried and answers, the panic is
// logged, and once the caller leaves no goroutine is left behind (the old
// code left the attempt's receive lock held: the goroutine that watches
// the caller's context blocked on it forever).
func TestPanickingOnRetryInAStreamRetry(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	var logs syncBuffer
	e := newEnv(t, origin.FailFirst(1, codes.Unavailable), logTo(&logs),
		interceptor.WithHooks(interceptor.Hooks{OnRetry: func(interceptor.RetryEvent) { panic("OnRetry panics") }}))
	ctx, cancel := context.WithCancel(t.Context())
	s, err := e.echo.List(ctx, &echov1.ListRequest{RequestId: "l", Count: 2})
	require.NoError(t, err)
	var recvErr error
	escaped := catch(func() { _, recvErr = s.Recv() })
	cancel()
	e.cc.Close()
	e.server.Stop()
	assert.Nil(t, escaped, "the hook's panic escaped into the caller's RecvMsg")
	assert.NoError(t, recvErr, "the stream was retried and answered")
	assert.Contains(t, logs.String(), "OnRetry panics")
	goleak.VerifyNone(t, ignore)
}

// OnRefusal runs on the goroutine of the call, as its documentation says,
// also for a retry refused at a per-attempt timeout (EventTimeoutKept):
// the old code called it on the timer's goroutine, where a panic kills the
// process. The attempt here (a reply that is not a proto message, so the
// attempt itself is timed) is kept because the target has served nothing
// lately: three calls failed before it.
func TestOnRefusalAtAPerAttemptTimeoutRunsOnTheCallsGoroutine(t *testing.T) {
	for _, panics := range []bool{false, true} {
		t.Run(fmt.Sprint("panics=", panics), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				hold := make(chan struct{})
				inv := &invoker{sent: make(chan int, 8), script: func(n int) reply {
					if n <= 3 {
						return reply{err: errUnavailable}
					}
					return reply{hold: hold}
				}}
				type hookCall struct {
					e interceptor.RefusalEvent
					g string
				}
				calls := make(chan hookCall, 8)
				var logs syncBuffer
				reader := sdkmetric.NewManualReader()
				ic := interceptor.NewClient(append(noopProviders(), logTo(&logs),
					interceptor.WithTelemetry(interceptor.Telemetry{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))}),
					interceptor.WithRetryPolicy(interceptor.RetryPolicy{PerAttemptTimeout: 100 * time.Millisecond}),
					interceptor.WithHooks(interceptor.Hooks{OnRefusal: func(e interceptor.RefusalEvent) {
						calls <- hookCall{e, goid()}
						if panics && e.Event == semconv.EventTimeoutKept {
							panic("OnRefusal panics")
						}
					}}))...).Unary()
				cc := dialPassthrough(t)
				for i := range 3 {
					// Three calls of their own: same context, other requests
					// (the same request again would be a try of the first).
					err := ic(t.Context(), put, &echov1.PutRequest{RequestId: fmt.Sprint(i)}, new(nonProtoReply), cc, inv.invoke, interceptor.MaxAttempts(1))
					require.Error(t, err)
					<-inv.sent
					require.Equal(t, interceptor.ReasonMaxAttempts, (<-calls).e.Reason, "call %d", i)
				}
				keptByBreaker := func() int64 {
					agg, ok := collect(t, reader)[semconv.MetricRefusals]
					if !ok {
						return 0
					}
					return sumBy(t, agg, semconv.AttrReason)[string(interceptor.ReasonBreaker)]
				}
				callG := make(chan string, 1)
				done := make(chan error, 1)
				go func() {
					callG <- goid()
					done <- ic(t.Context(), put, &echov1.PutRequest{}, new(nonProtoReply), cc, inv.invoke)
				}()
				<-inv.sent
				synctest.Wait()
				require.Zero(t, keptByBreaker(), "a refusal before the per-attempt timeout")
				time.Sleep(100 * time.Millisecond) // the per-attempt timeout
				synctest.Wait()
				// The timer's refusal is counted when it fires.
				require.EqualValues(t, 1, keptByBreaker(), "the per-attempt timer kept the attempt")
				close(hold) // the kept attempt answers
				require.NoError(t, <-done, "the kept attempt's answer is the call's")
				var hc hookCall
				select {
				case hc = <-calls:
				case <-time.After(10 * time.Second):
					t.Fatal("no OnRefusal for the kept attempt")
				}
				assert.Equal(t, semconv.EventTimeoutKept, hc.e.Event)
				assert.Equal(t, interceptor.ReasonBreaker, hc.e.Reason)
				assert.Equal(t, <-callG, hc.g, "OnRefusal ran on another goroutine than the call's")
				if panics {
					assert.Contains(t, logs.String(), "OnRefusal panics")
				}
			})
		})
	}
}

// A panic in OnBreakerChange as the breaker goes from open to half-open
// does not lose the probe: the target, healed, is called again as soon as
// the open period is over. The old code let the panic through the breaker
// in the Admit that took the probe's slot, and the slot stayed taken until
// the probe was presumed failed, a whole breaker window (10 s) later: every
// call in between was refused.
func TestPanickingOnBreakerChangeKeepsTheProbe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var down atomic.Bool
		down.Store(true)
		var logs syncBuffer
		e := newEnv(t, func(origin.Call) origin.Reply {
			if down.Load() {
				return origin.Reply{Code: codes.Unavailable}
			}
			return origin.Reply{}
		}, logTo(&logs), interceptor.WithHooks(interceptor.Hooks{
			OnBreakerChange: func(e interceptor.BreakerEvent) {
				if e.To == breaker.StateHalfOpen {
					panic("OnBreakerChange panics")
				}
			},
		}))
		for i := range 25 {
			_, _ = e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: fmt.Sprint(i)}, interceptor.MaxAttempts(1))
		}
		require.Equal(t, "open", e.guard.Targets()[0].Breakers[0].State)
		down.Store(false)
		time.Sleep(1200 * time.Millisecond) // past the open period (1 s, plus at most 20% jitter)
		failed := 0
		for i := range 20 { // over 2 s
			var err error
			if v := catch(func() { _, err = e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: fmt.Sprint("healed", i)}) }); v != nil {
				err = fmt.Errorf("panicked: %v", v)
			}
			if err != nil {
				failed++
				t.Logf("call %d: %v", i, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		assert.Zero(t, failed, "calls to the healed target failed")
		assert.Contains(t, logs.String(), "OnBreakerChange panics")
	})
}

// The hooks are called on retry, on refusal (with its reason) and on a
// breaker's change of state.
func TestHooks(t *testing.T) {
	var mu sync.Mutex
	var retries []interceptor.RetryEvent
	var refusals []interceptor.RefusalEvent
	var changes []string
	hooks := interceptor.Hooks{
		OnRetry:   func(e interceptor.RetryEvent) { mu.Lock(); retries = append(retries, e); mu.Unlock() },
		OnRefusal: func(e interceptor.RefusalEvent) { mu.Lock(); refusals = append(refusals, e); mu.Unlock() },
		OnBreakerChange: func(e interceptor.BreakerEvent) {
			mu.Lock()
			changes = append(changes, e.From.String()+"→"+e.To.String())
			mu.Unlock()
		},
	}
	e := newEnv(t, origin.Always(codes.Unavailable), interceptor.WithHooks(hooks), interceptor.WithBudget(nil),
		interceptor.WithBreaker(&breaker.Config{MinAttempts: 3}))
	_, err := e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: "h"})
	assert.Equal(t, codes.Unavailable, status.Code(err))
	_, err = e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: "i"})
	assert.Equal(t, codes.Unavailable, status.Code(err))
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, retries, 2, "the first call retried twice")
	assert.Equal(t, put, retries[0].Method)
	assert.Equal(t, 2, retries[0].Attempt)
	assert.Equal(t, 3, retries[1].Attempt)
	assert.Equal(t, codes.Unavailable, status.Code(retries[0].Err))
	require.Len(t, refusals, 2)
	assert.Equal(t, interceptor.ReasonMaxAttempts, refusals[0].Reason)
	assert.Equal(t, interceptor.ReasonBreaker, refusals[1].Reason, "the second call was refused by the open breaker")
	assert.Equal(t, semconv.EventBreakerRejected, refusals[1].Event)
	assert.Equal(t, []string{"closed→open"}, changes)
}
