package interceptor_test

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/semconv"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// When an attempt has not answered within its per-attempt timeout and a
// retry may be sent, the retry is sent then, beside it (the slow attempt
// is not cancelled); the first answer wins and the loser is cancelled.
// The retry's token is withdrawn once.
func TestPerAttemptTimeoutSendsARetryBesideTheSlowAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		inv := &invoker{script: func(n int) reply { return reply{block: n == 1} }}
		budgets := budget.NewRegistry(budget.Config{})
		ic := interceptor.NewClient(append(noopProviders(), interceptor.WithBudget(budgets),
			interceptor.WithRetryPolicy(interceptor.RetryPolicy{PerAttemptTimeout: 100 * time.Millisecond}))...).Unary()
		cc := dialPassthrough(t)
		err := ic(t.Context(), put, &echov1.PutRequest{}, &echov1.PutResponse{}, cc, inv.invoke)
		require.NoError(t, err)
		calls := inv.attempts()
		require.Len(t, calls, 2)
		assert.Equal(t, 100*time.Millisecond, calls[1].at.Sub(calls[0].at), "sent at the timeout")
		assert.Equal(t, []string{"1"}, calls[1].md.Get(semconv.PreviousAttemptsKey))
		assert.ErrorIs(t, calls[0].ctx.Err(), context.Canceled, "the loser is cancelled once the retry has answered")
		assert.Equal(t, uint64(1), budgets.For("passthrough:///fake").Stats().Granted, "one token, for the one retry")
	})
}

// The slow attempt's answer, when it comes first, is the call's: the
// per-attempt timeout threw nothing away.
func TestTheSlowAttemptsAnswerWins(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hold := make(chan struct{})
		inv := &invoker{sent: make(chan int, 4), script: func(n int) reply {
			if n == 1 {
				return reply{hold: hold}
			}
			return reply{block: true}
		}}
		ic := interceptor.NewClient(append(noopProviders(),
			interceptor.WithRetryPolicy(interceptor.RetryPolicy{PerAttemptTimeout: 100 * time.Millisecond}))...).Unary()
		cc := dialPassthrough(t)
		done := goCall(func() error {
			return ic(t.Context(), put, &echov1.PutRequest{}, &echov1.PutResponse{}, cc, inv.invoke)
		})
		<-inv.sent // the first attempt
		<-inv.sent // the retry, at the per-attempt timeout
		close(hold)
		require.NoError(t, <-done)
		calls := inv.attempts()
		require.Len(t, calls, 2)
		assert.ErrorIs(t, calls[1].ctx.Err(), context.Canceled, "the retry lost and was cancelled")
	})
}

// A reply that is not a proto message (a custom codec) cannot have two
// attempts in flight: its attempt is cut at the per-attempt timeout, and
// only when a retry may follow. A cut attempt whose retry is then refused
// fails the call with DEADLINE_EXCEEDED, not with the CANCELLED grpc
// reports for the cut. Here WithRetryIf allows the retry when the attempt
// is sent and refuses it once the attempt has been cut; it sees
// DEADLINE_EXCEEDED both times.
func TestACutAttemptFailsWithDeadlineExceeded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		inv := &invoker{script: func(int) reply { return reply{block: true} }}
		var seen []codes.Code
		retryIf := func(_ context.Context, _ string, err error) bool {
			seen = append(seen, status.Code(err))
			return len(seen) == 1
		}
		ic := interceptor.NewClient(append(noopProviders(), interceptor.WithBudget(nil),
			interceptor.WithRetryPolicy(interceptor.RetryPolicy{If: retryIf}), interceptor.WithRetryPolicy(interceptor.RetryPolicy{PerAttemptTimeout: 100 * time.Millisecond}))...).Unary()
		cc := dialPassthrough(t)
		err := ic(t.Context(), put, &echov1.PutRequest{}, new(nonProtoReply), cc, inv.invoke)
		assert.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)
		assert.Len(t, inv.attempts(), 1)
		assert.Equal(t, []codes.Code{codes.DeadlineExceeded, codes.DeadlineExceeded}, seen)
	})
}

