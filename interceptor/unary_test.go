package interceptor_test

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
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

func TestIdempotentMethodRetriedUntilSuccess(t *testing.T) {
	e := newEnv(t, origin.FailFirst(2, codes.Unavailable), interceptor.WithBudget(nil))
	_, err := e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: "r"})
	require.NoError(t, err)
	assert.Equal(t, 3, e.origin.CountID(put, "r"))
	// Every retry says how many attempts came before it.
	calls := e.origin.Calls()
	require.Len(t, calls, 3)
	assert.Empty(t, calls[0].Metadata.Get(semconv.PreviousAttemptsKey))
	assert.Equal(t, []string{"1"}, calls[1].Metadata.Get(semconv.PreviousAttemptsKey))
	assert.Equal(t, []string{"2"}, calls[2].Metadata.Get(semconv.PreviousAttemptsKey))
}

func TestUnmarkedMethodIsSentOnceWhateverTheOptions(t *testing.T) {
	e := newEnv(t, origin.Always(codes.Unavailable),
		interceptor.WithRetryPolicy(interceptor.RetryPolicy{MaxAttempts: 10}),
		interceptor.WithRetryPolicy(interceptor.RetryPolicy{RetryableCodes: []codes.Code{codes.Unavailable, codes.Internal, codes.Unknown}}),
		interceptor.WithHedging(time.Millisecond, 10),
		interceptor.WithBudget(nil), interceptor.WithBreaker(nil),
	)
	_, err := e.echo.Notify(t.Context(), &echov1.NotifyRequest{RequestId: "n"},
		interceptor.MaxAttempts(10), idempotency.CallKey("caller-key-1"))
	assert.Equal(t, codes.Unavailable, status.Code(err))
	assert.Equal(t, 1, e.origin.CountID(notify, "n"))
	assert.Equal(t, interceptor.Reason(""), interceptor.RefusedBy(err), "not_idempotent is not a refusal the caller can act on")
	// The caller's key is sent, but does not make the method retryable.
	assert.Equal(t, []string{"caller-key-1"}, e.origin.Calls()[0].Metadata.Get(idempotency.MetadataKey))
}

func TestNonRetryableCodeIsReturnedAtOnce(t *testing.T) {
	e := newEnv(t, origin.Always(codes.InvalidArgument))
	_, err := e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: "r"})
	assert.Equal(t, codes.InvalidArgument, status.Code(err))
	assert.Equal(t, 1, e.origin.Total())
}

func TestMaxAttempts(t *testing.T) {
	// Without the breaker: the target serves nothing, and with it no
	// retry would be sent after the fifth failure (TestServedNothing).
	e := newEnv(t, origin.Always(codes.Unavailable), interceptor.WithBudget(nil), interceptor.WithBreaker(nil))
	_, err := e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: "a"})
	assert.Equal(t, codes.Unavailable, status.Code(err))
	assert.Equal(t, 3, e.origin.CountID(put, "a"), "default is 3 attempts in all")

	_, err = e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: "b"}, interceptor.MaxAttempts(1))
	assert.Equal(t, codes.Unavailable, status.Code(err))
	assert.Equal(t, 1, e.origin.CountID(put, "b"), "per-call MaxAttempts(1)")

	_, err = e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: "c"}, interceptor.MaxAttempts(5))
	assert.Equal(t, codes.Unavailable, status.Code(err))
	assert.Equal(t, 5, e.origin.CountID(put, "c"), "per-call MaxAttempts(5)")
}

