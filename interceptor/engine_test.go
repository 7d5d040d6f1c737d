package interceptor_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/deadline"
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
	"github.com/stormguard/stormguard/semconv"
)

// These tests check the attempt engine (engine.go): when a retry is
// decided, paid for and sent, what stops it, and how long it waits.

// The backoff waits on the Client's timers: the n-th retry starts between
// d/2 and d after the failure, d = base·2ⁿ⁻¹, on the bubble's clock.
func TestBackoffWaitsOnTheClientsTimers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		inv := &invoker{script: failFirstN(2)}
		cc := dialPassthrough(t)
		ic := interceptor.NewClient(append(noopProviders(), interceptor.WithBudget(nil),
			interceptor.WithRetryPolicy(interceptor.RetryPolicy{BackoffBase: 100 * time.Millisecond, BackoffMax: time.Second}))...).Unary()
		err := ic(t.Context(), put, &echov1.PutRequest{}, &echov1.PutResponse{}, cc, inv.invoke)
		require.NoError(t, err)
		calls := inv.attempts()
		require.Len(t, calls, 3)
		first, second := calls[1].at.Sub(calls[0].at), calls[2].at.Sub(calls[1].at)
		assert.GreaterOrEqual(t, first, 50*time.Millisecond)
		assert.LessOrEqual(t, first, 100*time.Millisecond)
		assert.GreaterOrEqual(t, second, 100*time.Millisecond)
		assert.LessOrEqual(t, second, 200*time.Millisecond)
		assert.Equal(t, []string{"1"}, calls[1].md.Get(semconv.PreviousAttemptsKey))
		assert.Equal(t, []string{"2"}, calls[2].md.Get(semconv.PreviousAttemptsKey))
	})
}

// A retry the budget cannot pay for is refused at once: the caller does not
// wait a backoff for it (no time passes on the bubble's clock).
func TestRetryRefusedByAnEmptyBudgetDoesNotWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		inv := &invoker{script: failFirstN(1)}
		ic := interceptor.NewClient(append(noopProviders(),
			interceptor.WithBudget(budget.NewRegistry(budgetNoBurst())), interceptor.WithBreaker(nil))...).Unary()
		cc := dialPassthrough(t)
		start := time.Now()
		err := ic(t.Context(), put, &echov1.PutRequest{}, &echov1.PutResponse{}, cc, inv.invoke)
		assert.Equal(t, codes.Unavailable, status.Code(err))
		assert.Equal(t, interceptor.ReasonBudget, interceptor.RefusedBy(err))
		assert.Len(t, inv.attempts(), 1)
		assert.Zero(t, time.Since(start), "the caller waited for a retry that was refused")
	})
}

// A token is withdrawn only for a retry that is sent. Here the retry passes
// the decision (its backoff ends before the deadline) but is refused when
// it is due (less than the minimum time left): the budget must not have
// paid for it.
func TestBudgetIsNotSpentOnARetryThatIsNotSent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		inv := &invoker{script: failFirstN(1)}
		budgets := budget.NewRegistry(budget.Config{})
		ic := interceptor.NewClient(append(noopProviders(),
			interceptor.WithBudget(budgets), interceptor.WithBreaker(nil),
			interceptor.WithRetryPolicy(interceptor.RetryPolicy{BackoffBase: 80 * time.Millisecond, BackoffMax: 80 * time.Millisecond}),
			interceptor.WithDeadline(deadline.ClientConfig{MinRemaining: time.Hour - 10*time.Millisecond}))...).Unary()
		cc := dialPassthrough(t)
		ctx, cancel := context.WithDeadline(t.Context(), time.Now().Add(time.Hour))
		defer cancel()
		err := ic(ctx, put, &echov1.PutRequest{}, &echov1.PutResponse{}, cc, inv.invoke)
		assert.Equal(t, codes.Unavailable, status.Code(err))
		assert.Equal(t, interceptor.ReasonDeadline, interceptor.RefusedBy(err))
		assert.Len(t, inv.attempts(), 1)
		st := budgets.For("passthrough:///fake").Stats()
		assert.Equal(t, uint64(0), st.Granted, "no token for a retry that was never sent")
	})
}

