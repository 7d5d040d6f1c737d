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

	"github.com/stormguard/stormguard/semconv"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/deadline"
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/dedupe"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
	"github.com/stormguard/stormguard/overload"
)

// guarded serves svc over bufconn behind interceptor.NewServer(opts...)
// and returns a plain grpc client of it (no retries), its connection and
// the Server. Both are closed by t's cleanup (inside the synctest bubble,
// if it was called in one).
func guarded(t *testing.T, svc origin.Registerer, opts ...interceptor.ServerOption) (echov1.EchoServiceClient, *grpc.ClientConn, *interceptor.Server) {
	t.Helper()
	s := interceptor.NewServer(opts...)
	l := origin.Bufconn()
	srv := origin.Serve(l, svc, grpc.ChainUnaryInterceptor(s.Unary()), grpc.ChainStreamInterceptor(s.Stream()))
	cc, err := l.Dial()
	require.NoError(t, err)
	t.Cleanup(func() { cc.Close(); srv.Stop() })
	return echov1.NewEchoServiceClient(cc), cc, s
}

// blocking is an origin script that holds every attempt until release is
// closed, and signals each arrival on arrived.
func blocking(release <-chan struct{}, arrived chan<- struct{}) origin.Script {
	return func(origin.Call) origin.Reply {
		arrived <- struct{}{}
		<-release
		return origin.Reply{}
	}
}

// errorInfo returns the stormguard ErrorInfo of err, if any.
func errorInfo(err error) *errdetails.ErrorInfo {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == semconv.ErrorDomain {
			return info
		}
	}
	return nil
}

func retryCtx(ctx context.Context, previous int) context.Context {
	return metadata.AppendToOutgoingContext(ctx, semconv.PreviousAttemptsKey, strconv.Itoa(previous))
}

// TestServerShedsRetriesBeforeFirstAttempts: at a limit of 4 in flight,
// retries are shed from 2 on (RetryShare 0.5) with "do not retry", first
// attempts only at 4, with a pushback that says when to retry.
func TestServerShedsRetriesBeforeFirstAttempts(t *testing.T) {
	release, arrived := make(chan struct{}), make(chan struct{}, 16)
	o := origin.New(blocking(release, arrived))
	echo, _, s := guarded(t, o, interceptor.WithOverload(overload.New(overload.Config{
		NoAdmission: true, NoAdaptive: true, MaxConcurrency: 4, RetryAfter: 250 * time.Millisecond,
	})))
	// Calls that should be refused at once get a deadline, so that a
	// regression fails the test instead of hanging it.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	hold := func(c context.Context, id string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := echo.Put(c, &echov1.PutRequest{RequestId: id})
			assert.NoError(t, err, id)
		}()
		<-arrived
	}
	defer wg.Wait()
	defer close(release)

	// Two in flight, one of them a retry: both admitted.
	hold(ctx, "a")
	hold(retryCtx(ctx, 1), "b")

	// A retry and a hedge now are shed, and told not to retry.
	for _, previous := range []int{1, 2} {
		var tr metadata.MD
		_, err := echo.Put(retryCtx(ctx, previous), &echov1.PutRequest{RequestId: "r"}, grpc.Trailer(&tr))
		require.Equal(t, codes.Unavailable, status.Code(err), "retry with %d previous attempts", previous)
		info := errorInfo(err)
		require.NotNil(t, info)
		assert.Equal(t, semconv.ErrorReasonOverloaded, info.GetReason())
		assert.Equal(t, "retry", info.GetMetadata()["attempt"])
		assert.Equal(t, []string{"-1"}, tr.Get(semconv.PushbackKey))
	}
	// A malformed attempt count is no way to jump the queue.
	var tr metadata.MD
	_, err := echo.Put(metadata.AppendToOutgoingContext(ctx, semconv.PreviousAttemptsKey, "zero"), &echov1.PutRequest{RequestId: "m"}, grpc.Trailer(&tr))
	require.Equal(t, codes.Unavailable, status.Code(err))

	// First attempts are still admitted, up to 4.
	hold(ctx, "c")
	hold(metadata.AppendToOutgoingContext(ctx, semconv.PreviousAttemptsKey, "0"), "d")

	// At 4, a first attempt is shed too, with a pushback of 250ms.
	tr = nil
	_, err = echo.Put(ctx, &echov1.PutRequest{RequestId: "e"}, grpc.Trailer(&tr))
	require.Equal(t, codes.Unavailable, status.Code(err))
	info := errorInfo(err)
	require.NotNil(t, info)
	assert.Equal(t, semconv.ErrorReasonOverloaded, info.GetReason())
	assert.Equal(t, "first", info.GetMetadata()["attempt"])
	assert.Equal(t, []string{"250"}, tr.Get(semconv.PushbackKey))

	// The origin saw only what was admitted; the shed ones never reached it.
	assert.Equal(t, 4, o.Total())
	st := interceptor.OverloadOf(s).Stats()
	assert.Equal(t, overload.Stats{Admitted: 4, ShedRetry: 3, ShedFirst: 1}, st)

	// Streams are not guarded: a stream reaches its handler at the limit.
	stream, err := echo.List(ctx, &echov1.ListRequest{RequestId: "l", Count: 1})
	require.NoError(t, err)
	recvErr := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, err := stream.Recv()
		recvErr <- err
	}()
	select {
	case <-arrived:
	case err := <-recvErr:
		t.Fatalf("the stream ended before reaching its handler: %v", err)
	}
}

