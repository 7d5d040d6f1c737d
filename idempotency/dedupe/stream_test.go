package dedupe_test

import (
	"context"
	"errors"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/dedupe"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

const listMethod = echov1.EchoService_List_FullMethodName

// listed is what one List call received.
type listed struct {
	msgs            []*echov1.ListResponse
	header, trailer metadata.MD
	err             error // the stream's final status; nil for OK
}

// list calls List and reads the stream to its end.
func list(ctx context.Context, c echov1.EchoServiceClient, req *echov1.ListRequest) listed {
	var out listed
	ls, err := c.List(ctx, req)
	if err != nil {
		out.err = err
		return out
	}
	for {
		m, err := ls.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			out.err = err
			break
		}
		out.msgs = append(out.msgs, m)
	}
	out.header, _ = ls.Header()
	out.trailer = ls.Trailer()
	return out
}

// assertSameStream checks that got carries the same messages and status as
// want.
func assertSameStream(t *testing.T, want, got listed, msgAndArgs ...any) {
	t.Helper()
	require.Len(t, got.msgs, len(want.msgs), msgAndArgs...)
	for i := range want.msgs {
		assert.True(t, proto.Equal(want.msgs[i], got.msgs[i]), "message %d: got %v, want %v", i, got.msgs[i], want.msgs[i])
	}
	assert.True(t, proto.Equal(status.Convert(want.err).Proto(), status.Convert(got.err).Proto()),
		"status: got %v, want %v", got.err, want.err)
}

func listServer(c dedupe.Config) *dedupe.Server {
	if c.Methods == nil {
		c.Methods = []string{listMethod}
	}
	return dedupe.NewServer(c)
}

func TestStreamReplaysStoredResponses(t *testing.T) {
	o := origin.New(func(origin.Call) origin.Reply {
		return origin.Reply{Header: metadata.Pairs("x-h", "1"), Trailer: metadata.Pairs("x-receipt", "r-1")}
	})
	s := listServer(dedupe.Config{AllowAnonymous: true})
	c := startEcho(t, o, dedupeOpts(s))
	ctx := keyed(context.Background(), "list-1")
	req := &echov1.ListRequest{RequestId: "l", Count: 3}

	first := list(ctx, c, req)
	require.NoError(t, first.err)
	require.Len(t, first.msgs, 3)
	again := list(ctx, c, req)
	require.NoError(t, again.err)
	assertSameStream(t, first, again)
	for i, m := range again.msgs {
		assert.Equal(t, uint32(i), m.GetIndex())
	}
	assert.Equal(t, []string{"1"}, again.header.Get("x-h"))
	assert.Equal(t, []string{"r-1"}, again.trailer.Get("x-receipt"))

	assert.Equal(t, 1, o.CountID(listMethod, "l"), "handler runs once")
	assert.Equal(t, dedupe.Stats{Hits: 1, Misses: 1}, s.Stats())
}

func TestStreamConcurrentDuplicates(t *testing.T) {
	g := newGate(t)
	o := origin.New(func(origin.Call) origin.Reply {
		g.block() // hold the first execution until every duplicate is waiting
		return origin.Reply{Trailer: metadata.Pairs("x-receipt", "r-dup")}
	})
	s := listServer(dedupe.Config{AllowAnonymous: true})
	c := startEcho(t, o, dedupeOpts(s))
	ctx := keyed(context.Background(), idempotency.NewKey())
	req := &echov1.ListRequest{RequestId: "dup", Count: 4}

	const n = 5
	got := make([]listed, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { got[i] = list(ctx, c, req) })
	}
	eventually(t, "one execution and 4 waiters", func() bool {
		st := s.Stats()
		return st.Misses == 1 && st.Waits == n-1
	})
	g.open()
	wg.Wait()

	require.NoError(t, got[0].err)
	require.Len(t, got[0].msgs, 4)
	for i := range n {
		assertSameStream(t, got[0], got[i], "call %d", i)
		assert.Equal(t, []string{"r-dup"}, got[i].trailer.Get("x-receipt"), "call %d", i)
	}
	assert.Equal(t, 1, o.CountID(listMethod, "dup"), "handler runs once")
	assert.Equal(t, dedupe.Stats{Hits: n - 1, Misses: 1, Waits: n - 1}, s.Stats())
}

