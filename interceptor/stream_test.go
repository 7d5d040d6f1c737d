package interceptor_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
	"github.com/stormguard/stormguard/semconv"
)

// failFirstAttempt fails the first attempt of every request after `after`
// messages, and lets later attempts succeed.
func failFirstAttempt(after int) origin.Script {
	return func(c origin.Call) origin.Reply {
		if c.Attempt == 1 {
			return origin.Reply{Code: codes.Unavailable, Message: "first attempt fails", FailAfter: after}
		}
		return origin.Reply{}
	}
}

func recvAll(t *testing.T, s grpc.ServerStreamingClient[echov1.ListResponse]) ([]uint32, error) {
	t.Helper()
	var got []uint32
	for {
		m, err := s.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return got, nil
			}
			return got, err
		}
		got = append(got, m.GetIndex())
	}
}

func TestServerStreamRetriedBeforeFirstResponse(t *testing.T) {
	e := newEnv(t, failFirstAttempt(0), interceptor.WithBudget(nil))
	s, err := e.echo.List(t.Context(), &echov1.ListRequest{RequestId: "l", Count: 5})
	require.NoError(t, err)
	got, err := recvAll(t, s)
	require.NoError(t, err)
	assert.Equal(t, []uint32{0, 1, 2, 3, 4}, got, "one clean stream")
	assert.Equal(t, 2, e.origin.CountID(list, "l"))
}

func TestServerStreamFailureAfterFirstMessageGoesToCaller(t *testing.T) {
	e := newEnv(t, failFirstAttempt(2), interceptor.WithBudget(nil))
	s, err := e.echo.List(t.Context(), &echov1.ListRequest{RequestId: "l", Count: 5})
	require.NoError(t, err)
	got, err := recvAll(t, s)
	assert.Equal(t, codes.Unavailable, status.Code(err))
	assert.Equal(t, "first attempt fails", status.Convert(err).Message())
	assert.Equal(t, []uint32{0, 1}, got, "nothing redelivered")
	assert.Equal(t, 1, e.origin.CountID(list, "l"))
	_, err = s.Recv()
	assert.Equal(t, codes.Unavailable, status.Code(err), "the error stays")
}

func chunks(n, size int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = bytes.Repeat([]byte{byte(i)}, size)
	}
	return out
}

func upload1(t *testing.T, e *env, id string, cs [][]byte) (*echov1.UploadResponse, error) {
	t.Helper()
	up, err := e.echo.Upload(t.Context())
	require.NoError(t, err)
	for _, c := range cs {
		if err := up.Send(&echov1.UploadRequest{RequestId: id, Chunk: c}); err != nil {
			require.ErrorIs(t, err, io.EOF)
			break
		}
	}
	return up.CloseAndRecv()
}

func sum(cs [][]byte) []byte {
	h := sha256.New()
	for _, c := range cs {
		h.Write(c)
	}
	return h.Sum(nil)
}

func TestClientStreamRetriedAndReplayed(t *testing.T) {
	e := newEnv(t, failFirstAttempt(2), interceptor.WithBudget(nil))
	cs := chunks(5, 1000)
	res, err := upload1(t, e, "u", cs)
	require.NoError(t, err)
	assert.Equal(t, uint32(5), res.GetChunks())
	assert.Equal(t, sum(cs), res.GetSha256(), "every chunk once, in order")
	assert.Equal(t, 2, e.origin.CountID(upload, "u"))
	require.Len(t, e.origin.Uploads(), 1)
}

func TestClientStreamOverReplayLimitCommits(t *testing.T) {
	cs := chunks(64, 16<<10) // 1 MiB
	t.Run("healthy origin gets every byte once", func(t *testing.T) {
		e := newEnv(t, nil, interceptor.WithBudget(nil))
		res, err := upload1(t, e, "big", cs)
		require.NoError(t, err)
		assert.Equal(t, uint64(1<<20), res.GetSize())
		assert.Equal(t, sum(cs), res.GetSha256())
	})
	t.Run("failure after the limit is not retried", func(t *testing.T) {
		// Fails after 20 chunks (320 KiB, past the 256 KiB limit).
		e := newEnv(t, failFirstAttempt(20), interceptor.WithBudget(nil))
		_, err := upload1(t, e, "big", cs)
		assert.Equal(t, codes.Unavailable, status.Code(err))
		assert.Equal(t, 1, e.origin.CountID(upload, "big"))
		assert.Empty(t, e.origin.Uploads())
	})
	t.Run("failure before the limit is retried", func(t *testing.T) {
		e := newEnv(t, failFirstAttempt(4), interceptor.WithBudget(nil), interceptor.WithRetryPolicy(interceptor.RetryPolicy{ReplayLimit: 2 << 20}))
		res, err := upload1(t, e, "big", cs)
		require.NoError(t, err)
		assert.Equal(t, sum(cs), res.GetSha256())
		assert.Equal(t, 2, e.origin.CountID(upload, "big"))
	})
}