// trainedGuard returns a Guard trained, at explicit times up to now, with
// the history of /echo.v1.EchoService/Put showing a standing queue: 100 in
// flight, one ending every 50ms, so that a request needs about 5s.
func trainedGuard(t *testing.T, now time.Time) *overload.Guard {
	t.Helper()
	clock := now.Add(-7 * time.Second) // 5s to fill the queue, 2s of standing queue
	g := overload.New(overload.Config{NoShedding: true, MinSamples: 5})
	m := g.Method(echov1.EchoService_Put_FullMethodName)
	var open []overload.Ticket
	admit := func() {
		tk, d := m.AdmitAt(clock, overload.Request{Deadline: clock.Add(time.Hour)})
		require.Equal(t, overload.Admitted, d.Reason)
		open = append(open, tk)
	}
	for range 100 {
		admit()
	}
	for clock.Before(now) {
		clock = clock.Add(50 * time.Millisecond)
		open[0].DoneAt(clock)
		open = open[1:]
		admit()
	}
	need, ok := m.NeedAt(now)
	require.True(t, ok)
	require.InDelta(t, 5*time.Second, need, float64(time.Second), "need %v", need)
	return g
}

// TestServerRefusesDoomedWork: with less time left than the method needs
// now, a call is refused on arrival (DeadlineExceeded, ErrorInfo
// DEADLINE_TOO_SHORT, grpc-retry-pushback-ms -1) and the handler does not
// run; with enough time left it runs.
func TestServerRefusesDoomedWork(t *testing.T) {
	// In a synctest bubble, so that the Guard's clock stands still at now
	// while the calls are made.
	synctest.Test(t, func(t *testing.T) {
		now := time.Now()
		g := trainedGuard(t, now)
		o := origin.New(origin.Succeed())
		echo, _, s := guarded(t, o, interceptor.WithOverload(g))
		require.Same(t, g, interceptor.OverloadOf(s))

		ctx, cancel := context.WithDeadline(t.Context(), now.Add(2*time.Second))
		defer cancel()
		var tr metadata.MD
		_, err := echo.Put(ctx, &echov1.PutRequest{RequestId: "short"}, grpc.Trailer(&tr))
		require.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)
		info := errorInfo(err)
		require.NotNil(t, info)
		assert.Equal(t, semconv.ErrorReasonDeadlineTooShort, info.GetReason())
		assert.Equal(t, []string{"-1"}, tr.Get(semconv.PushbackKey))
		assert.Equal(t, 0, o.Total(), "the handler ran")

		ctx2, cancel2 := context.WithDeadline(t.Context(), now.Add(20*time.Second))
		defer cancel2()
		_, err = echo.Put(ctx2, &echov1.PutRequest{RequestId: "long"})
		require.NoError(t, err)
		_, err = echo.Put(t.Context(), &echov1.PutRequest{RequestId: "none"})
		require.NoError(t, err, "a call without a deadline is never refused for it")
		assert.Equal(t, 2, o.Total())
		assert.EqualValues(t, 1, g.Stats().RefusedDeadline)
	})
}