// The same for hedges: a hedge refused when it is due (too little time
// left) takes no token from the budget; the first attempt's answer is the
// call's.
func TestBudgetIsNotSpentOnAHedgeThatIsNotSent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hold := make(chan struct{})
		inv := &invoker{script: func(n int) reply { return reply{hold: hold} }}
		budgets := budget.NewRegistry(budget.Config{})
		var refusals []interceptor.RefusalEvent
		ic := interceptor.NewClient(append(noopProviders(),
			interceptor.WithBudget(budgets), interceptor.WithBreaker(nil),
			interceptor.WithHedging(10*time.Millisecond, 2),
			interceptor.WithHooks(interceptor.Hooks{OnRefusal: func(e interceptor.RefusalEvent) {
				refusals = append(refusals, e)
				close(hold) // the first attempt answers once the hedge was decided
			}}),
			// 1 h at the start, less than MinRemaining when the hedge is due.
			interceptor.WithDeadline(deadline.ClientConfig{MinRemaining: time.Hour - 5*time.Millisecond}))...).Unary()
		cc := dialPassthrough(t)
		ctx, cancel := context.WithDeadline(t.Context(), time.Now().Add(time.Hour))
		defer cancel()
		err := ic(ctx, put, &echov1.PutRequest{}, &echov1.PutResponse{}, cc, inv.invoke)
		require.NoError(t, err, "the first attempt's answer")
		assert.Len(t, inv.attempts(), 1, "no hedge was sent")
		require.Len(t, refusals, 1)
		assert.Equal(t, semconv.EventHedgeRefused, refusals[0].Event)
		assert.Equal(t, interceptor.ReasonDeadline, refusals[0].Reason)
		st := budgets.For("passthrough:///fake").Stats()
		assert.Equal(t, uint64(0), st.Granted, "no token for a hedge that was never sent")
	})
}

// A server's pushback beyond MaxPushback means "do not retry"; a call
// without a deadline does not sleep for 24.8 days. Within the cap, the
// pushback is honoured as the delay.
func TestPushbackBeyondTheCapStopsRetries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		inv := &invoker{script: func(n int) reply {
			return reply{err: errUnavailable, trailer: metadata.Pairs(semconv.PushbackKey, "2147483647")}
		}}
		ic := interceptor.NewClient(append(noopProviders(), interceptor.WithBudget(nil))...).Unary()
		cc := dialPassthrough(t)
		done := make(chan error, 1)
		go func() {
			done <- ic(context.Background(), put, &echov1.PutRequest{}, &echov1.PutResponse{}, cc, inv.invoke)
		}()
		select {
		case err := <-done:
			assert.Equal(t, codes.Unavailable, status.Code(err))
			assert.Equal(t, interceptor.ReasonPushback, interceptor.RefusedBy(err))
		case <-time.After(30 * time.Second):
			t.Fatal("the call is sleeping on the server's pushback")
		}
		assert.Len(t, inv.attempts(), 1)
		// Within the cap, the pushback is honoured as the delay.
		inv = &invoker{script: func(n int) reply {
			if n == 1 {
				return reply{err: errUnavailable, trailer: metadata.Pairs(semconv.PushbackKey, "60000")}
			}
			return reply{}
		}}
		ic = interceptor.NewClient(append(noopProviders(), interceptor.WithBudget(nil))...).Unary()
		require.NoError(t, ic(context.Background(), put, &echov1.PutRequest{}, &echov1.PutResponse{}, cc, inv.invoke))
		calls := inv.attempts()
		require.Len(t, calls, 2)
		assert.Equal(t, time.Minute, calls[1].at.Sub(calls[0].at))
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

// A retry predicate narrows what retries and can never widen it to a method
// that may not be repeated (it is not even asked).
func TestRetryIfNarrowsNeverWidens(t *testing.T) {
	var asked []string
	var mu sync.Mutex
	retryIf := func(_ context.Context, method string, err error) bool {
		mu.Lock()
		asked = append(asked, method)
		mu.Unlock()
		return !strings.Contains(status.Convert(err).Message(), "permanent")
	}
	e := newEnv(t, func(c origin.Call) origin.Reply {
		if c.RequestID == "p" {
			return origin.Reply{Code: codes.Unavailable, Message: "permanent outage"}
		}
		return origin.Reply{Code: codes.Unavailable, Message: "blip"}
	}, interceptor.WithRetryPolicy(interceptor.RetryPolicy{If: retryIf}), interceptor.WithBudget(nil), interceptor.WithBreaker(nil))
	_, err := e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: "p"})
	assert.Equal(t, interceptor.ReasonRetryIf, refusedReason(t, e, err))
	assert.Equal(t, 1, e.origin.CountID(put, "p"), "the predicate refused the retry")
	_, _ = e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: "b"})
	assert.Equal(t, 3, e.origin.CountID(put, "b"), "the predicate allowed it")
	_, _ = e.echo.Notify(t.Context(), &echov1.NotifyRequest{RequestId: "n"})
	assert.Equal(t, 1, e.origin.CountID(notify, "n"))
	_, _ = e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: "c"}, interceptor.MaxAttempts(1))
	mu.Lock()
	defer mu.Unlock()
	for _, m := range asked {
		assert.Equal(t, put, m, "never asked about a method that may not be repeated")
	}
	assert.Len(t, asked, 3, "asked once for p, twice for b")
}