// A refused retry returns the last attempt's status code and message, the
// message ending with the refusal marker, with an ErrorInfo saying why.
func TestBudgetRefusalKeepsOriginalStatus(t *testing.T) {
	e := newEnv(t, func(c origin.Call) origin.Reply {
		return origin.Reply{Code: codes.Unavailable, Message: "origin down: " + c.RequestID}
	}, interceptor.WithBudget(budget.NewRegistry(budgetNoBurst())))
	_, err := e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: "x"})
	st := status.Convert(err)
	assert.Equal(t, codes.Unavailable, st.Code())
	assert.Equal(t, "origin down: x [stormguard: retry refused: budget #"+interceptor.Seal()+"]", st.Message())
	assert.Equal(t, interceptor.ReasonBudget, interceptor.RefusedBy(err))
	assert.Equal(t, 1, e.origin.Total(), "one deposit at 10% funds no retry and there is no burst")
	var info *errdetails.ErrorInfo
	for _, d := range st.Details() {
		if i, ok := d.(*errdetails.ErrorInfo); ok {
			info = i
		}
	}
	require.NotNil(t, info)
	assert.Equal(t, semconv.ErrorReasonRetryRefused, info.GetReason())
	assert.Equal(t, semconv.ErrorDomain, info.GetDomain())
	assert.Equal(t, "budget", info.GetMetadata()["refused_by"])
}

func TestBreakerOpenFailsFastAndIsNeverRetried(t *testing.T) {
	e := newEnv(t, origin.Always(codes.Unavailable), interceptor.WithBudget(nil),
		interceptor.WithBreaker(&breaker.Config{ConsecutiveFailures: 3, OpenTimeout: time.Minute}))
	_, err := e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: "a"})
	assert.Equal(t, codes.Unavailable, status.Code(err))
	assert.Equal(t, 3, e.origin.Total())

	_, err = e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: "b"})
	st := status.Convert(err)
	assert.Equal(t, codes.Unavailable, st.Code())
	assert.Equal(t, 3, e.origin.Total(), "nothing sent while open")
	assert.Equal(t, interceptor.ReasonBreaker, interceptor.RefusedBy(err))
	var info *errdetails.ErrorInfo
	var retry *errdetails.RetryInfo
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			info = d
		case *errdetails.RetryInfo:
			retry = d
		}
	}
	require.NotNil(t, info)
	assert.Equal(t, semconv.ErrorReasonCircuitOpen, info.GetReason())
	require.NotNil(t, retry)
	assert.Greater(t, retry.GetRetryDelay().AsDuration(), 50*time.Second)
}

func TestBackoffPastDeadlineIsNotSlept(t *testing.T) {
	e := newEnv(t, origin.Always(codes.Unavailable), interceptor.WithBudget(nil),
		interceptor.WithRetryPolicy(interceptor.RetryPolicy{BackoffBase: time.Hour, BackoffMax: time.Hour}))
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	_, err := e.echo.Put(ctx, &echov1.PutRequest{RequestId: "a"})
	assert.Equal(t, codes.Unavailable, status.Code(err), "the last attempt's status, not DeadlineExceeded")
	assert.Equal(t, interceptor.ReasonDeadline, interceptor.RefusedBy(err))
	assert.NoError(t, ctx.Err(), "returned before the deadline")
	assert.Equal(t, 1, e.origin.Total())
}

func TestPushback(t *testing.T) {
	for _, tt := range []struct {
		name     string
		values   []string
		attempts int
		refused  interceptor.Reason
	}{
		{"zero retries at once", []string{"0"}, 3, ""},
		{"positive replaces the backoff", []string{"1"}, 3, ""},
		{"negative stops", []string{"-1"}, 1, interceptor.ReasonPushback},
		{"malformed stops", []string{"soon"}, 1, interceptor.ReasonPushback},
		{"several values stop", []string{"1", "2"}, 1, interceptor.ReasonPushback},
	} {
		t.Run(tt.name, func(t *testing.T) {
			md := metadata.MD{semconv.PushbackKey: tt.values}
			e := newEnv(t, func(origin.Call) origin.Reply {
				return origin.Reply{Code: codes.Unavailable, Trailer: md}
			}, interceptor.WithBudget(nil), interceptor.WithRetryPolicy(interceptor.RetryPolicy{BackoffBase: time.Hour, BackoffMax: time.Hour}))
			var tr metadata.MD
			_, err := e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: "p"}, grpc.Trailer(&tr))
			assert.Equal(t, codes.Unavailable, status.Code(err))
			assert.Equal(t, tt.attempts, e.origin.Total())
			wantRefused := tt.refused
			if wantRefused == "" {
				wantRefused = "" // max attempts: not annotated
			}
			assert.Equal(t, wantRefused, interceptor.RefusedBy(err))
			assert.Equal(t, tt.values, tr.Get(semconv.PushbackKey), "the caller's own Trailer option is filled")
		})
	}
}