// TestSuiteClientObeysTheServersPushback: the suite's client retries a shed
// first attempt after the server's pushback, and stops when its retry is
// shed too ("do not retry"), whatever its attempt limit.
func TestSuiteClientObeysTheServersPushback(t *testing.T) {
	release, arrived := make(chan struct{}), make(chan struct{}, 4)
	o := origin.New(blocking(release, arrived))
	s := interceptor.NewServer(interceptor.WithOverload(overload.New(overload.Config{
		NoAdmission: true, NoAdaptive: true, MaxConcurrency: 1, RetryAfter: time.Millisecond,
	})))
	l := origin.Bufconn()
	srv := origin.Serve(l, o, grpc.ChainUnaryInterceptor(s.Unary()))
	client := interceptor.NewClient(fast, interceptor.WithRetryPolicy(interceptor.RetryPolicy{MaxAttempts: 5}), interceptor.WithBreaker(nil))
	cc, err := l.Dial(grpc.WithChainUnaryInterceptor(client.Unary()))
	require.NoError(t, err)
	defer func() { cc.Close(); srv.Stop() }()
	echo := echov1.NewEchoServiceClient(cc)

	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, err := echo.Put(t.Context(), &echov1.PutRequest{RequestId: "holder"})
		assert.NoError(t, err)
	}()
	<-arrived
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second) // fail, not hang, on a regression
	defer cancel()
	_, err = echo.Put(ctx, &echov1.PutRequest{RequestId: "late"})
	require.Equal(t, codes.Unavailable, status.Code(err))
	assert.Equal(t, interceptor.ReasonPushback, interceptor.RefusedBy(err))
	close(release)
	wg.Wait()
	assert.Equal(t, overload.Stats{Admitted: 1, ShedFirst: 1, ShedRetry: 1}, interceptor.OverloadOf(s).Stats(),
		"one shed first attempt, one shed retry, then the client stopped")
	assert.Equal(t, 1, o.Total())
}

// TestServerRefusesNothingWhenNotOverloaded: a server with the default
// protection, called far below its capacity (8 callers, 1ms handlers) with
// deadlines from 20ms to 2s, retries and hedges among the calls, sheds
// nothing and refuses no call, not even one with 20ms to go. It runs in a
// bubble: on real time a loaded machine's stalls made the 200ms calls run
// out of time before the handler was done.
func TestServerRefusesNothingWhenNotOverloaded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := origin.New(origin.Sleep(time.Millisecond))
		echo, _, s := guarded(t, o)
		require.NotNil(t, interceptor.OverloadOf(s), "on by default")
		var wg sync.WaitGroup
		var tight, late atomic.Int64 // 20ms calls refused on arrival; that ran out of time
		for w := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 150 {
					ctx := t.Context()
					if i%4 == 1 {
						ctx = retryCtx(ctx, 1+i%3)
					}
					timeout := []time.Duration{20 * time.Millisecond, 200 * time.Millisecond, 2 * time.Second}[i%3]
					ctx, cancel := context.WithTimeout(ctx, timeout)
					_, err := echo.Put(ctx, &echov1.PutRequest{RequestId: strconv.Itoa(w*1000 + i)})
					cancel()
					refused := errorInfo(err).GetReason() == semconv.ErrorReasonDeadlineTooShort
					switch {
					case timeout == 20*time.Millisecond && refused:
						tight.Add(1)
					case timeout == 20*time.Millisecond && status.Code(err) == codes.DeadlineExceeded:
						late.Add(1) // before or after it reached the server
					default:
						assert.NoError(t, err, "deadline %v", timeout)
					}
				}
			}()
		}
		wg.Wait()
		st := interceptor.OverloadOf(s).Stats()
		t.Logf("overload stats %+v; 20ms calls refused on arrival: %d, out of time: %d", st, tight.Load(), late.Load())
		assert.Zero(t, st.ShedRetry+st.ShedFirst, "shed: %+v", st)
		assert.EqualValues(t, tight.Load(), st.RefusedDeadline, "refused on arrival: only 20ms calls")
		assert.Zero(t, tight.Load(), "no 20ms call refused on arrival")
		assert.Zero(t, late.Load(), "no 20ms call out of time")
		reached := int64(st.Admitted + st.RefusedDeadline)
		assert.LessOrEqual(t, reached, int64(1200))
		assert.GreaterOrEqual(t, reached, 1200-late.Load(), "every call but those that ran out of time reached admission")
	})
}

func TestWithoutOverload(t *testing.T) {
	_, _, s := guarded(t, origin.New(nil), interceptor.WithOverload(nil))
	assert.Nil(t, interceptor.OverloadOf(s), "nil turns it off")
	_, _, s = guarded(t, origin.New(nil))
	assert.NotNil(t, interceptor.OverloadOf(s), "on by default")
}