func TestStreamKeyReuse(t *testing.T) {
	g := newGate(t)
	o := origin.New(func(c origin.Call) origin.Reply {
		if c.RequestID == "slow" {
			g.block()
		}
		return origin.Reply{}
	})
	s := listServer(dedupe.Config{AllowAnonymous: true})
	c := startEcho(t, o, dedupeOpts(s))

	t.Run("completed, different request", func(t *testing.T) {
		ctx := keyed(context.Background(), "reused")
		require.NoError(t, list(ctx, c, &echov1.ListRequest{RequestId: "l", Count: 2}).err)
		got := list(ctx, c, &echov1.ListRequest{RequestId: "l", Count: 3})
		assert.Equal(t, codes.InvalidArgument, status.Code(got.err))
		assert.Contains(t, status.Convert(got.err).Message(), "different request")
		assert.Empty(t, got.msgs, "never someone else's responses")
		assert.Equal(t, 1, o.CountID(listMethod, "l"))
	})
	t.Run("in flight, different request", func(t *testing.T) {
		ctx := keyed(context.Background(), "reused-in-flight")
		done := make(chan error, 1)
		go func() { done <- list(ctx, c, &echov1.ListRequest{RequestId: "slow", Count: 1}).err }()
		eventually(t, "first in flight", func() bool { return o.CountID(listMethod, "slow") == 1 })
		// Refused at once, without waiting for the first to finish.
		got := list(ctx, c, &echov1.ListRequest{RequestId: "slow", Count: 2})
		assert.Equal(t, codes.InvalidArgument, status.Code(got.err))
		g.open()
		require.NoError(t, <-done)
		assert.Equal(t, 1, o.CountID(listMethod, "slow"))
	})
	t.Run("another method", func(t *testing.T) {
		ctx := keyed(context.Background(), "one-key")
		_, err := c.Charge(ctx, &echov1.ChargeRequest{RequestId: "p", Account: "acct", AmountCents: 1})
		require.NoError(t, err)
		got := list(ctx, c, &echov1.ListRequest{RequestId: "other", Count: 1})
		assert.Equal(t, codes.InvalidArgument, status.Code(got.err))
		assert.Contains(t, status.Convert(got.err).Message(), "another method")
		assert.Zero(t, o.CountID(listMethod, "other"))
	})
	assert.Equal(t, uint64(3), s.Stats().Conflicts)
	assert.Zero(t, s.Stats().Waits)
}

func TestStreamRefusesInvalidKey(t *testing.T) {
	o := origin.New(nil)
	s := listServer(dedupe.Config{AllowAnonymous: true})
	c := startEcho(t, o, dedupeOpts(s))
	got := list(keyed(context.Background(), "order 1"), c, &echov1.ListRequest{RequestId: "l", Count: 1})
	assert.Equal(t, codes.InvalidArgument, status.Code(got.err))
	assert.Zero(t, o.CountID(listMethod, "l"), "handler must not run")
	assert.Equal(t, dedupe.Stats{Invalid: 1}, s.Stats())
}

func TestStreamRetryableFailureNotStored(t *testing.T) {
	for name, failAfter := range map[string]int{"before any message": 0, "after two messages": 2} {
		t.Run(name, func(t *testing.T) {
			o := origin.New(func(c origin.Call) origin.Reply {
				if c.Attempt == 1 {
					return origin.Reply{Code: codes.Unavailable, Message: "try again", FailAfter: failAfter}
				}
				return origin.Reply{}
			})
			s := listServer(dedupe.Config{AllowAnonymous: true})
			c := startEcho(t, o, dedupeOpts(s))
			ctx := keyed(context.Background(), "k")
			req := &echov1.ListRequest{RequestId: "l", Count: 3}

			failed := list(ctx, c, req)
			assert.Equal(t, codes.Unavailable, status.Code(failed.err))
			assert.Len(t, failed.msgs, failAfter)
			first := list(ctx, c, req) // the retry runs the handler again
			require.NoError(t, first.err)
			require.Len(t, first.msgs, 3)
			again := list(ctx, c, req) // and is then stored
			assertSameStream(t, first, again)
			assert.Equal(t, 2, o.CountID(listMethod, "l"))
			assert.Equal(t, dedupe.Stats{Hits: 1, Misses: 2, NotStored: 1}, s.Stats())
		})
	}
}