func TestDeadlineHeaderOnEveryAttempt(t *testing.T) {
	e := newEnv(t, origin.FailFirst(2, codes.Unavailable), interceptor.WithBudget(nil), interceptor.WithRetryPolicy(interceptor.RetryPolicy{BackoffBase: 20 * time.Millisecond, BackoffMax: 20 * time.Millisecond}))
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, err := e.echo.Put(ctx, &echov1.PutRequest{RequestId: "d"})
	require.NoError(t, err)
	calls := e.origin.Calls()
	require.Len(t, calls, 3)
	var sent []time.Duration
	for _, c := range calls {
		vs := c.Metadata.Get(deadline.MetadataKey)
		require.Len(t, vs, 1)
		d, ok := deadline.ParseHeader(vs[0])
		require.True(t, ok)
		assert.LessOrEqual(t, d, 10*time.Second)
		sent = append(sent, d)
	}
	// Each retry sends the time actually left: at least the backoff less.
	assert.Less(t, sent[1], sent[0]-5*time.Millisecond)
	assert.Less(t, sent[2], sent[1]-5*time.Millisecond)
}

func TestRetryWithKeySendsOneKeyOnEveryAttempt(t *testing.T) {
	e := newEnv(t, origin.FailFirst(2, codes.Unavailable), interceptor.WithBudget(nil))
	_, err := e.echo.Charge(t.Context(), &echov1.ChargeRequest{RequestId: "c", Account: "a", AmountCents: 1})
	require.NoError(t, err)
	calls := e.origin.Calls()
	require.Len(t, calls, 3)
	key := calls[0].Metadata.Get(idempotency.MetadataKey)
	require.Len(t, key, 1)
	require.NoError(t, idempotency.ValidateKey(key[0]))
	assert.Len(t, key[0], 36, "UUID text form")
	for _, c := range calls[1:] {
		assert.Equal(t, key, c.Metadata.Get(idempotency.MetadataKey))
	}
	// A new logical call gets a new key.
	_, err = e.echo.Charge(t.Context(), &echov1.ChargeRequest{RequestId: "c2", Account: "a", AmountCents: 1})
	require.NoError(t, err)
	next := e.origin.Calls()[3].Metadata.Get(idempotency.MetadataKey)
	assert.NotEqual(t, key, next)

	// The caller's own key wins, from the context or a CallOption.
	ctx := idempotency.WithKey(t.Context(), "order-42")
	_, err = e.echo.Charge(ctx, &echov1.ChargeRequest{RequestId: "c3"})
	require.NoError(t, err)
	for _, c := range e.origin.Calls()[6:] {
		assert.Equal(t, []string{"order-42"}, c.Metadata.Get(idempotency.MetadataKey))
	}
	// An invalid caller key fails before anything is sent.
	before := e.origin.Total()
	_, err = e.echo.Charge(t.Context(), &echov1.ChargeRequest{RequestId: "c4"}, idempotency.CallKey("bad key\n"))
	assert.Equal(t, codes.InvalidArgument, status.Code(err))
	assert.Equal(t, before, e.origin.Total())
}

func TestRetryWithKeyWithoutKeyIsSentOnce(t *testing.T) {
	e := newEnv(t, origin.Always(codes.Unavailable), interceptor.WithBudget(nil), interceptor.WithoutIdempotencyKeys())
	_, err := e.echo.Charge(t.Context(), &echov1.ChargeRequest{RequestId: "c"})
	assert.Equal(t, codes.Unavailable, status.Code(err))
	assert.Equal(t, 1, e.origin.Total())
	assert.Empty(t, e.origin.Calls()[0].Metadata.Get(idempotency.MetadataKey))
}

func TestUnmarkedMethodsGetNoKey(t *testing.T) {
	e := newEnv(t, nil)
	_, err := e.echo.Notify(t.Context(), &echov1.NotifyRequest{RequestId: "n"})
	require.NoError(t, err)
	_, err = e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: "p"})
	require.NoError(t, err)
	for _, c := range e.origin.Calls() {
		assert.Empty(t, c.Metadata.Get(idempotency.MetadataKey), c.Method)
	}
}