// TestServerLearnsFromWhatTheMethodNeeds: calls that fail on their own
// (at once, like a full pool's "busy") teach the overload protection
// nothing; calls that succeed, or run out of their deadline, do.
func TestServerLearnsFromWhatTheMethodNeeds(t *testing.T) {
	// In a synctest bubble, so that the Guard's clock moves only when the
	// test says.
	synctest.Test(t, func(t *testing.T) {
		fail := true
		var mu sync.Mutex
		o := origin.New(func(origin.Call) origin.Reply {
			mu.Lock()
			defer mu.Unlock()
			if fail {
				return origin.Reply{Code: codes.Unavailable, Message: "busy"}
			}
			return origin.Reply{}
		})
		tick := func() { time.Sleep(100 * time.Millisecond) } // on the bubble's clock
		echo, _, s := guarded(t, o, interceptor.WithOverload(overload.New(overload.Config{})))
		m := interceptor.OverloadOf(s).Method(echov1.EchoService_Put_FullMethodName)
		for i := range 30 {
			_, err := echo.Put(t.Context(), &echov1.PutRequest{RequestId: strconv.Itoa(i)})
			require.Equal(t, codes.Unavailable, status.Code(err))
		}
		tick()
		_, learned := m.Need()
		assert.False(t, learned, "30 fast failures were learned")
		mu.Lock()
		fail = false
		mu.Unlock()
		for i := range 30 {
			_, err := echo.Put(t.Context(), &echov1.PutRequest{RequestId: strconv.Itoa(100 + i)})
			require.NoError(t, err)
		}
		tick()
		_, learned = m.Need()
		assert.True(t, learned, "30 successes were not learned")
		assert.Zero(t, m.Inflight())
	})
}

// The tests below run in a synctest bubble: real gRPC over bufconn, real
// handlers that sleep, real deadlines and cancellations, on the bubble's
// fake clock (time advances only when every goroutine waits), which the
// Guard reads through time.Now.

// bubbleServe is guarded, inside the current synctest bubble, without the
// connection.
func bubbleServe(t *testing.T, svc origin.Registerer, opts ...interceptor.ServerOption) (echov1.EchoServiceClient, *interceptor.Server) {
	t.Helper()
	c, _, s := guarded(t, svc, opts...)
	return c, s
}

// tally counts the outcomes of calls.
type tally struct{ ok, failed atomic.Int64 }

func (tl *tally) record(err error) {
	if err == nil {
		tl.ok.Add(1)
	} else {
		tl.failed.Add(1)
	}
}

// closedLoop runs n callers until end: each sends a call with send(w, i),
// records its outcome in the tally that tl returns when the call is sent,
// and thinks 20 to 36 ms (varied per caller and call, so that the callers
// drift apart) before its next call. wg counts them.
func closedLoop(wg *sync.WaitGroup, n int, end time.Time, tl func() *tally, send func(w, i int) error) {
	for w := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Now().Before(end); i++ {
				into := tl()
				into.record(send(w, i))
				time.Sleep(20*time.Millisecond + time.Duration((w*7+i*13)%17)*time.Millisecond)
			}
		}()
	}
}

// watchLimit samples m's adaptive limit every millisecond until end and
// returns the largest it saw (-1: never engaged).
func watchLimit(wg *sync.WaitGroup, m *overload.Method, end time.Time) *atomic.Int64 {
	most := &atomic.Int64{}
	most.Store(-1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for time.Now().Before(end) {
			if l := m.Limit(); l > most.Load() {
				most.Store(l)
			}
			time.Sleep(time.Millisecond)
		}
	}()
	return most
}

// TestServerCancelledCallsTeachTheLimiterNothing: 500 calls cancelled 1 ms
// after they were sent end long before the 5 ms their handler needs; a
// cancelled call proves at most that the method takes longer than that.
// Honest callers without a deadline, at a load the server keeps up with,
// lose no call, and no limit engages.
func TestServerCancelledCallsTeachTheLimiterNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		echo, s := bubbleServe(t, origin.New(origin.Sleep(5*time.Millisecond)))
		m := interceptor.OverloadOf(s).Method(echov1.EchoService_Put_FullMethodName)
		end := time.Now().Add(5 * time.Second)
		var wg sync.WaitGroup
		var honest, cancelled tally
		closedLoop(&wg, 8, end, func() *tally { return &honest }, func(w, i int) error {
			_, err := echo.Put(t.Context(), &echov1.PutRequest{RequestId: fmt.Sprint("h", w, "-", i)})
			return err
		})
		most := watchLimit(&wg, m, end)
		for i := range 500 { // one every 5 ms, from the start
			ctx, cancel := context.WithCancel(t.Context())
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := echo.Put(ctx, &echov1.PutRequest{RequestId: fmt.Sprint("c", i)})
				cancelled.record(err)
			}()
			time.Sleep(time.Millisecond)
			cancel()
			time.Sleep(4 * time.Millisecond)
		}
		wg.Wait()
		st := interceptor.OverloadOf(s).Stats()
		t.Logf("honest: %d ok, %d failed; cancelled calls: %d failed; largest limit %d; %+v",
			honest.ok.Load(), honest.failed.Load(), cancelled.failed.Load(), most.Load(), st)
		require.EqualValues(t, 500, cancelled.failed.Load())
		assert.Zero(t, honest.failed.Load(), "honest calls refused")
		assert.EqualValues(t, -1, most.Load(), "a limit engaged on a server that keeps up")
		assert.Zero(t, st.ShedFirst+st.ShedRetry+st.RefusedDeadline)
	})
}