func TestStreamStoredFailureReplaysItsMessages(t *testing.T) {
	o := origin.New(func(origin.Call) origin.Reply {
		return origin.Reply{Code: codes.FailedPrecondition, Message: "out of stock", FailAfter: 2,
			Trailer: metadata.Pairs("x-why", "stock")}
	})
	s := listServer(dedupe.Config{AllowAnonymous: true})
	c := startEcho(t, o, dedupeOpts(s))
	ctx := keyed(context.Background(), "k")
	req := &echov1.ListRequest{RequestId: "l", Count: 5}
	first := list(ctx, c, req)
	assert.Equal(t, codes.FailedPrecondition, status.Code(first.err))
	require.Len(t, first.msgs, 2)
	for i := range 2 {
		again := list(ctx, c, req)
		assertSameStream(t, first, again, "replay %d", i)
		assert.Equal(t, []string{"stock"}, again.trailer.Get("x-why"))
	}
	assert.Equal(t, 1, o.CountID(listMethod, "l"))
	assert.Equal(t, dedupe.Stats{Hits: 2, Misses: 1}, s.Stats())
}

func TestStreamPassThrough(t *testing.T) {
	req := &echov1.ListRequest{RequestId: "l", Count: 2}
	for name, tc := range map[string]struct {
		methods []string
		key     bool
	}{
		"no opt-in":          {nil, true},
		"other method only":  {[]string{echov1.EchoService_Chat_FullMethodName, "/other.v1.Svc/"}, true},
		"opted in, no key":   {[]string{listMethod}, false},
		"service, no key":    {[]string{"echo.v1.EchoService"}, false},
		"opted in, unary":    {[]string{echov1.EchoService_Charge_FullMethodName}, true},
		"empty entries only": {[]string{"", " ", "/"}, true},
	} {
		t.Run(name, func(t *testing.T) {
			o := origin.New(nil)
			s := dedupe.NewServer(dedupe.Config{AllowAnonymous: true, Methods: tc.methods})
			c := startEcho(t, o, dedupeOpts(s))
			ctx := context.Background()
			if tc.key {
				ctx = keyed(ctx, "k")
			}
			for range 2 {
				got := list(ctx, c, req)
				require.NoError(t, got.err)
				assert.Len(t, got.msgs, 2)
			}
			assert.Equal(t, 2, o.CountID(listMethod, "l"), "the handler runs every time")
			assert.Equal(t, dedupe.Stats{}, s.Stats())
		})
	}
}

func TestStreamOptInByService(t *testing.T) {
	for _, entry := range []string{"echo.v1.EchoService", "/echo.v1.EchoService/", "/echo.v1.EchoService", "echo.v1.EchoService/List"} {
		t.Run(entry, func(t *testing.T) {
			o := origin.New(nil)
			s := dedupe.NewServer(dedupe.Config{AllowAnonymous: true, Methods: []string{entry}})
			c := startEcho(t, o, dedupeOpts(s))
			ctx := keyed(context.Background(), "k")
			req := &echov1.ListRequest{RequestId: "l", Count: 2}
			first, again := list(ctx, c, req), list(ctx, c, req)
			require.NoError(t, first.err)
			assertSameStream(t, first, again)
			assert.Equal(t, 1, o.CountID(listMethod, "l"))
		})
	}
}

// Client-streaming and bidi methods stay pass-through even when opted in:
// their requests are not known before the handler runs.
func TestStreamClientAndBidiPassThrough(t *testing.T) {
	o := origin.New(nil)
	s := dedupe.NewServer(dedupe.Config{AllowAnonymous: true, Methods: []string{"echo.v1.EchoService"}})
	c := startEcho(t, o, dedupeOpts(s))
	ctx := keyed(context.Background(), "k")
	for range 2 {
		up, err := c.Upload(ctx)
		require.NoError(t, err)
		require.NoError(t, up.Send(&echov1.UploadRequest{RequestId: "u", Chunk: []byte("abc")}))
		resp, err := up.CloseAndRecv()
		require.NoError(t, err)
		assert.Equal(t, uint64(3), resp.GetSize())

		ch, err := c.Chat(ctx)
		require.NoError(t, err)
		require.NoError(t, ch.Send(&echov1.ChatRequest{RequestId: "c", Seq: 1}))
		m, err := ch.Recv()
		require.NoError(t, err)
		assert.Equal(t, uint32(1), m.GetSeq())
		require.NoError(t, ch.CloseSend())
		_, err = ch.Recv()
		require.ErrorIs(t, err, io.EOF)
	}
	assert.Equal(t, 2, o.CountID(echov1.EchoService_Upload_FullMethodName, "u"))
	assert.Equal(t, 2, o.CountID(echov1.EchoService_Chat_FullMethodName, "c"))
	assert.Equal(t, dedupe.Stats{}, s.Stats())
}