// refusedReason returns the reason the last call span recorded for a
// refusal (retry_if does not annotate the status).
func refusedReason(t *testing.T, e *env, err error) interceptor.Reason {
	t.Helper()
	assert.Equal(t, codes.Unavailable, status.Code(err))
	spans := e.spans.GetSpans()
	for i := len(spans) - 1; i >= 0; i-- {
		for _, ev := range spans[i].Events {
			if ev.Name == semconv.EventRetryRefused {
				for _, a := range ev.Attributes {
					if a.Key == semconv.AttrReason {
						return interceptor.Reason(a.Value.AsString())
					}
				}
			}
		}
	}
	return ""
}

// In shadow mode the budget and the breaker decide and record what they would
// refuse, without refusing. The budget (no burst) would refuse every retry;
// the first attempts of a, b and c, the ones it would have sent, fail, so the
// breaker (3 attempts) opens and would refuse d's.
func TestShadowModeRecordsWithoutRefusing(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	e := newEnv(t, origin.Always(codes.Unavailable), interceptor.WithShadowMode(), interceptor.WithTelemetry(interceptor.Telemetry{MeterProvider: mp}),
		interceptor.WithBudget(budget.NewRegistry(budgetNoBurst())), interceptor.WithBreaker(&breaker.Config{MinAttempts: 3}))
	for _, id := range []string{"a", "b", "c", "d"} {
		_, err := e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: id})
		assert.Equal(t, codes.Unavailable, status.Code(err))
		assert.Equal(t, 3, e.origin.CountID(put, id), "nothing refused: every attempt was sent")
	}
	would := map[string]int64{}
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == semconv.MetricWouldRefuse {
				for _, p := range m.Data.(metricdata.Sum[int64]).DataPoints {
					r, _ := p.Attributes.Value(semconv.AttrReason)
					would[r.AsString()] += p.Value
				}
			}
			if m.Name == semconv.MetricRefusals {
				for _, p := range m.Data.(metricdata.Sum[int64]).DataPoints {
					r, _ := p.Attributes.Value(semconv.AttrReason)
					assert.Equal(t, string(interceptor.ReasonMaxAttempts), r.AsString(), "only the attempt limit refused")
				}
			}
		}
	}
	assert.Positive(t, would[string(interceptor.ReasonBudget)], "the budget would have refused retries")
	assert.Positive(t, would[string(interceptor.ReasonBreaker)], "the breaker opened and would have refused")
}

// Shadow mode records one would-be refusal for each attempt the same
// Client would not have sent: against a dead target, what it sends less
// what the defaults send. (The first call's three attempts are the
// evidence that the target serves nothing; the breaker opens after 20
// failed attempts, and from then on the defaults refuse first attempts at
// their pick.)
func TestShadowModeCountsWhatTheDefaultsWouldNotSend(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	real := newEnv(t, origin.Always(codes.Unavailable))
	shadow := newEnv(t, origin.Always(codes.Unavailable), interceptor.WithShadowMode(), interceptor.WithTelemetry(interceptor.Telemetry{MeterProvider: mp}))
	for i := range 30 {
		_, err := real.echo.Put(t.Context(), &echov1.PutRequest{RequestId: fmt.Sprint(i)})
		require.Equal(t, codes.Unavailable, status.Code(err))
		_, err = shadow.echo.Put(t.Context(), &echov1.PutRequest{RequestId: fmt.Sprint(i)})
		require.Equal(t, codes.Unavailable, status.Code(err))
	}
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	would := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == semconv.MetricWouldRefuse {
				for _, p := range m.Data.(metricdata.Sum[int64]).DataPoints {
					r, _ := p.Attributes.Value(semconv.AttrReason)
					would[r.AsString()] += p.Value
				}
			}
		}
	}
	assert.Equal(t, 90, shadow.origin.Total(), "shadow mode refuses nothing")
	assert.Less(t, real.origin.Total(), 30, "the defaults stop retrying, then sending")
	assert.Equal(t, map[string]int64{string(interceptor.ReasonBreaker): int64(90 - real.origin.Total())}, would)
}