// TestServerRefusesNoFirstAttemptOfASlowerDependency: the method's
// handler takes 2 ms for 3 s, then 10 ms (a dependency five times slower)
// for 7 s, under the same load from callers without a deadline, which the
// server keeps up with: nothing queues, every call is served. A server
// that keeps up refuses no first attempt, however slow it is.
func TestServerRefusesNoFirstAttemptOfASlowerDependency(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := origin.New(origin.Sleep(2 * time.Millisecond))
		echo, s := bubbleServe(t, o)
		m := interceptor.OverloadOf(s).Method(echov1.EchoService_Put_FullMethodName)
		start := time.Now()
		end := start.Add(10 * time.Second)
		var wg sync.WaitGroup
		var before, after tally
		slower := func() *tally {
			if time.Since(start) < 3*time.Second {
				return &before
			}
			return &after
		}
		closedLoop(&wg, 8, end, slower, func(w, i int) error {
			_, err := echo.Put(t.Context(), &echov1.PutRequest{RequestId: fmt.Sprint(w, "-", i)})
			return err
		})
		most := watchLimit(&wg, m, end)
		time.Sleep(3 * time.Second)
		o.SetScript(origin.Sleep(10 * time.Millisecond))
		wg.Wait()
		st := interceptor.OverloadOf(s).Stats()
		t.Logf("2 ms: %d ok, %d failed; 10 ms: %d ok, %d failed; largest limit %d; %+v",
			before.ok.Load(), before.failed.Load(), after.ok.Load(), after.failed.Load(), most.Load(), st)
		assert.Zero(t, before.failed.Load()+after.failed.Load(), "first attempts refused")
		assert.Zero(t, st.ShedFirst+st.ShedRetry+st.RefusedDeadline)
		assert.EqualValues(t, -1, most.Load(), "a limit engaged on a server that keeps up")
	})
}

// TestServerAnswersAKeyedRetryFromTheStoreBeforeAdmission: a keyed retry
// of a write that already succeeded is answered from the dedupe store
// even when the server sheds everything else, and a duplicate that
// arrives while the original runs waits for its outcome instead of being
// shed. Neither is admitted: a replay is no work, and teaches the overload
// protection nothing. (In a synctest bubble, so that "the duplicate has
// not been answered" means every goroutine is waiting.)
func TestServerAnswersAKeyedRetryFromTheStoreBeforeAdmission(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release, arrived := make(chan struct{}), make(chan string, 4)
		o := origin.New(func(c origin.Call) origin.Reply {
			if c.RequestID != "quick" {
				arrived <- c.RequestID
				<-release
			}
			return origin.Reply{}
		})
		echo, _, s := guarded(t, o,
			interceptor.WithOverload(overload.New(overload.Config{NoAdmission: true, NoAdaptive: true, MaxConcurrency: 1})),
			interceptor.WithDedupe(dedupe.NewServer(dedupe.Config{AllowAnonymous: true})))
		ctx := t.Context()
		charge := func(ctx context.Context, key, id, account string) (*echov1.ChargeResponse, error) {
			var tr metadata.MD
			resp, err := echo.Charge(metadata.AppendToOutgoingContext(ctx, idempotency.MetadataKey, key),
				&echov1.ChargeRequest{RequestId: id, Account: account, AmountCents: 100}, grpc.Trailer(&tr))
			if err != nil {
				t.Logf("%s: %v, pushback %v", key, err, tr.Get(semconv.PushbackKey))
			}
			return resp, err
		}
		var wg sync.WaitGroup
		defer wg.Wait()

		// A charge completes, and its outcome is stored.
		first, err := charge(ctx, "k1", "quick", "a")
		require.NoError(t, err)

		// Another call holds the server's one place.
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := echo.Put(ctx, &echov1.PutRequest{RequestId: "hold"})
			assert.NoError(t, err)
		}()
		require.Equal(t, "hold", <-arrived)

		// The charge's retry, marked as one or not, is answered from the
		// store.
		for _, c := range []context.Context{retryCtx(ctx, 1), ctx} {
			again, err := charge(c, "k1", "quick", "a")
			if assert.NoError(t, err, "a retry of a completed write was refused") {
				assert.Equal(t, first.GetChargeId(), again.GetChargeId())
			}
		}
		cents, n := o.Balance("a")
		assert.Equal(t, int64(100), cents)
		assert.Equal(t, 1, n)
		close(release)
		wg.Wait()
		// With the server idle, a replay is still no admitted work.
		again, err := charge(retryCtx(ctx, 1), "k1", "quick", "a")
		require.NoError(t, err)
		assert.Equal(t, first.GetChargeId(), again.GetChargeId())

		// A write still running: its duplicate waits for it, and is not
		// shed.
		release = make(chan struct{})
		orig := make(chan *echov1.ChargeResponse, 1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := charge(ctx, "k2", "slow", "b")
			assert.NoError(t, err)
			orig <- resp
		}()
		require.Equal(t, "slow", <-arrived)
		type answer struct {
			resp *echov1.ChargeResponse
			err  error
		}
		dup := make(chan answer, 1)
		go func() {
			resp, err := charge(retryCtx(ctx, 1), "k2", "slow", "b")
			dup <- answer{resp, err}
		}()
		synctest.Wait() // the duplicate has been answered, or waits
		select {
		case a := <-dup:
			t.Errorf("the duplicate of a write in flight was answered before it ended: %v", a.err)
			close(release)
		default:
			close(release)
			a := <-dup
			if assert.NoError(t, a.err) {
				assert.Equal(t, (<-orig).GetChargeId(), a.resp.GetChargeId())
			}
		}
		wg.Wait()
		_, n = o.Balance("b")
		assert.Equal(t, 1, n)

		assert.Equal(t, overload.Stats{Admitted: 3}, interceptor.OverloadOf(s).Stats(),
			"admitted: the first charge, the holder and the slow charge; nothing else")
	})
}