// A stream whose responses outgrow MaxStreamBytes reaches its first caller
// whole, and is stored as a tombstone: the retry gets codes.Internal and
// the handler does not run again.
func TestStreamOversizedStoresTombstone(t *testing.T) {
	o := origin.New(func(origin.Call) origin.Reply {
		return origin.Reply{Trailer: metadata.Pairs("x-receipt", "r")}
	})
	// The first ListResponses of a request id of one letter are 6, 8, 8,
	// ... bytes, each counted as an 8-byte allocation and a 24-byte slice
	// header, 32 bytes: 3 fit in 100 bytes, 4 do not.
	store := dedupe.NewMemoryStore(dedupe.MemoryConfig{})
	s := listServer(dedupe.Config{AllowAnonymous: true, MaxStreamBytes: 100, Store: store})
	c := startEcho(t, o, dedupeOpts(s))

	t.Run("within the limit", func(t *testing.T) {
		ctx := keyed(context.Background(), "small")
		req := &echov1.ListRequest{RequestId: "s", Count: 3}
		first, again := list(ctx, c, req), list(ctx, c, req)
		require.NoError(t, first.err)
		assertSameStream(t, first, again)
		assert.Equal(t, 1, o.CountID(listMethod, "s"))
	})
	t.Run("over the limit", func(t *testing.T) {
		ctx := keyed(context.Background(), "big")
		req := &echov1.ListRequest{RequestId: "l", Count: 4}
		first := list(ctx, c, req)
		require.NoError(t, first.err)
		assert.Len(t, first.msgs, 4, "the first caller gets every message")
		assert.Equal(t, []string{"r"}, first.trailer.Get("x-receipt"))
		for range 2 {
			again := list(ctx, c, req)
			assert.Equal(t, codes.Internal, status.Code(again.err))
			assert.Contains(t, status.Convert(again.err).Message(), "too large")
			assert.Empty(t, again.msgs)
			assert.Empty(t, again.trailer.Get("x-receipt"), "a tombstone keeps no metadata")
		}
		assert.Equal(t, 1, o.CountID(listMethod, "l"), "the handler does not run again")
	})
	assert.Equal(t, dedupe.Stats{Hits: 3, Misses: 2, Oversized: 1}, s.Stats())
	assert.Zero(t, store.Stats().Oversized, "the interceptor's tombstone, not the store's")
}

func TestStreamWaiterBoundedByDeadline(t *testing.T) {
	g := newGate(t)
	o := origin.New(func(origin.Call) origin.Reply { g.block(); return origin.Reply{} })
	s := listServer(dedupe.Config{AllowAnonymous: true})
	c := startEcho(t, o, dedupeOpts(s))
	ctx := keyed(context.Background(), "k")
	req := &echov1.ListRequest{RequestId: "l", Count: 2}

	first := make(chan listed, 1)
	go func() { first <- list(ctx, c, req) }()
	eventually(t, "first in flight", func() bool { return s.Stats().Misses == 1 })
	dctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	assert.Equal(t, codes.DeadlineExceeded, status.Code(list(dctx, c, req).err))
	eventually(t, "the duplicate waited (and gave up at its deadline)", func() bool { return s.Stats().Waits == 1 })

	g.open()
	want := <-first
	require.NoError(t, want.err)
	assertSameStream(t, want, list(ctx, c, req))
	assert.Equal(t, 1, o.CountID(listMethod, "l"))
	assert.Zero(t, s.Stats().StoreErrors, "a waiter's own deadline is not a store error")
}

func TestStreamIdentityScoping(t *testing.T) {
	o := origin.New(nil)
	s := listServer(dedupe.Config{Identity: tenant})
	c := startEcho(t, o, dedupeOpts(s))
	req := &echov1.ListRequest{RequestId: "l", Count: 1}
	as := func(who string) context.Context {
		return metadata.AppendToOutgoingContext(keyed(context.Background(), "guessable"), "x-tenant", who)
	}
	for _, who := range []string{"alice", "bob", "alice", "bob"} {
		require.NoError(t, list(as(who), c, req).err)
	}
	assert.Equal(t, 2, o.CountID(listMethod, "l"), "one run per tenant")
	assert.Equal(t, dedupe.Stats{Hits: 2, Misses: 2}, s.Stats())
}