// Do no harm: a per-attempt timeout that no retry can follow does not cut
// the attempt short. It keeps running, and its reply, when it comes before
// the call's deadline, is the call's: as with no retries at all. A retry
// refused only once the timeout has passed (an empty budget, a WithRetryIf
// that refuses timeouts) is recorded then, as EventTimeoutKept; when no
// retry could follow from the start (the last attempt, a method not
// marked), nothing happens at the timeout.
func TestPerAttemptTimeoutKeepsAnAttemptNoRetryCanFollow(t *testing.T) {
	cases := []struct {
		name   string
		method string
		opts   []interceptor.ClientOption
		call   []grpc.CallOption
		fires  interceptor.Reason
	}{
		{name: "budget empty", method: put, opts: []interceptor.ClientOption{interceptor.WithBudget(budget.NewRegistry(budgetNoBurst()))}, fires: interceptor.ReasonBudget},
		{name: "last attempt", method: put, call: []grpc.CallOption{interceptor.MaxAttempts(1)}},
		{name: "not idempotent", method: notify},
		{name: "retryIf refuses timeouts", method: put, opts: []interceptor.ClientOption{interceptor.WithRetryPolicy(interceptor.RetryPolicy{If: func(_ context.Context, _ string, err error) bool {
			return status.Code(err) != codes.DeadlineExceeded
		}})}, fires: interceptor.ReasonRetryIf},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				hold := make(chan struct{})
				inv := &invoker{sent: make(chan int, 4), script: func(int) reply { return reply{hold: hold} }}
				refusals := make(chan interceptor.RefusalEvent, 4)
				spans := tracetest.NewInMemoryExporter()
				tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
				opts := []interceptor.ClientOption{
					interceptor.WithRetryPolicy(interceptor.RetryPolicy{PerAttemptTimeout: 100 * time.Millisecond}),
					interceptor.WithTelemetry(interceptor.Telemetry{TracerProvider: tp}),
					interceptor.WithHooks(interceptor.Hooks{OnRefusal: func(e interceptor.RefusalEvent) { refusals <- e }}),
				}
				ic := interceptor.NewClient(append(opts, tc.opts...)...).Unary()
				cc := dialPassthrough(t)
				start := time.Now()
				ctx, cancel := context.WithDeadline(t.Context(), start.Add(10*time.Second))
				defer cancel()
				done := goCall(func() error {
					return ic(ctx, tc.method, &echov1.PutRequest{}, &echov1.PutResponse{}, cc, inv.invoke, tc.call...)
				})
				<-inv.sent
				if tc.fires != "" {
					var e interceptor.RefusalEvent
					select {
					case e = <-refusals: // recorded when the timer fires
					case err := <-done:
						t.Fatalf("the call ended (%v) instead of keeping its attempt", err)
					}
					assert.Equal(t, 100*time.Millisecond, time.Since(start), "recorded at the per-attempt timeout")
					assert.Equal(t, tc.fires, e.Reason)
					assert.Equal(t, semconv.EventTimeoutKept, e.Event)
					assert.Equal(t, 1, e.Attempts)
					assert.NoError(t, e.Err)
				}
				time.Sleep(5 * time.Second) // long past the per-attempt timeout
				synctest.Wait()
				select {
				case e := <-refusals:
					t.Errorf("a refusal not recorded at the per-attempt timeout: %+v", e)
				case err := <-done:
					t.Fatalf("the call ended (%v) instead of keeping its attempt", err)
				default:
				}
				close(hold) // the reply comes
				require.NoError(t, <-done, "the slow reply is the call's")
				assert.Len(t, inv.attempts(), 1)
				require.NoError(t, tp.ForceFlush(t.Context()))
				var kept []string
				for _, s := range spans.GetSpans() {
					for _, ev := range s.Events {
						if ev.Name == semconv.EventTimeoutKept {
							kept = append(kept, attrs(ev.Attributes)[semconv.AttrReason].AsString())
						}
					}
				}
				if tc.fires != "" {
					assert.Equal(t, []string{string(tc.fires)}, kept)
				} else {
					assert.Empty(t, kept)
				}
			})
		})
	}
}