// pool is an EchoService whose Put has a fixed capacity, as a service with
// a worker pool has: a request waits (first come, first served, or until
// its caller leaves) for one of the pool's places, then works service
// time.
type pool struct {
	echov1.UnimplementedEchoServiceServer
	places  chan struct{}
	service time.Duration
}

func newPool(workers int, service time.Duration) *pool {
	return &pool{places: make(chan struct{}, workers), service: service}
}

func (p *pool) Register(s grpc.ServiceRegistrar) { echov1.RegisterEchoServiceServer(s, p) }

func (p *pool) Put(ctx context.Context, req *echov1.PutRequest) (*echov1.PutResponse, error) {
	select {
	case p.places <- struct{}{}:
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	defer func() { <-p.places }()
	t := time.NewTimer(p.service)
	defer t.Stop()
	select {
	case <-t.C:
		return &echov1.PutResponse{RequestId: req.GetRequestId()}, nil
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// TestServerAForgedDeadlineBuysNothing: a flood of callers without a
// deadline, 120 at a time, against a method of 4 workers × 20 ms; 4
// honest callers with 300 ms deadlines beside it. The same flood claiming
// a deadline it does not have (stormguard-deadline-ms: 9999999999, or a
// grpc-timeout of an hour) gets nothing the flood without one does not:
// the honest callers keep at least what they keep against it.
func TestServerAForgedDeadlineBuysNothing(t *testing.T) {
	floods := []struct {
		name string
		ctx  func(context.Context) (context.Context, context.CancelFunc)
	}{
		{"no deadline", func(ctx context.Context) (context.Context, context.CancelFunc) { return ctx, func() {} }},
		{"header 9999999999", func(ctx context.Context) (context.Context, context.CancelFunc) {
			return metadata.AppendToOutgoingContext(ctx, deadline.MetadataKey, "9999999999"), func() {}
		}},
		{"grpc-timeout 1h", func(ctx context.Context) (context.Context, context.CancelFunc) {
			return context.WithTimeout(ctx, time.Hour)
		}},
	}
	honestOK := make([]int64, len(floods))
	for k, flood := range floods {
		synctest.Test(t, func(t *testing.T) {
			echo, s := bubbleServe(t, newPool(4, 20*time.Millisecond))
			start := time.Now()
			end := start.Add(6 * time.Second)
			var wg sync.WaitGroup
			var honest, flooded tally
			// Every caller starts and pauses a few µs apart from the
			// others, so that no two calls arrive at the same instant of
			// the bubble's clock (goroutines woken at one instant run in
			// any order): each run is the same run.
			for w := range 4 { // from the start
				wg.Add(1)
				go func() {
					defer wg.Done()
					time.Sleep(time.Duration(w) * 3 * time.Microsecond)
					for i := 0; time.Now().Before(end); i++ {
						ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
						_, err := echo.Put(ctx, &echov1.PutRequest{RequestId: fmt.Sprint("h", w, "-", i)})
						cancel()
						if time.Since(start) >= time.Second {
							honest.record(err)
						}
						time.Sleep(10*time.Millisecond + time.Duration(w)*3*time.Microsecond)
					}
				}()
			}
			time.Sleep(time.Second) // then the flood, for 5 s
			for w := range 120 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					time.Sleep(time.Duration(w) * 50 * time.Microsecond)
					for i := 0; time.Now().Before(end); i++ {
						ctx, cancel := flood.ctx(t.Context())
						_, err := echo.Put(ctx, &echov1.PutRequest{RequestId: fmt.Sprint("f", w, "-", i)})
						cancel()
						flooded.record(err)
						if err != nil {
							// About the shed first attempts' pushback.
							time.Sleep(100*time.Millisecond + time.Duration(w)*7*time.Microsecond)
						}
					}
				}()
			}
			wg.Wait()
			honestOK[k] = honest.ok.Load()
			t.Logf("flood %s: honest %d ok, %d failed; flood %d ok, %d failed; %+v", flood.name,
				honest.ok.Load(), honest.failed.Load(), flooded.ok.Load(), flooded.failed.Load(), interceptor.OverloadOf(s).Stats())
		})
	}
	require.Positive(t, honestOK[0], "the honest callers keep nothing against the flood without a deadline")
	for k := range floods[1:] {
		assert.GreaterOrEqual(t, honestOK[k+1], honestOK[0], "flood %s", floods[k+1].name)
	}
}

// TestServerAShedKeyedWriteIsNotStored: a keyed write that the overload
// protection sheds did not run, and its refusal is not its outcome: its
// key is released, so that its retry runs the handler, even with a dedupe
// server that stores Unavailable outcomes.
func TestServerAShedKeyedWriteIsNotStored(t *testing.T) {
	release, arrived := make(chan struct{}), make(chan struct{}, 1)
	o := origin.New(func(c origin.Call) origin.Reply {
		if c.RequestID == "hold" {
			arrived <- struct{}{}
			<-release
		}
		return origin.Reply{}
	})
	echo, _, _ := guarded(t, o,
		interceptor.WithOverload(overload.New(overload.Config{NoAdmission: true, NoAdaptive: true, MaxConcurrency: 1})),
		interceptor.WithDedupe(dedupe.NewServer(dedupe.Config{AllowAnonymous: true,
			NotStored: idempotency.CodeSet(1 << codes.Canceled)})))
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second) // fail, not hang, on a regression
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := echo.Put(ctx, &echov1.PutRequest{RequestId: "hold"})
		done <- err
	}()
	<-arrived
	keyed := metadata.AppendToOutgoingContext(ctx, idempotency.MetadataKey, "k")
	req := &echov1.ChargeRequest{RequestId: "c", Account: "a", AmountCents: 5}
	_, err := echo.Charge(keyed, req)
	require.Equal(t, codes.Unavailable, status.Code(err), "shed while the holder runs")
	close(release)
	require.NoError(t, <-done)
	_, err = echo.Charge(keyed, req)
	require.NoError(t, err, "the retry got the stored refusal")
	_, n := o.Balance("a")
	assert.Equal(t, 1, n)
}