// Through stormguard's composed server interceptor, which wraps the stream
// (deadline, pushback) before deduplication sees it.
func TestStreamThroughComposedServer(t *testing.T) {
	o := origin.New(func(origin.Call) origin.Reply {
		return origin.Reply{Header: metadata.Pairs("x-h", "1")}
	})
	s := listServer(dedupe.Config{AllowAnonymous: true})
	guard := interceptor.NewServer(interceptor.WithDedupe(s))
	c := startEcho(t, o, []grpc.ServerOption{grpc.ChainUnaryInterceptor(guard.Unary()), grpc.ChainStreamInterceptor(guard.Stream())})
	ctx := keyed(context.Background(), "k")
	req := &echov1.ListRequest{RequestId: "l", Count: 3}
	first, again := list(ctx, c, req), list(ctx, c, req)
	require.NoError(t, first.err)
	assertSameStream(t, first, again)
	assert.Equal(t, []string{"1"}, again.header.Get("x-h"))
	assert.Equal(t, 1, o.CountID(listMethod, "l"))
}

// The tests below call the stream interceptor directly, for what a grpc
// client cannot send or the demo service does not do.

// fakeServerStream is a grpc.ServerStream whose one request is req.
type fakeServerStream struct {
	ctx             context.Context
	req             proto.Message
	recvd           bool
	sent            []proto.Message
	header, trailer metadata.MD
}

func (f *fakeServerStream) Context() context.Context { return f.ctx }
func (f *fakeServerStream) SetHeader(md metadata.MD) error {
	f.header = metadata.Join(f.header, md)
	return nil
}
func (f *fakeServerStream) SendHeader(md metadata.MD) error { return f.SetHeader(md) }
func (f *fakeServerStream) SetTrailer(md metadata.MD)       { f.trailer = metadata.Join(f.trailer, md) }
func (f *fakeServerStream) SendMsg(m any) error {
	if pm, ok := m.(proto.Message); ok {
		f.sent = append(f.sent, pm)
	}
	return nil
}
func (f *fakeServerStream) RecvMsg(m any) error {
	if f.recvd {
		return io.EOF
	}
	f.recvd = true
	proto.Merge(m.(proto.Message), f.req)
	return nil
}

var serverStreaming = &grpc.StreamServerInfo{FullMethod: listMethod, IsServerStream: true}

// directStream calls s's stream interceptor as grpc would, with incoming
// md and the one request req.
func directStream(s *dedupe.Server, info *grpc.StreamServerInfo, md metadata.MD, req proto.Message, h grpc.StreamHandler) (*fakeServerStream, error) {
	ctx := grpc.NewContextWithServerTransportStream(metadata.NewIncomingContext(context.Background(), md), &fakeStream{method: info.FullMethod})
	f := &fakeServerStream{ctx: ctx, req: req}
	return f, s.Stream()(nil, f, info, h)
}

// listHandler is what generated code and the service do: receive the
// request, then send count items.
func listHandler(runs *int) grpc.StreamHandler {
	return func(_ any, ss grpc.ServerStream) error {
		*runs++
		req := new(echov1.ListRequest)
		if err := ss.RecvMsg(req); err != nil {
			return err
		}
		for i := range req.GetCount() {
			if err := ss.SendMsg(&echov1.ListResponse{RequestId: req.GetRequestId(), Index: i}); err != nil {
				return err
			}
		}
		return nil
	}
}

func TestStreamHandlerPanicReleases(t *testing.T) {
	s := listServer(dedupe.Config{AllowAnonymous: true})
	req := &echov1.ListRequest{RequestId: "p", Count: 2}
	assert.PanicsWithValue(t, "boom", func() {
		_, _ = directStream(s, serverStreaming, keyMD("k"), req, func(any, grpc.ServerStream) error { panic("boom") })
	})
	runs := 0
	for range 2 {
		f, err := directStream(s, serverStreaming, keyMD("k"), req, listHandler(&runs))
		require.NoError(t, err)
		assert.Len(t, f.sent, 2)
	}
	assert.Equal(t, 1, runs, "the retry after the panic runs, and is then stored")
	assert.Equal(t, dedupe.Stats{Hits: 1, Misses: 2, NotStored: 1}, s.Stats())
}