func TestBidiStream(t *testing.T) {
	t.Run("failure before the first response is retried", func(t *testing.T) {
		e := newEnv(t, failFirstAttempt(0), interceptor.WithBudget(nil))
		c, err := e.echo.Chat(t.Context())
		require.NoError(t, err)
		for i := range uint32(3) {
			require.NoError(t, c.Send(&echov1.ChatRequest{RequestId: "c", Seq: i}))
			m, err := c.Recv()
			require.NoError(t, err)
			assert.Equal(t, i, m.GetSeq())
		}
		require.NoError(t, c.CloseSend())
		_, err = c.Recv()
		assert.ErrorIs(t, err, io.EOF)
		assert.Equal(t, 2, e.origin.CountID(chat, "c"))
	})
	t.Run("failure after the first response goes to the caller", func(t *testing.T) {
		e := newEnv(t, failFirstAttempt(1), interceptor.WithBudget(nil))
		c, err := e.echo.Chat(t.Context())
		require.NoError(t, err)
		require.NoError(t, c.Send(&echov1.ChatRequest{RequestId: "c", Seq: 0}))
		m, err := c.Recv()
		require.NoError(t, err)
		assert.Equal(t, uint32(0), m.GetSeq())
		_ = c.Send(&echov1.ChatRequest{RequestId: "c", Seq: 1})
		_, err = c.Recv()
		assert.Equal(t, codes.Unavailable, status.Code(err))
		assert.Equal(t, 1, e.origin.CountID(chat, "c"))
	})
	t.Run("messages sent before a retry are replayed in order", func(t *testing.T) {
		e := newEnv(t, failFirstAttempt(0), interceptor.WithBudget(nil))
		c, err := e.echo.Chat(t.Context())
		require.NoError(t, err)
		for i := range uint32(4) {
			require.NoError(t, c.Send(&echov1.ChatRequest{RequestId: "c", Seq: i}))
		}
		require.NoError(t, c.CloseSend())
		var seqs []uint32
		for {
			m, err := c.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			require.NoError(t, err)
			seqs = append(seqs, m.GetSeq())
		}
		assert.Equal(t, []uint32{0, 1, 2, 3}, seqs)
	})
}

func TestStreamHeaderAndTrailerAfterRetry(t *testing.T) {
	// The first attempt fails trailers-only (no header), so asking for the
	// header does not commit the stream: the header comes from the retry.
	e := newEnv(t, func(c origin.Call) origin.Reply {
		if c.Attempt == 1 {
			return origin.Reply{Code: codes.Unavailable, Trailer: map[string][]string{"t": {"1"}}}
		}
		return origin.Reply{Header: map[string][]string{"attempt": {fmt.Sprint(c.Attempt)}}, Trailer: map[string][]string{"t": {fmt.Sprint(c.Attempt)}}}
	}, interceptor.WithBudget(nil))
	s, err := e.echo.List(t.Context(), &echov1.ListRequest{RequestId: "h", Count: 2})
	require.NoError(t, err)
	md, err := s.Header()
	require.NoError(t, err)
	assert.Equal(t, []string{"2"}, md.Get("attempt"), "the header of the attempt that answered")
	got, err := recvAll(t, s)
	require.NoError(t, err)
	assert.Len(t, got, 2)
	assert.Equal(t, []string{"2"}, s.Trailer().Get("t"))
}

func TestStreamHeaderCommits(t *testing.T) {
	// A failure after the caller has seen a header is the caller's.
	e := newEnv(t, func(c origin.Call) origin.Reply {
		return origin.Reply{Code: codes.Unavailable, Header: map[string][]string{"attempt": {fmt.Sprint(c.Attempt)}}}
	}, interceptor.WithBudget(nil))
	s, err := e.echo.List(t.Context(), &echov1.ListRequest{RequestId: "h", Count: 2})
	require.NoError(t, err)
	md, err := s.Header()
	require.NoError(t, err)
	assert.Equal(t, []string{"1"}, md.Get("attempt"))
	_, err = recvAll(t, s)
	assert.Equal(t, codes.Unavailable, status.Code(err))
	assert.Equal(t, 1, e.origin.Total())
}