// TestServerTheAttemptHeaderIsSelfReported: grpc-previous-rpc-attempts is
// what the caller says. At RetryShare of MaxConcurrency, 20 retries that
// say so are shed, and so are values that are malformed or given twice (a
// bad header buys nothing); 20 retries that omit the header or send "0"
// are served as the first attempts they claim to be, as the documentation
// says.
func TestServerTheAttemptHeaderIsSelfReported(t *testing.T) {
	release, arrived := make(chan struct{}), make(chan struct{}, 2)
	o := origin.New(func(c origin.Call) origin.Reply {
		if c.RequestID == "hold" {
			arrived <- struct{}{}
			<-release
		}
		return origin.Reply{}
	})
	echo, _, s := guarded(t, o, interceptor.WithOverload(overload.New(overload.Config{
		NoAdmission: true, NoAdaptive: true, MaxConcurrency: 4,
	})))
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second) // fail, not hang, on a regression
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(release)
	for range 2 { // two in flight: retries are shed from here (half of 4)
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := echo.Put(ctx, &echov1.PutRequest{RequestId: "hold"})
			assert.NoError(t, err)
		}()
		<-arrived
	}
	served := func(n int, md ...string) (ok int) {
		for range n {
			c := ctx
			for i := 0; i+1 < len(md); i += 2 {
				c = metadata.AppendToOutgoingContext(c, md[i], md[i+1])
			}
			if _, err := echo.Put(c, &echov1.PutRequest{RequestId: "retry"}); err == nil {
				ok++
			} else {
				assert.Equal(t, "retry", errorInfo(err).GetMetadata()["attempt"], "%v", err)
			}
		}
		return ok
	}
	honest := served(20, semconv.PreviousAttemptsKey, "1")
	hidden := served(10) + served(10, semconv.PreviousAttemptsKey, "0")
	bad := served(5, semconv.PreviousAttemptsKey, "x") + served(5, semconv.PreviousAttemptsKey, "") +
		served(5, semconv.PreviousAttemptsKey, "0", semconv.PreviousAttemptsKey, "0") +
		served(5, semconv.PreviousAttemptsKey, "00000000000")
	t.Logf("served: honest retries %d of 20, hidden %d of 20, malformed or repeated %d of 20", honest, hidden, bad)
	assert.Zero(t, honest)
	assert.Zero(t, bad)
	assert.Equal(t, 20, hidden)
	assert.Equal(t, overload.Stats{Admitted: 22, ShedRetry: 40}, interceptor.OverloadOf(s).Stats())
}