// Metadata set on the stream itself (not through its context, as the
// origin does) is recorded and replayed too, with status details.
func TestStreamRecordsStreamMetadataAndDetails(t *testing.T) {
	s := listServer(dedupe.Config{AllowAnonymous: true})
	st, err := status.New(codes.FailedPrecondition, "declined").WithDetails(wrapperspb.String("why"))
	require.NoError(t, err)
	runs := 0
	h := func(srv any, ss grpc.ServerStream) error {
		require.NoError(t, ss.SetHeader(metadata.Pairs("x-set", "1")))
		require.NoError(t, ss.SendHeader(metadata.Pairs("x-sent", "2")))
		ss.SetTrailer(metadata.Pairs("x-t", "3"))
		require.NoError(t, grpc.SetTrailer(ss.Context(), metadata.Pairs("x-ctx", "4")))
		if err := listHandler(&runs)(srv, ss); err != nil {
			return err
		}
		return st.Err()
	}
	req := &echov1.ListRequest{RequestId: "p", Count: 2}
	f1, err1 := directStream(s, serverStreaming, keyMD("k"), req, h)
	f2, err2 := directStream(s, serverStreaming, keyMD("k"), req, nil) // nil: must not run
	assert.True(t, proto.Equal(status.Convert(err1).Proto(), status.Convert(err2).Proto()), "%v vs %v", err1, err2)
	require.Len(t, f2.sent, 2)
	assert.True(t, proto.Equal(f1.sent[1], f2.sent[1]))
	assert.Equal(t, metadata.Pairs("x-set", "1", "x-sent", "2"), f2.header)
	assert.Equal(t, []string{"3"}, f2.trailer.Get("x-t"))
	// The context's transport stream is a fakeStream, not f1: what the
	// handler set there reached it, and is replayed on the stream.
	assert.Equal(t, []string{"4"}, f2.trailer.Get("x-ctx"))
	assert.Equal(t, 1, runs)
}

func TestStreamUnknownRequestType(t *testing.T) {
	const method = "/unknown.v1.Svc/Watch"
	s := dedupe.NewServer(dedupe.Config{AllowAnonymous: true, Methods: []string{method}})
	info := &grpc.StreamServerInfo{FullMethod: method, IsServerStream: true}
	ran := false
	h := func(any, grpc.ServerStream) error { ran = true; return nil }
	_, err := directStream(s, info, keyMD("k"), wrapperspb.String("in"), h)
	assert.Equal(t, codes.Internal, status.Code(err))
	assert.Contains(t, status.Convert(err).Message(), "unknown to the protobuf registry")
	assert.False(t, ran, "refused before the handler, rather than run twice")

	_, err = directStream(s, info, nil, wrapperspb.String("in"), h)
	require.NoError(t, err)
	assert.True(t, ran, "without a key it passes through")
}

func TestStreamNonProtoResponseNotStored(t *testing.T) {
	s := listServer(dedupe.Config{AllowAnonymous: true})
	runs := 0
	h := func(_ any, ss grpc.ServerStream) error {
		runs++
		if err := ss.RecvMsg(new(echov1.ListRequest)); err != nil {
			return err
		}
		return ss.SendMsg("not a protobuf message")
	}
	for range 2 {
		_, err := directStream(s, serverStreaming, keyMD("k"), &echov1.ListRequest{}, h)
		require.NoError(t, err)
	}
	assert.Equal(t, 2, runs)
	assert.Equal(t, dedupe.Stats{Misses: 2, NotStored: 2}, s.Stats())
}

func TestStreamHandlerReceivesIntoWrongType(t *testing.T) {
	s := listServer(dedupe.Config{AllowAnonymous: true})
	var recvErr error
	h := func(_ any, ss grpc.ServerStream) error {
		recvErr = ss.RecvMsg(new(echov1.ChatRequest))
		return recvErr
	}
	_, err := directStream(s, serverStreaming, keyMD("k"), &echov1.ListRequest{}, h)
	assert.Equal(t, codes.Internal, status.Code(recvErr))
	assert.Equal(t, codes.Internal, status.Code(err))
}

func TestStreamReceiveErrorBeforeClaim(t *testing.T) {
	s := listServer(dedupe.Config{AllowAnonymous: true})
	ctx := metadata.NewIncomingContext(context.Background(), keyMD("k"))
	f := &fakeServerStream{ctx: ctx, recvd: true} // the client sent no request
	err := s.Stream()(nil, f, serverStreaming, func(any, grpc.ServerStream) error {
		t.Fatal("handler ran")
		return nil
	})
	assert.ErrorIs(t, err, io.EOF, "returned as the handler would have")
	assert.Equal(t, dedupe.Stats{}, s.Stats(), "nothing claimed")
}
