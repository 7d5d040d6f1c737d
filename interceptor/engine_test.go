package interceptor_test

import (
	"context"
	"fmt"
	"io"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/semconv"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/deadline"
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/interceptor"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

var errUnavailable = status.Error(codes.Unavailable, "scripted: unavailable")

func failFirstN(n int) func(int) reply {
	return func(i int) reply {
		if i <= n {
			return reply{err: errUnavailable}
		}
		return reply{}
	}
}

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

// Issue 13 item 12: go-grpc-middleware's tests call interceptors with a nil
// ClientConn; the suite treats it as an empty target.
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

// Issue 13 item 13: key.go says a *KeyCallOption works too.
func TestKeyCallOptionByPointer(t *testing.T) {
	inv := &invoker{script: failFirstN(0)}
	ic := interceptor.NewClient(noopProviders()...).Unary()
	cc := dialPassthrough(t)
	require.NoError(t, ic(t.Context(), charge, &echov1.ChargeRequest{}, &echov1.ChargeResponse{}, cc, inv.invoke,
		&idempotency.KeyCallOption{Key: "order-42"}))
	assert.Equal(t, []string{"order-42"}, inv.attempts()[0].md.Get(idempotency.MetadataKey))
}

// The deadline header is written by the attempt's call credentials, from
// the time left when grpc builds the headers; no metadata is added to the
// context on the success path.
func TestDeadlineHeaderFromCallCredentials(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		inv := &invoker{script: failFirstN(0)}
		ic := interceptor.NewClient(noopProviders()...).Unary()
		cc := dialPassthrough(t)
		ctx, cancel := context.WithDeadline(t.Context(), time.Now().Add(2*time.Second))
		defer cancel()
		require.NoError(t, ic(ctx, put, &echov1.PutRequest{}, &echov1.PutResponse{}, cc, inv.invoke))
		a := inv.attempts()[0]
		require.True(t, a.hasCreds)
		ms := deadline.DefaultMargin.Milliseconds()
		assert.Equal(t, fmt.Sprint(2000-ms), a.header, "2 s less the default margin (no time passes in the bubble)")
		assert.Empty(t, a.md.Get(deadline.MetadataKey))
	})
}

// Issue 13 item 8: a message sent while a stream switches attempts is not
// lost. The test pauses between the new attempt's replay and its
// installation, and sends meanwhile: that message must reach the new
// attempt (it was lost when the two steps were apart: the send went to the
// dead attempt, got io.EOF, and SendMsg reported success).
func TestStreamSendDuringReplayIsNotLost(t *testing.T) {
	s, attempt := retriedChat(t)
	for seq := range 2 {
		require.NoError(t, s.SendMsg(&echov1.ChatRequest{Seq: uint32(seq)}))
	}
	sent := make(chan error, 1)
	recvDone := failFirstAttemptDuring(t, s, attempt, func() { sent <- s.SendMsg(&echov1.ChatRequest{Seq: 2}) })
	require.NoError(t, <-sent)
	var seqs []uint32
	for _, m := range attempt(1).messages() {
		seqs = append(seqs, m.(*echov1.ChatRequest).GetSeq())
	}
	assert.Equal(t, []uint32{0, 1, 2}, seqs, "every message reached the attempt that carries on")
	attempt(1).recv <- io.EOF
	assert.ErrorIs(t, <-recvDone, io.EOF)
}

// Issue 13 item 8, CloseSend: a CloseSend made while a retried stream
// replays reaches the attempt that carries on (it went to the dead one).
func TestStreamCloseSendDuringReplayIsNotLost(t *testing.T) {
	s, attempt := retriedChat(t)
	require.NoError(t, s.SendMsg(&echov1.ChatRequest{Seq: 0}))
	closed := make(chan error, 1)
	recvDone := failFirstAttemptDuring(t, s, attempt, func() { closed <- s.CloseSend() })
	require.NoError(t, <-closed)
	assert.Len(t, attempt(1).messages(), 1, "the message was replayed")
	assert.True(t, attempt(1).isClosed(), "the attempt that carries on was closed for sending")
	attempt(1).recv <- io.EOF
	assert.ErrorIs(t, <-recvDone, io.EOF)
}

// retriedChat opens a Chat stream through a Client that retries at once,
// on a fake streamer; attempt(i) is the stream's i-th attempt.
func retriedChat(t *testing.T) (grpc.ClientStream, func(i int) *fakeStream) {
	var mu sync.Mutex
	var attempts []*fakeStream
	streamer := func(actx context.Context, _ *grpc.StreamDesc, _ *grpc.ClientConn, _ string, _ ...grpc.CallOption) (grpc.ClientStream, error) {
		fs := newFakeStream(actx)
		mu.Lock()
		attempts = append(attempts, fs)
		mu.Unlock()
		return fs, nil
	}
	attempt := func(i int) *fakeStream {
		mu.Lock()
		defer mu.Unlock()
		return attempts[i]
	}
	c := interceptor.NewClient(append(noopProviders(), interceptor.WithBudget(nil), interceptor.WithRetryPolicy(interceptor.RetryPolicy{BackoffBase: time.Microsecond, BackoffMax: time.Microsecond}))...)
	s, err := c.Stream()(t.Context(), &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, dialPassthrough(t), chat, streamer)
	require.NoError(t, err)
	return s, attempt
}

// failFirstAttemptDuring fails s's first attempt before any response and
// runs during, on its own goroutine, in the gap between the new attempt's
// replay and its installation (with a pause for it to happen in). It
// returns what the RecvMsg that retried will return.
func failFirstAttemptDuring(t *testing.T, s grpc.ClientStream, attempt func(int) *fakeStream, during func()) <-chan error {
	interceptor.SetReplayedHook(func() {
		go during()
		time.Sleep(20 * time.Millisecond)
	})
	t.Cleanup(func() { interceptor.SetReplayedHook(nil) })
	attempt(0).recv <- errUnavailable
	recvDone := make(chan error, 1)
	go func() { recvDone <- s.RecvMsg(&echov1.ChatResponse{}) }()
	return recvDone
}