func TestStreamsAgainstDeadOriginStayWithinBudget(t *testing.T) {
	e := newEnv(t, origin.Always(codes.Unavailable))
	ok, _ := concurrently(50, func(i int) error {
		s, err := e.echo.List(t.Context(), &echov1.ListRequest{RequestId: fmt.Sprint(i), Count: 3})
		if err != nil {
			return err
		}
		_, err = recvAll(t, s)
		return err
	})
	assert.Equal(t, 0, ok)
	t.Logf("origin saw %d stream attempts for 50 streams", e.origin.Total())
	assert.LessOrEqual(t, e.origin.Total(), 55)
	// The breaker has seen enough: the next streams are refused at once.
	_, err := e.echo.List(t.Context(), &echov1.ListRequest{RequestId: "late", Count: 1})
	if err == nil {
		var s grpc.ServerStreamingClient[echov1.ListResponse]
		s, err = e.echo.List(t.Context(), &echov1.ListRequest{RequestId: "late", Count: 1})
		if err == nil {
			_, err = recvAll(t, s)
		}
	}
	assert.Equal(t, interceptor.ReasonBreaker, interceptor.RefusedBy(err))
}

func TestStreamCallerCancelLeavesNothingBehind(t *testing.T) {
	e := newEnv(t, origin.Sleep(time.Hour), interceptor.WithBudget(nil))
	ctx, cancel := context.WithCancel(t.Context())
	s, err := e.echo.List(ctx, &echov1.ListRequest{RequestId: "x", Count: 1})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		_, err := s.Recv()
		done <- err
	}()
	for e.origin.Total() == 0 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	assert.Equal(t, codes.Canceled, status.Code(<-done))
	var call []string
	for _, sp := range e.spans.GetSpans() {
		if sp.Name == "echo.v1.EchoService/List" {
			call = append(call, attrs(sp.Attributes)["rpc.response.status_code"].AsString())
		}
	}
	assert.Equal(t, []string{"CANCELLED"}, call, "one call span, ended with the caller's cancellation")
	// goleak (TestMain) checks that no goroutine outlived the stream.
}

// dropListener hands out connections it can cut, like a peer that dies.
type dropListener struct {
	net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func (l *dropListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.mu.Lock()
		l.conns = append(l.conns, c)
		l.mu.Unlock()
	}
	return c, err
}

func (l *dropListener) drop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		c.Close()
	}
}

func TestServerDiesMidStream(t *testing.T) {
	for _, how := range []string{"server stopped", "connection dropped"} {
		t.Run(how, func(t *testing.T) {
			o := origin.New(nil)
			tl, err := origin.TCP()
			require.NoError(t, err)
			dl := &dropListener{Listener: tl.Listener}
			tl.Listener = dl
			srv := origin.Serve(tl, o)
			defer srv.Stop()
			guard := interceptor.NewClient(fast)
			cc, err := tl.Dial(grpc.WithChainStreamInterceptor(guard.Stream()))
			require.NoError(t, err)
			defer cc.Close()
			c, err := echov1.NewEchoServiceClient(cc).Chat(t.Context())
			require.NoError(t, err)
			require.NoError(t, c.Send(&echov1.ChatRequest{RequestId: "d"}))
			_, err = c.Recv()
			require.NoError(t, err) // committed
			if how == "server stopped" {
				srv.Stop()
			} else {
				dl.drop()
			}
			start := time.Now()
			_, err = c.Recv()
			assert.Error(t, err)
			assert.Less(t, time.Since(start), 5*time.Second, "promptly")
			assert.Equal(t, 1, o.Total(), "a committed stream is not retried")
		})
	}
}

// failingHealth is a health service whose Watch always fails: its methods
// carry no idempotency option.
type failingHealth struct {
	grpc_health_v1.UnimplementedHealthServer
	mu    sync.Mutex
	calls int
}

func (h *failingHealth) Watch(*grpc_health_v1.HealthCheckRequest, grpc.ServerStreamingServer[grpc_health_v1.HealthCheckResponse]) error {
	h.mu.Lock()
	h.calls++
	h.mu.Unlock()
	return status.Error(codes.Unavailable, "down")
}