func TestWithIdempotentOverride(t *testing.T) {
	e := newEnv(t, origin.FailFirst(1, codes.Unavailable), interceptor.WithIdempotent(notify))
	_, err := e.echo.Notify(t.Context(), &echov1.NotifyRequest{RequestId: "n"})
	require.NoError(t, err)
	assert.Equal(t, 2, e.origin.Total())
}

func TestRetryableCodesOption(t *testing.T) {
	e := newEnv(t, origin.FailFirst(1, codes.ResourceExhausted), interceptor.WithRetryPolicy(interceptor.RetryPolicy{RetryableCodes: []codes.Code{codes.ResourceExhausted}}))
	_, err := e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: "r"})
	require.NoError(t, err)
	assert.Equal(t, 2, e.origin.Total())
}

func TestCallerCancelIsNotABreakerFailure(t *testing.T) {
	e := newEnv(t, origin.Sleep(time.Hour), interceptor.WithBreaker(&breaker.Config{ConsecutiveFailures: 1}))
	for i := range 3 {
		ctx, cancel := context.WithCancel(t.Context())
		go func() {
			// Cancel once the attempt has reached the origin.
			for e.origin.Total() <= i {
				time.Sleep(time.Millisecond)
			}
			cancel()
		}()
		_, err := e.echo.Put(ctx, &echov1.PutRequest{RequestId: strconv.Itoa(i)})
		assert.Equal(t, codes.Canceled, status.Code(err))
	}
	ts := e.guard.Targets()
	require.Len(t, ts, 1)
	require.Len(t, ts[0].Breakers, 1)
	assert.Equal(t, breaker.StateClosed.String(), ts[0].Breakers[0].State)
}

func TestDeadlineFailFast(t *testing.T) {
	e := newEnv(t, nil, interceptor.WithDeadline(deadline.ClientConfig{MinRemaining: time.Hour}))
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	_, err := e.echo.Put(ctx, &echov1.PutRequest{RequestId: "x"})
	assert.Equal(t, codes.DeadlineExceeded, status.Code(err))
	assert.Equal(t, 0, e.origin.Total())
}

func TestBudgetsAreSharedPerTargetAcrossConns(t *testing.T) {
	reg := budget.NewRegistry(budget.Config{})
	guard := interceptor.NewClient(interceptor.WithBudget(reg), fast)
	o := origin.New(nil)
	l := origin.Bufconn()
	srv := origin.Serve(l, o)
	defer srv.Stop()
	for range 2 {
		cc, err := l.Dial(grpc.WithChainUnaryInterceptor(guard.Unary()))
		require.NoError(t, err)
		for i := range 5 {
			_, err := echov1.NewEchoServiceClient(cc).Get(t.Context(), &echov1.GetRequest{RequestId: fmt.Sprint(i)})
			require.NoError(t, err)
		}
		cc.Close()
	}
	assert.Equal(t, uint64(10), reg.For(l.Target).Stats().Requests)
}

// go-grpc-middleware's tests call interceptors with a nil ClientConn; the
// suite treats it as an empty target.
func TestNilClientConn(t *testing.T) {
	c := interceptor.NewClient(noopProviders()...)
	inv := &invoker{script: failFirstN(1)}
	err := c.Unary()(t.Context(), put, &echov1.PutRequest{}, &echov1.PutResponse{}, nil, inv.invoke)
	require.NoError(t, err)
	assert.Len(t, inv.attempts(), 2)
	s, err := c.Stream()(t.Context(), &grpc.StreamDesc{ServerStreams: true}, nil, list,
		func(ctx context.Context, _ *grpc.StreamDesc, _ *grpc.ClientConn, _ string, _ ...grpc.CallOption) (grpc.ClientStream, error) {
			fs := newFakeStream(ctx)
			fs.recv <- io.EOF
			return fs, nil
		})
	require.NoError(t, err)
	assert.ErrorIs(t, s.RecvMsg(&echov1.ListResponse{}), io.EOF)
}