// The same, on a real server and the real clock: the origin takes 300ms to
// answer, the per-attempt timeout is 50ms and the call's deadline 5s.
// Cutting every attempt at 50ms would fail every call; they succeed, as
// they would without retries, with or without a token for a retry.
func TestPerAttemptTimeoutDoesNoHarmOnASlowServer(t *testing.T) {
	for _, tc := range []struct {
		name     string
		budget   interceptor.ClientOption
		attempts int // per call
	}{
		{"no token", interceptor.WithBudget(budget.NewRegistry(budgetNoBurst())), 1},
		{"tokens", interceptor.WithBudget(budget.NewRegistry(budget.Config{})), 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, origin.Sleep(300*time.Millisecond), tc.budget,
				interceptor.WithRetryPolicy(interceptor.RetryPolicy{PerAttemptTimeout: 50 * time.Millisecond}))
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			for i := range 3 {
				_, err := e.echo.Put(ctx, &echov1.PutRequest{RequestId: string(rune('a' + i))})
				require.NoError(t, err)
			}
			assert.LessOrEqual(t, e.origin.Total(), 3*tc.attempts)
			if tc.attempts == 1 {
				assert.Equal(t, 3, e.origin.Total(), "one attempt per call")
			}
		})
	}
}

// nonProtoReply is a reply a custom codec would fill.
type nonProtoReply struct{ Text string }

// A server's "do not retry" to the retry sent beside a slow attempt (a
// stormguard server shedding it, or refusing it on arrival) says that
// attempt was not run: the call does not end with it, no more attempts
// are sent (not even after the slow attempt fails), and the slow
// attempt's answer is the call's.
func TestADoNotRetryBesideASlowAttemptDoesNotEndTheCall(t *testing.T) {
	for _, tc := range []struct {
		code codes.Code // the server's answer to the retry, with pushback -1
		slow error      // the slow attempt's answer
	}{
		{codes.Unavailable, nil},
		{codes.DeadlineExceeded, nil},
		{codes.Unavailable, errUnavailable}, // not retried: the server said so
	} {
		t.Run(fmt.Sprint(tc.code, "/", status.Code(tc.slow)), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				code := tc.code
				hold := make(chan struct{})
				inv := &invoker{sent: make(chan int, 4), script: func(n int) reply {
					if n == 1 {
						return reply{hold: hold, err: tc.slow}
					}
					return reply{err: status.Error(code, "shed"), trailer: metadata.Pairs(semconv.PushbackKey, "-1")}
				}}
				refusals := make(chan interceptor.RefusalEvent, 4)
				ic := interceptor.NewClient(append(noopProviders(),
					interceptor.WithHooks(interceptor.Hooks{OnRefusal: func(e interceptor.RefusalEvent) { refusals <- e }}),
					interceptor.WithRetryPolicy(interceptor.RetryPolicy{PerAttemptTimeout: 100 * time.Millisecond}))...).Unary()
				cc := dialPassthrough(t)
				done := goCall(func() error {
					return ic(t.Context(), put, &echov1.PutRequest{}, &echov1.PutResponse{}, cc, inv.invoke)
				})
				<-inv.sent // the first attempt
				<-inv.sent // the retry, at the per-attempt timeout, refused by the server
				select {
				case err := <-done:
					t.Fatalf("the call ended with the refused retry: %v", err)
				case e := <-refusals:
					assert.Equal(t, interceptor.ReasonPushback, e.Reason)
					assert.Equal(t, semconv.EventRetryRefused, e.Event)
				}
				// No more attempts are armed: a minute later the slow
				// attempt is still the only one, and the call goes on.
				time.Sleep(time.Minute)
				synctest.Wait()
				assert.Len(t, inv.attempts(), 2, "no more attempts are armed")
				select {
				case err := <-done:
					t.Fatalf("the call ended before the slow attempt answered: %v", err)
				default:
				}
				close(hold)
				var err error
				select {
				case err = <-done:
				case <-time.After(10 * time.Second):
					t.Fatal("the call goes on after the slow attempt's answer (a retry waiting on a timer?)")
				}
				assert.Equal(t, status.Code(tc.slow), status.Code(err), "the slow attempt's answer: %v", err)
				assert.Len(t, inv.attempts(), 2)
			})
		})
	}
}

// goCall runs call on its own goroutine and returns what it will return.
func goCall(call func() error) <-chan error {
	done := make(chan error, 1)
	go func() { done <- call() }()
	return done
}