func TestUnmarkedStreamIsAttemptedOnce(t *testing.T) {
	h := &failingHealth{}
	l := origin.Bufconn()
	s := grpc.NewServer()
	grpc_health_v1.RegisterHealthServer(s, h)
	go func() { _ = s.Serve(l) }()
	defer s.Stop()
	guard := interceptor.NewClient(fast, interceptor.WithBudget(nil), interceptor.WithRetryPolicy(interceptor.RetryPolicy{MaxAttempts: 5}))
	cc, err := l.Dial(grpc.WithChainStreamInterceptor(guard.Stream()))
	require.NoError(t, err)
	defer cc.Close()
	w, err := grpc_health_v1.NewHealthClient(cc).Watch(t.Context(), &grpc_health_v1.HealthCheckRequest{}, interceptor.MaxAttempts(5))
	require.NoError(t, err)
	_, err = w.Recv()
	assert.Equal(t, codes.Unavailable, status.Code(err))
	h.mu.Lock()
	defer h.mu.Unlock()
	assert.Equal(t, 1, h.calls)
}

func TestSpansOfAStreamRetriedOnce(t *testing.T) {
	e := newEnv(t, failFirstAttempt(0), interceptor.WithBudget(nil))
	s, err := e.echo.List(t.Context(), &echov1.ListRequest{RequestId: "l", Count: 2})
	require.NoError(t, err)
	_, err = recvAll(t, s)
	require.NoError(t, err)
	spans := e.spans.GetSpans()
	require.Len(t, spans, 3)
	var call, first, retry int = -1, -1, -1
	for i, sp := range spans {
		switch {
		case sp.Name == "echo.v1.EchoService/List":
			call = i
		case attrs(sp.Attributes)[semconv.AttrAttemptKind].AsString() == "first":
			first = i
		case attrs(sp.Attributes)[semconv.AttrAttemptKind].AsString() == "retry":
			retry = i
		}
	}
	require.True(t, call >= 0 && first >= 0 && retry >= 0)
	assert.Equal(t, spans[call].SpanContext.SpanID(), spans[first].Parent.SpanID())
	assert.Equal(t, spans[call].SpanContext.SpanID(), spans[retry].Parent.SpanID())
	assert.Equal(t, "UNAVAILABLE", attrs(spans[first].Attributes)["rpc.response.status_code"].AsString())
	assert.Equal(t, "OK", attrs(spans[retry].Attributes)["rpc.response.status_code"].AsString())
	assert.Equal(t, "OK", attrs(spans[call].Attributes)["rpc.response.status_code"].AsString())
	assert.Equal(t, []string{semconv.EventRetryScheduled}, eventNames(spans[call]))
}

// A stream's endpoint is counted whether or not the attempt carried the
// suite's call credentials (it does only with a deadline, caller
// credentials or endpoints to avoid; without them the endpoint comes from
// the stream's context).
func TestAStreamsEndpointIsCountedWithOrWithoutADeadline(t *testing.T) {
	for _, withDeadline := range []bool{false, true} {
		e := newEnv(t, origin.Succeed())
		ctx := t.Context()
		if withDeadline {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, time.Minute)
			defer cancel()
		}
		s, err := e.echo.List(ctx, &echov1.ListRequest{RequestId: "l", Count: 3})
		require.NoError(t, err)
		for {
			if _, err := s.Recv(); err != nil {
				require.ErrorIs(t, err, io.EOF)
				break
			}
		}
		var ok int64
		for _, tg := range e.guard.Targets() {
			for _, ep := range tg.Endpoints {
				ok += ep.OK
			}
		}
		assert.Equal(t, int64(1), ok, "deadline %v: the stream's endpoint served one", withDeadline)
	}
}

// A message sent while a stream switches attempts is not lost. The test pauses
// between the new attempt's replay and its installation, and sends meanwhile:
// that message must reach the new attempt (it was lost when the two steps were
// apart: the send went to the dead attempt, got io.EOF, and SendMsg reported
// success).
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

// The same for CloseSend: a CloseSend made while a retried stream replays
// reaches the attempt that carries on (it went to the dead one).
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

// A caller whose context is done by the time its stream is handed over
// (a deadline that passes as the stream opens) gets a finished stream:
// the watcher of the caller's context, which then runs at once on a
// goroutine of its own, and the code that installs it do not race.
func TestStreamCallerGoneAsItOpens(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		streamer := func(actx context.Context, _ *grpc.StreamDesc, _ *grpc.ClientConn, _ string, _ ...grpc.CallOption) (grpc.ClientStream, error) {
			cancel() // the caller leaves while grpc opens the stream
			return newFakeStream(actx), nil
		}
		c := interceptor.NewClient(append(noopProviders(), interceptor.WithBudget(nil))...)
		s, err := c.Stream()(ctx, &grpc.StreamDesc{ServerStreams: true}, dialPassthrough(t), list, streamer)
		require.NoError(t, err)
		synctest.Wait() // the watcher has finished the stream
		assert.Equal(t, codes.Canceled, status.Code(s.RecvMsg(&echov1.ListResponse{})))
	})
}