// grpc-go applies a service config's method timeout to the whole call; through
// the suite it must not become a timeout per attempt (which stretched a 200 ms
// bound to 4 attempts and 576 ms).
func TestServiceConfigTimeoutBoundsTheWholeCall(t *testing.T) {
	o := origin.New(func(origin.Call) origin.Reply {
		return origin.Reply{Delay: 150 * time.Millisecond, Code: codes.Unavailable, Message: "slow failure"}
	})
	l := origin.Bufconn()
	srv := origin.Serve(l, o)
	defer srv.Stop()
	guard := interceptor.NewClient(append(noopProviders(), fast, interceptor.WithBudget(nil), interceptor.WithRetryPolicy(interceptor.RetryPolicy{MaxAttempts: 5}))...)
	cc, err := l.Dial(grpc.WithDefaultServiceConfig(`{"methodConfig":[{"name":[{"service":"echo.v1.EchoService"}],"timeout":"0.2s"}]}`),
		grpc.WithChainUnaryInterceptor(guard.Unary()))
	require.NoError(t, err)
	defer cc.Close()
	_, err = echov1.NewEchoServiceClient(cc).Put(context.Background(), &echov1.PutRequest{RequestId: "t"})
	// The call ends at its 200 ms: either the retry runs out of time
	// (DeadlineExceeded), or, on a slow machine, its backoff would end past
	// the deadline and it is not sent (the first attempt's status).
	if status.Code(err) != codes.DeadlineExceeded {
		assert.Equal(t, codes.Unavailable, status.Code(err))
		assert.Equal(t, interceptor.ReasonDeadline, interceptor.RefusedBy(err))
	}
	calls := o.Calls()
	require.NotEmpty(t, calls)
	assert.LessOrEqual(t, len(calls), 2, "one failure at 150 ms, then the call's 200 ms are up")
	for i, c := range calls {
		require.True(t, c.HasDeadline)
		// A timeout per attempt would give the retry a deadline 150 ms
		// later than the first attempt's; the call's own is one deadline.
		assert.Less(t, c.Deadline.Sub(calls[0].Deadline), 50*time.Millisecond, "attempt %d has the call's deadline", i+1)
	}
}

// An idempotency key given as a *KeyCallOption (a pointer) is sent as one
// given by value is.
func TestKeyCallOptionByPointer(t *testing.T) {
	inv := &invoker{script: failFirstN(0)}
	ic := interceptor.NewClient(noopProviders()...).Unary()
	cc := dialPassthrough(t)
	require.NoError(t, ic(t.Context(), charge, &echov1.ChargeRequest{}, &echov1.ChargeResponse{}, cc, inv.invoke,
		&idempotency.KeyCallOption{Key: "order-42"}))
	assert.Equal(t, []string{"order-42"}, inv.attempts()[0].md.Get(idempotency.MetadataKey))
}

// A retry or hedge says its client's budget paid for it
// (semconv.BudgetedKey) only when an enforcing budget did: not without a
// budget, not in shadow mode (where the budget decides nothing), and a
// first attempt never.
func TestBudgetedMarkerOnlyWhenTheBudgetPaid(t *testing.T) {
	for _, tc := range []struct {
		name   string
		opts   []interceptor.ClientOption
		hedge  bool
		marked bool
	}{
		{"retry paid by the budget", nil, false, true},
		{"retry without a budget", []interceptor.ClientOption{interceptor.WithBudget(nil)}, false, false},
		{"retry in shadow mode", []interceptor.ClientOption{interceptor.WithShadowMode()}, false, false},
		{"hedge paid by the budget", nil, true, true},
		{"hedge without a budget", []interceptor.ClientOption{interceptor.WithBudget(nil)}, true, false},
		{"hedge in shadow mode", []interceptor.ClientOption{interceptor.WithShadowMode()}, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				inv := &invoker{script: failFirstN(1)}
				opts := append(noopProviders(), fast)
				if tc.hedge {
					inv.script = func(n int) reply { return reply{block: n == 1} }
					opts = append(opts, interceptor.WithHedging(10*time.Millisecond, 2))
				}
				ic := interceptor.NewClient(append(opts, tc.opts...)...).Unary()
				err := ic(t.Context(), put, &echov1.PutRequest{}, &echov1.PutResponse{}, dialPassthrough(t), inv.invoke)
				require.NoError(t, err)
				calls := inv.attempts()
				require.Len(t, calls, 2)
				assert.Empty(t, calls[0].md.Get(semconv.BudgetedKey), "a first attempt")
				assert.Equal(t, []string{"1"}, calls[1].md.Get(semconv.PreviousAttemptsKey))
				if tc.marked {
					assert.Equal(t, []string{"1"}, calls[1].md.Get(semconv.BudgetedKey))
				} else {
					assert.Empty(t, calls[1].md.Get(semconv.BudgetedKey), "nobody paid for it")
				}
			})
		})
	}
}