// deafPool is an EchoService whose Put hands its request to a pool of
// workers behind a FIFO queue and waits for it, without watching its
// context: a queued request is worked even after its caller has left.
// worked and wasted count the requests worked, and those of them worked
// after their caller had left.
type deafPool struct {
	echov1.UnimplementedEchoServiceServer
	jobs           chan deafJob
	stop           chan struct{}
	wg             sync.WaitGroup
	worked, wasted atomic.Int64
}

type deafJob struct {
	ctx  context.Context
	done chan struct{}
}

func newDeafPool(workers int, service time.Duration) *deafPool {
	p := &deafPool{jobs: make(chan deafJob, 10_000), stop: make(chan struct{})}
	for range workers {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			for {
				select {
				case j := <-p.jobs:
					time.Sleep(service)
					p.worked.Add(1)
					if j.ctx.Err() != nil {
						p.wasted.Add(1)
					}
					close(j.done)
				case <-p.stop:
					return
				}
			}
		}()
	}
	return p
}

func (p *deafPool) close() { close(p.stop); p.wg.Wait() }

func (p *deafPool) Register(s grpc.ServiceRegistrar) { echov1.RegisterEchoServiceServer(s, p) }

func (p *deafPool) Put(ctx context.Context, req *echov1.PutRequest) (*echov1.PutResponse, error) {
	j := deafJob{ctx: ctx, done: make(chan struct{})}
	p.jobs <- j
	select {
	case <-j.done:
		return &echov1.PutResponse{RequestId: req.GetRequestId()}, nil
	case <-p.stop:
		return nil, status.Error(codes.Unavailable, "stopped")
	}
}

// TestServerDoesNotWorkForCallersWhoLeft: twice a pool's capacity (4
// workers × 40 ms, 200 calls/s for 3 s, 1 s deadlines), its handler not
// watching its context. Without the protection the pool works through
// every request, most of them for callers who left; with it, the calls
// the method cannot serve wait for a place in the server, not in the
// pool, and leave it with their callers: at most 5% of what the pool works
// is for callers who had left, and more calls succeed.
func TestServerDoesNotWorkForCallersWhoLeft(t *testing.T) {
	type result struct{ ok, worked, wasted int64 }
	run := func(opts ...interceptor.ServerOption) (r result) {
		synctest.Test(t, func(t *testing.T) {
			p := newDeafPool(4, 40*time.Millisecond)
			echo, _ := bubbleServe(t, p, opts...)
			var wg sync.WaitGroup
			var ok atomic.Int64
			for i := range 600 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					ctx, cancel := context.WithTimeout(t.Context(), time.Second)
					defer cancel()
					if _, err := echo.Put(ctx, &echov1.PutRequest{RequestId: strconv.Itoa(i)}); err == nil {
						ok.Add(1)
					}
				}()
				time.Sleep(5 * time.Millisecond)
			}
			wg.Wait()
			time.Sleep(2 * time.Second) // the pool works off what it has
			p.close()
			r = result{ok.Load(), p.worked.Load(), p.wasted.Load()}
		})
		return r
	}
	bare := run(interceptor.WithOverload(nil))
	got := run()
	t.Logf("without the protection: %+v; with it: %+v", bare, got)
	assert.LessOrEqual(t, got.wasted*20, got.worked, "more than 5%% of the work for callers who had left")
	assert.Greater(t, got.ok, bare.ok)
}
