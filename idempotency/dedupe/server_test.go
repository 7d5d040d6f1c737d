package dedupe_test

import (
	"context"
	"errors"
	"io"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/dedupe"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

const chargeMethod = echov1.EchoService_Charge_FullMethodName

// startEcho serves svc over bufconn on a grpc.Server with serverOpts, and
// returns a client whose connection is built from dialOpts (on top of
// origin's defaults: insecure, grpc's own retries off).
func startEcho(t testing.TB, svc origin.Registerer, serverOpts []grpc.ServerOption, dialOpts ...grpc.DialOption) echov1.EchoServiceClient {
	t.Helper()
	l := origin.Bufconn()
	srv := origin.Serve(l, svc, serverOpts...)
	cc, err := l.Dial(dialOpts...)
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = cc.Close()
		srv.Stop()
	})
	return echov1.NewEchoServiceClient(cc)
}

// dedupeOpts installs s as the server's interceptors.
func dedupeOpts(s *dedupe.Server) []grpc.ServerOption {
	return []grpc.ServerOption{grpc.ChainUnaryInterceptor(s.Unary()), grpc.ChainStreamInterceptor(s.Stream())}
}

// keyed sends key as the idempotency key, the way a client would.
func keyed(ctx context.Context, key string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, idempotency.MetadataKey, key)
}

// gate blocks the origin's handler for chosen requests until opened.
type gate struct {
	ch   chan struct{}
	once sync.Once
}

func newGate(t *testing.T) *gate {
	g := &gate{ch: make(chan struct{})}
	t.Cleanup(g.open) // never leave a handler blocked
	return g
}

func (g *gate) open()  { g.once.Do(func() { close(g.ch) }) }
func (g *gate) block() { <-g.ch }

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	require.Eventually(t, cond, 10*time.Second, time.Millisecond, what)
}

func TestServerReplaysStoredResponse(t *testing.T) {
	o := origin.New(func(origin.Call) origin.Reply {
		return origin.Reply{Header: metadata.Pairs("x-h", "1"), Trailer: metadata.Pairs("x-receipt", "r-1")}
	})
	s := dedupe.NewServer(dedupe.Config{AllowAnonymous: true})
	c := startEcho(t, o, dedupeOpts(s))
	ctx := keyed(context.Background(), "order-1")
	req := &echov1.ChargeRequest{RequestId: "p1", Account: "acct", AmountCents: 1999}

	var h1, t1 metadata.MD
	first, err := c.Charge(ctx, req, grpc.Header(&h1), grpc.Trailer(&t1))
	require.NoError(t, err)
	assert.Equal(t, "ch_1", first.GetChargeId())

	var h2, t2 metadata.MD
	again, err := c.Charge(ctx, req, grpc.Header(&h2), grpc.Trailer(&t2))
	require.NoError(t, err)
	assert.True(t, proto.Equal(first, again), "replayed %v, want %v", again, first)
	assert.Equal(t, []string{"r-1"}, t2.Get("x-receipt"))
	assert.Equal(t, []string{"1"}, h2.Get("x-h"))

	assert.Equal(t, 1, o.CountID(chargeMethod, "p1"), "handler runs once")
	cents, n := o.Balance("acct")
	assert.Equal(t, int64(1999), cents)
	assert.Equal(t, 1, n)
	assert.Equal(t, dedupe.Stats{Hits: 1, Misses: 1}, s.Stats())
}

func TestServerWithoutKeyPassesThrough(t *testing.T) {
	o := origin.New(nil)
	s := dedupe.NewServer(dedupe.Config{AllowAnonymous: true})
	c := startEcho(t, o, dedupeOpts(s))
	req := &echov1.ChargeRequest{RequestId: "p", Account: "acct", AmountCents: 5}
	for range 2 {
		_, err := c.Charge(context.Background(), req)
		require.NoError(t, err)
	}
	_, n := o.Balance("acct")
	assert.Equal(t, 2, n)
	assert.Equal(t, dedupe.Stats{}, s.Stats())
}

func TestServerRefusesInvalidKeys(t *testing.T) {
	o := origin.New(nil)
	s := dedupe.NewServer(dedupe.Config{AllowAnonymous: true})
	c := startEcho(t, o, dedupeOpts(s))
	// What grpc lets a client send: printable ASCII (grpc-go itself refuses
	// to send control characters and non-ASCII; see the direct test below).
	for name, md := range map[string]metadata.MD{
		"empty":      metadata.Pairs(idempotency.MetadataKey, ""),
		"too long":   metadata.Pairs(idempotency.MetadataKey, strings.Repeat("k", 256)),
		"huge":       metadata.Pairs(idempotency.MetadataKey, strings.Repeat("k", 64<<10)),
		"space":      metadata.Pairs(idempotency.MetadataKey, "order 1"),
		"two values": metadata.Pairs(idempotency.MetadataKey, "a", idempotency.MetadataKey, "b"),
	} {
		t.Run(name, func(t *testing.T) {
			ctx := metadata.NewOutgoingContext(context.Background(), md)
			_, err := c.Charge(ctx, &echov1.ChargeRequest{RequestId: name, Account: "acct", AmountCents: 1})
			assert.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
			assert.Zero(t, o.CountID(chargeMethod, name), "handler must not run")
		})
	}
	assert.Equal(t, uint64(5), s.Stats().Invalid)
	_, n := o.Balance("acct")
	assert.Zero(t, n)
}

func TestServerConcurrentDuplicates(t *testing.T) {
	g := newGate(t)
	o := origin.New(func(c origin.Call) origin.Reply {
		g.block() // hold the first execution until every duplicate is waiting
		return origin.Reply{Trailer: metadata.Pairs("x-receipt", "r-dup")}
	})
	s := dedupe.NewServer(dedupe.Config{AllowAnonymous: true})
	c := startEcho(t, o, dedupeOpts(s))
	ctx := keyed(context.Background(), idempotency.NewKey())
	req := &echov1.ChargeRequest{RequestId: "dup", Account: "acct", AmountCents: 700}

	const n = 10
	resps := make([]*echov1.ChargeResponse, n)
	trailers := make([]metadata.MD, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { resps[i], errs[i] = c.Charge(ctx, req, grpc.Trailer(&trailers[i])) })
	}
	eventually(t, "one execution and 9 waiters", func() bool {
		st := s.Stats()
		return st.Misses == 1 && st.Waits == n-1
	})
	g.open()
	wg.Wait()

	for i := range n {
		require.NoError(t, errs[i], "call %d", i)
		assert.True(t, proto.Equal(resps[0], resps[i]), "call %d got %v, want %v", i, resps[i], resps[0])
		assert.Equal(t, []string{"r-dup"}, trailers[i].Get("x-receipt"), "call %d", i)
	}
	assert.Equal(t, 1, o.CountID(chargeMethod, "dup"), "handler runs once")
	cents, charges := o.Balance("acct")
	assert.Equal(t, int64(700), cents)
	assert.Equal(t, 1, charges)
	assert.Equal(t, dedupe.Stats{Hits: n - 1, Misses: 1, Waits: n - 1}, s.Stats())
}

func TestServerKeyReuseWithDifferentRequest(t *testing.T) {
	g := newGate(t)
	o := origin.New(func(c origin.Call) origin.Reply {
		if c.RequestID == "slow" {
			g.block()
		}
		return origin.Reply{}
	})
	s := dedupe.NewServer(dedupe.Config{AllowAnonymous: true})
	c := startEcho(t, o, dedupeOpts(s))

	t.Run("completed", func(t *testing.T) {
		ctx := keyed(context.Background(), "reused")
		_, err := c.Charge(ctx, &echov1.ChargeRequest{RequestId: "p", Account: "acct", AmountCents: 100})
		require.NoError(t, err)
		_, err = c.Charge(ctx, &echov1.ChargeRequest{RequestId: "p", Account: "acct", AmountCents: 200})
		assert.Equal(t, codes.InvalidArgument, status.Code(err))
		assert.Contains(t, status.Convert(err).Message(), "different request")
		cents, n := o.Balance("acct")
		assert.Equal(t, int64(100), cents, "never charged with the second payload")
		assert.Equal(t, 1, n)
	})
	t.Run("in flight", func(t *testing.T) {
		ctx := keyed(context.Background(), "reused-in-flight")
		done := make(chan error, 1)
		go func() {
			_, err := c.Charge(ctx, &echov1.ChargeRequest{RequestId: "slow", Account: "other", AmountCents: 1})
			done <- err
		}()
		eventually(t, "first in flight", func() bool { return o.CountID(chargeMethod, "slow") == 1 })
		// Refused at once, without waiting for the first to finish.
		_, err := c.Charge(ctx, &echov1.ChargeRequest{RequestId: "slow", Account: "other", AmountCents: 2})
		assert.Equal(t, codes.InvalidArgument, status.Code(err))
		g.open()
		require.NoError(t, <-done)
		_, n := o.Balance("other")
		assert.Equal(t, 1, n)
	})
	assert.Equal(t, uint64(2), s.Stats().Conflicts)
	assert.Zero(t, s.Stats().Waits)
}

func TestServerKeyReuseWithDifferentMethod(t *testing.T) {
	o := origin.New(nil)
	// Put is IDEMPOTENT in the proto; listing it deduplicates it too.
	s := dedupe.NewServer(dedupe.Config{AllowAnonymous: true, Methods: []string{echov1.EchoService_Put_FullMethodName}})
	c := startEcho(t, o, dedupeOpts(s))
	ctx := keyed(context.Background(), "one-key")
	_, err := c.Charge(ctx, &echov1.ChargeRequest{RequestId: "p", Account: "acct", AmountCents: 1})
	require.NoError(t, err)
	_, err = c.Put(ctx, &echov1.PutRequest{RequestId: "p"})
	assert.Equal(t, codes.InvalidArgument, status.Code(err))
	assert.Contains(t, status.Convert(err).Message(), "another method")
	assert.Zero(t, o.Count(echov1.EchoService_Put_FullMethodName))
	// Notify is not deduplicated: its key is not looked at.
	_, err = c.Notify(ctx, &echov1.NotifyRequest{RequestId: "p"})
	require.NoError(t, err)
	assert.Equal(t, 1, o.Count(echov1.EchoService_Notify_FullMethodName))
	assert.Equal(t, uint64(1), s.Stats().Conflicts)
}

// tenant is a stand-in for an identity from auth info: the x-tenant
// metadata the test client sends.
func tenant(ctx context.Context) string {
	if v := metadata.ValueFromIncomingContext(ctx, "x-tenant"); len(v) == 1 {
		return v[0]
	}
	return ""
}

func TestServerIdentityScoping(t *testing.T) {
	req := &echov1.ChargeRequest{RequestId: "same", Account: "acct", AmountCents: 10}
	as := func(ctx context.Context, who string) context.Context {
		return metadata.AppendToOutgoingContext(keyed(ctx, "guessable-1"), "x-tenant", who)
	}
	t.Run("scoped", func(t *testing.T) {
		o := origin.New(nil)
		s := dedupe.NewServer(dedupe.Config{Identity: tenant})
		c := startEcho(t, o, dedupeOpts(s))
		alice, err := c.Charge(as(context.Background(), "alice"), req)
		require.NoError(t, err)
		bob, err := c.Charge(as(context.Background(), "bob"), req)
		require.NoError(t, err)
		assert.NotEqual(t, alice.GetChargeId(), bob.GetChargeId(), "bob must not get alice's response")
		_, n := o.Balance("acct")
		assert.Equal(t, 2, n, "both ran")
		// Each replays its own.
		again, err := c.Charge(as(context.Background(), "alice"), req)
		require.NoError(t, err)
		assert.True(t, proto.Equal(alice, again))
		again, err = c.Charge(as(context.Background(), "bob"), req)
		require.NoError(t, err)
		assert.True(t, proto.Equal(bob, again))
		_, n = o.Balance("acct")
		assert.Equal(t, 2, n)
	})
	t.Run("unscoped, for contrast", func(t *testing.T) {
		o := origin.New(nil)
		s := dedupe.NewServer(dedupe.Config{AllowAnonymous: true})
		c := startEcho(t, o, dedupeOpts(s))
		alice, err := c.Charge(as(context.Background(), "alice"), req)
		require.NoError(t, err)
		bob, err := c.Charge(as(context.Background(), "bob"), req)
		require.NoError(t, err)
		assert.True(t, proto.Equal(alice, bob), "without Identity the key space is shared")
	})
}

func TestServerRetryableFailureNotStored(t *testing.T) {
	for _, code := range []codes.Code{codes.Unavailable, codes.DeadlineExceeded, codes.ResourceExhausted, codes.Aborted, codes.Canceled} {
		t.Run(code.String(), func(t *testing.T) {
			o := origin.New(origin.FailFirst(1, code))
			s := dedupe.NewServer(dedupe.Config{AllowAnonymous: true})
			c := startEcho(t, o, dedupeOpts(s))
			ctx := keyed(context.Background(), "k")
			req := &echov1.ChargeRequest{RequestId: "p", Account: "acct", AmountCents: 3}
			_, err := c.Charge(ctx, req)
			assert.Equal(t, code, status.Code(err))
			first, err := c.Charge(ctx, req) // the retry executes again
			require.NoError(t, err)
			again, err := c.Charge(ctx, req) // and is then stored
			require.NoError(t, err)
			assert.True(t, proto.Equal(first, again))
			assert.Equal(t, 2, o.CountID(chargeMethod, "p"))
			assert.Equal(t, dedupe.Stats{Hits: 1, Misses: 2, NotStored: 1}, s.Stats())
		})
	}
}

func TestServerOtherFailureStored(t *testing.T) {
	o := origin.New(func(c origin.Call) origin.Reply {
		return origin.Reply{Code: codes.FailedPrecondition, Message: "card declined", Trailer: metadata.Pairs("x-decline", "insufficient_funds")}
	})
	s := dedupe.NewServer(dedupe.Config{AllowAnonymous: true})
	c := startEcho(t, o, dedupeOpts(s))
	ctx := keyed(context.Background(), "k")
	req := &echov1.ChargeRequest{RequestId: "p", Account: "acct", AmountCents: 3}
	for i := range 3 {
		var tr metadata.MD
		_, err := c.Charge(ctx, req, grpc.Trailer(&tr))
		assert.Equal(t, codes.FailedPrecondition, status.Code(err), "call %d", i)
		assert.Equal(t, "card declined", status.Convert(err).Message(), "call %d", i)
		assert.Equal(t, []string{"insufficient_funds"}, tr.Get("x-decline"), "call %d", i)
	}
	assert.Equal(t, 1, o.CountID(chargeMethod, "p"))
	assert.Equal(t, dedupe.Stats{Hits: 2, Misses: 1}, s.Stats())
}

func TestServerWaiterBoundedByDeadline(t *testing.T) {
	g := newGate(t)
	o := origin.New(func(origin.Call) origin.Reply { g.block(); return origin.Reply{} })
	s := dedupe.NewServer(dedupe.Config{AllowAnonymous: true})
	// outcomes receives what the server answered each call, as it leaves
	// the server (the client may give up a moment earlier).
	outcomes := make(chan error, 4)
	observe := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		resp, err := h(ctx, req)
		outcomes <- err
		return resp, err
	}
	c := startEcho(t, o, []grpc.ServerOption{grpc.ChainUnaryInterceptor(observe, s.Unary())})
	ctx := keyed(context.Background(), "k")
	req := &echov1.ChargeRequest{RequestId: "p", Account: "acct", AmountCents: 3}

	first := make(chan error, 1)
	go func() {
		_, err := c.Charge(ctx, req)
		first <- err
	}()
	eventually(t, "first in flight", func() bool { return s.Stats().Misses == 1 })

	dctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	_, err := c.Charge(dctx, req)
	assert.Equal(t, codes.DeadlineExceeded, status.Code(err))
	// The server's wait ended with the caller's deadline, while the first
	// still ran: by the deadline itself, or by the cancellation the client
	// sends when its own timer fires first.
	assert.Contains(t, []codes.Code{codes.DeadlineExceeded, codes.Canceled}, status.Code(<-outcomes))
	assert.Equal(t, uint64(1), s.Stats().Waits)

	g.open()
	require.NoError(t, <-first)
	_, err = c.Charge(ctx, req)
	require.NoError(t, err)
	assert.Equal(t, 1, o.CountID(chargeMethod, "p"))
	st := s.Stats()
	assert.Equal(t, uint64(1), st.Hits)
	assert.Zero(t, st.StoreErrors, "a waiter's own deadline is not a store error")
}

func TestServerWaiterRunsAfterRelease(t *testing.T) {
	g := newGate(t)
	o := origin.New(func(c origin.Call) origin.Reply {
		if c.Attempt == 1 {
			g.block()
			return origin.Reply{Code: codes.Unavailable, Message: "first attempt failed"}
		}
		return origin.Reply{}
	})
	s := dedupe.NewServer(dedupe.Config{AllowAnonymous: true})
	c := startEcho(t, o, dedupeOpts(s))
	ctx := keyed(context.Background(), "k")
	req := &echov1.ChargeRequest{RequestId: "p", Account: "acct", AmountCents: 3}

	first := make(chan error, 1)
	go func() {
		_, err := c.Charge(ctx, req)
		first <- err
	}()
	eventually(t, "first in flight", func() bool { return s.Stats().Misses == 1 })
	second := make(chan error, 1)
	go func() {
		_, err := c.Charge(ctx, req)
		second <- err
	}()
	eventually(t, "duplicate waiting", func() bool { return s.Stats().Waits == 1 })
	g.open()
	assert.Equal(t, codes.Unavailable, status.Code(<-first))
	require.NoError(t, <-second, "the waiter re-claims and runs the handler")
	assert.Equal(t, 2, o.CountID(chargeMethod, "p"))
	_, n := o.Balance("acct")
	assert.Equal(t, 1, n)
	assert.Equal(t, dedupe.Stats{Misses: 2, Waits: 1, NotStored: 1}, s.Stats())
}

func TestServerBusyStore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) { // real gRPC over bufconn; time passes when the test sleeps
		g := newGate(t)
		o := origin.New(func(c origin.Call) origin.Reply {
			if c.RequestID == "slow" {
				g.block()
			}
			return origin.Reply{}
		})
		store := dedupe.NewMemoryStore(dedupe.MemoryConfig{MaxEntries: 1})
		s := dedupe.NewServer(dedupe.Config{AllowAnonymous: true, Store: store})
		c := startEcho(t, o, dedupeOpts(s))
		first := make(chan error, 1)
		go func() {
			_, err := c.Charge(keyed(context.Background(), "a"), &echov1.ChargeRequest{RequestId: "slow"})
			first <- err
		}()
		eventually(t, "first in flight", func() bool { return s.Stats().Misses == 1 })
		refused := func(want time.Duration) {
			t.Helper()
			var tr metadata.MD
			_, err := c.Charge(keyed(context.Background(), "b"), &echov1.ChargeRequest{RequestId: "other"}, grpc.Trailer(&tr))
			assert.Equal(t, codes.ResourceExhausted, status.Code(err))
			assert.Equal(t, []string{strconv.FormatInt(want.Milliseconds(), 10)}, tr.Get("grpc-retry-pushback-ms"))
			var info *errdetails.RetryInfo
			for _, d := range status.Convert(err).Details() {
				if ri, ok := d.(*errdetails.RetryInfo); ok {
					info = ri
				}
			}
			require.NotNil(t, info, "a RetryInfo says when to come back")
			assert.Equal(t, want, info.GetRetryDelay().AsDuration())
			assert.Zero(t, o.CountID(chargeMethod, "other"))
		}
		refused(time.Second) // the room is held by a request in flight
		g.open()
		require.NoError(t, <-first)
		time.Sleep(20 * time.Second)
		refused(dedupe.DefaultRetryHorizon - 20*time.Second) // by a record younger than the retry horizon
		time.Sleep(dedupe.DefaultRetryHorizon)
		_, err := c.Charge(keyed(context.Background(), "b"), &echov1.ChargeRequest{RequestId: "other"})
		require.NoError(t, err, "room again once the first is past the retry horizon")
		assert.Equal(t, uint64(2), store.Stats().OverQuota)
		assert.Equal(t, uint64(1), store.Stats().Evictions, "the first record made room for the second key")
		assert.Equal(t, uint64(2), s.Stats().Full)
		assert.Zero(t, s.Stats().StoreErrors)
	})
}

func TestServerStreamsPassThrough(t *testing.T) {
	o := origin.New(nil)
	s := dedupe.NewServer(dedupe.Config{AllowAnonymous: true})
	c := startEcho(t, o, dedupeOpts(s))
	for range 2 {
		ls, err := c.List(keyed(context.Background(), "k"), &echov1.ListRequest{RequestId: "l", Count: 2})
		require.NoError(t, err)
		for {
			if _, err := ls.Recv(); errors.Is(err, io.EOF) {
				break
			} else {
				require.NoError(t, err)
			}
		}
	}
	assert.Equal(t, 2, o.CountID(echov1.EchoService_List_FullMethodName, "l"))
	assert.Equal(t, dedupe.Stats{}, s.Stats())
}

// The tests below call the interceptor directly, for what a grpc client
// cannot send or a demo service cannot do.

// fakeStream is the grpc.ServerTransportStream grpc puts in a handler's
// context.
type fakeStream struct {
	method          string
	header, trailer metadata.MD
}

func (f *fakeStream) Method() string { return f.method }
func (f *fakeStream) SetHeader(md metadata.MD) error {
	f.header = metadata.Join(f.header, md)
	return nil
}
func (f *fakeStream) SendHeader(md metadata.MD) error { return f.SetHeader(md) }
func (f *fakeStream) SetTrailer(md metadata.MD) error {
	f.trailer = metadata.Join(f.trailer, md)
	return nil
}

// direct calls s's unary interceptor as grpc would, with incoming md.
func direct(s *dedupe.Server, method string, md metadata.MD, req any, h grpc.UnaryHandler) (any, *fakeStream, error) {
	fs := &fakeStream{method: method}
	ctx := grpc.NewContextWithServerTransportStream(metadata.NewIncomingContext(context.Background(), md), fs)
	resp, err := s.Unary()(ctx, req, &grpc.UnaryServerInfo{FullMethod: method}, h)
	return resp, fs, err
}

func keyMD(key string) metadata.MD { return metadata.MD{idempotency.MetadataKey: {key}} }

func TestServerRefusesUnsendableKeys(t *testing.T) {
	s := dedupe.NewServer(dedupe.Config{AllowAnonymous: true})
	ran := false
	h := func(context.Context, any) (any, error) { ran = true; return &echov1.ChargeResponse{}, nil }
	for _, k := range []string{"a\nb", "\x00", "\x7f", "ключ", "tab\t"} {
		_, _, err := direct(s, chargeMethod, keyMD(k), &echov1.ChargeRequest{}, h)
		assert.Equal(t, codes.InvalidArgument, status.Code(err), "%q", k)
	}
	assert.False(t, ran)
}

func TestServerHandlerPanicReleases(t *testing.T) {
	s := dedupe.NewServer(dedupe.Config{AllowAnonymous: true})
	req := &echov1.ChargeRequest{RequestId: "p"}
	assert.PanicsWithValue(t, "boom", func() {
		_, _, _ = direct(s, chargeMethod, keyMD("k"), req, func(context.Context, any) (any, error) { panic("boom") })
	})
	runs := 0
	h := func(context.Context, any) (any, error) { runs++; return &echov1.ChargeResponse{ChargeId: "c"}, nil }
	for range 2 {
		resp, _, err := direct(s, chargeMethod, keyMD("k"), req, h)
		require.NoError(t, err)
		assert.Equal(t, "c", resp.(*echov1.ChargeResponse).GetChargeId())
	}
	assert.Equal(t, 1, runs, "the retry after the panic runs, and is then stored")
	assert.Equal(t, dedupe.Stats{Hits: 1, Misses: 2, NotStored: 1}, s.Stats())
}

func TestServerReplaysStatusDetails(t *testing.T) {
	s := dedupe.NewServer(dedupe.Config{AllowAnonymous: true})
	st, err := status.New(codes.FailedPrecondition, "declined").WithDetails(wrapperspb.String("insufficient_funds"))
	require.NoError(t, err)
	h := func(ctx context.Context, _ any) (any, error) {
		_ = grpc.SendHeader(ctx, metadata.Pairs("x-h", "sent"))
		_ = grpc.SetTrailer(ctx, metadata.Pairs("x-t", "1"))
		return nil, st.Err()
	}
	req := &echov1.ChargeRequest{RequestId: "p"}
	_, fs1, err1 := direct(s, chargeMethod, keyMD("k"), req, h)
	_, fs2, err2 := direct(s, chargeMethod, keyMD("k"), req, func(context.Context, any) (any, error) {
		t.Fatal("handler ran twice")
		return nil, nil
	})
	assert.True(t, proto.Equal(status.Convert(err1).Proto(), status.Convert(err2).Proto()), "%v vs %v", err1, err2)
	require.Len(t, status.Convert(err2).Details(), 1)
	assert.True(t, proto.Equal(wrapperspb.String("insufficient_funds"), status.Convert(err2).Details()[0].(proto.Message)))
	assert.Equal(t, fs1.header, fs2.header)
	assert.Equal(t, fs1.trailer, fs2.trailer)
	assert.Equal(t, []string{"sent"}, fs2.header.Get("x-h"))
}

func TestServerHandlerErrorsAsGrpcSeesThem(t *testing.T) {
	s := dedupe.NewServer(dedupe.Config{AllowAnonymous: true})
	req := &echov1.ChargeRequest{}
	// A plain error is stored as Unknown; a raw context error is
	// DeadlineExceeded, so not stored.
	_, _, err := direct(s, chargeMethod, keyMD("plain"), req, func(context.Context, any) (any, error) { return nil, errors.New("db broke") })
	assert.Equal(t, codes.Unknown, status.Code(err))
	_, _, err = direct(s, chargeMethod, keyMD("plain"), req, nil) // nil handler: must not run
	assert.Equal(t, codes.Unknown, status.Code(err))
	assert.Equal(t, "db broke", status.Convert(err).Message())

	_, _, err = direct(s, chargeMethod, keyMD("ctx"), req, func(context.Context, any) (any, error) { return nil, context.DeadlineExceeded })
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	ran := false
	_, _, err = direct(s, chargeMethod, keyMD("ctx"), req, func(context.Context, any) (any, error) { ran = true; return &echov1.ChargeResponse{}, nil })
	require.NoError(t, err)
	assert.True(t, ran)
}

func TestServerUnknownMethodLearnsOutputType(t *testing.T) {
	store := dedupe.NewMemoryStore(dedupe.MemoryConfig{})
	const method = "/unknown.v1.Svc/Do"
	s := dedupe.NewServer(dedupe.Config{AllowAnonymous: true, Store: store, Methods: []string{method}})
	h := func(context.Context, any) (any, error) { return wrapperspb.String("out"), nil }
	_, _, err := direct(s, method, keyMD("k"), wrapperspb.String("in"), h)
	require.NoError(t, err)
	resp, _, err := direct(s, method, keyMD("k"), wrapperspb.String("in"), nil)
	require.NoError(t, err)
	assert.True(t, proto.Equal(wrapperspb.String("out"), resp.(proto.Message)))

	// A server that never saw a response of an unknown method cannot
	// rebuild one: it says so rather than guessing.
	fresh := dedupe.NewServer(dedupe.Config{AllowAnonymous: true, Store: store, Methods: []string{method}})
	_, _, err = direct(fresh, method, keyMD("k"), wrapperspb.String("in"), nil)
	assert.Equal(t, codes.Internal, status.Code(err))
}

func TestServerNonProtoRequest(t *testing.T) {
	s := dedupe.NewServer(dedupe.Config{AllowAnonymous: true})
	_, _, err := direct(s, chargeMethod, keyMD("k"), struct{}{}, nil)
	assert.Equal(t, codes.Internal, status.Code(err))
}

// failingStore fails every call with err.
type failingStore struct{ err error }

func (f failingStore) Claim(context.Context, dedupe.Scope, dedupe.Fingerprint) (dedupe.Claim, error) {
	return dedupe.Claim{}, f.err
}
func (f failingStore) Complete(context.Context, dedupe.Claim, *dedupe.Record) error {
	return f.err
}
func (f failingStore) Release(context.Context, dedupe.Claim) error { return f.err }
func (f failingStore) Wait(context.Context, dedupe.Claim) (*dedupe.Record, error) {
	return nil, f.err
}

// Store errors fail closed: the caller is refused with Unavailable and a
// pushback, and the handler never runs unguarded. A store's own refusal
// for want of room keeps its code, with a pushback.
func TestServerStoreErrors(t *testing.T) {
	for _, tc := range []struct {
		err      error
		want     codes.Code
		pushback string
	}{
		{errors.New("redis: connection refused"), codes.Unavailable, "1000"},
		{status.Error(codes.PermissionDenied, "NOPERM this user has no permissions to run the 'eval' command"), codes.Unavailable, "1000"},
		{status.Error(codes.Internal, "store bug"), codes.Unavailable, "1000"},
		{context.DeadlineExceeded, codes.Unavailable, "1000"}, // the store's own timeout, not the caller's
		{status.Error(codes.ResourceExhausted, "full"), codes.ResourceExhausted, "1000"},
	} {
		t.Run(tc.err.Error(), func(t *testing.T) {
			o := origin.New(nil)
			s := dedupe.NewServer(dedupe.Config{AllowAnonymous: true, Store: failingStore{tc.err}})
			c := startEcho(t, o, dedupeOpts(s))
			var tr metadata.MD
			_, err := c.Charge(keyed(context.Background(), "k"), &echov1.ChargeRequest{RequestId: "p"}, grpc.Trailer(&tr))
			assert.Equal(t, tc.want, status.Code(err), "%v", err)
			assert.Equal(t, []string{tc.pushback}, tr.Get("grpc-retry-pushback-ms"))
			assert.Zero(t, o.Total(), "the handler never runs unguarded")
			st := s.Stats()
			assert.Equal(t, uint64(1), st.StoreErrors+st.Full)
		})
	}
}

// flakyStore is a MemoryStore whose Wait and Complete fail on demand.
type flakyStore struct {
	*dedupe.MemoryStore
	waitErr, completeErr error
}

func (f *flakyStore) Wait(ctx context.Context, c dedupe.Claim) (*dedupe.Record, error) {
	if f.waitErr != nil {
		return nil, f.waitErr
	}
	return f.MemoryStore.Wait(ctx, c)
}

func (f *flakyStore) Complete(ctx context.Context, c dedupe.Claim, rec *dedupe.Record) error {
	if f.completeErr != nil {
		return f.completeErr
	}
	return f.MemoryStore.Complete(ctx, c, rec)
}

func TestServerStoreFailsWhileWaiting(t *testing.T) {
	g := newGate(t)
	o := origin.New(func(origin.Call) origin.Reply { g.block(); return origin.Reply{} })
	store := &flakyStore{MemoryStore: dedupe.NewMemoryStore(dedupe.MemoryConfig{}), waitErr: errors.New("redis: i/o timeout")}
	s := dedupe.NewServer(dedupe.Config{AllowAnonymous: true, Store: store})
	c := startEcho(t, o, dedupeOpts(s))
	req := &echov1.ChargeRequest{RequestId: "p", Account: "acct", AmountCents: 3}
	first := make(chan error, 1)
	go func() {
		_, err := c.Charge(keyed(context.Background(), "k"), req)
		first <- err
	}()
	eventually(t, "first in flight", func() bool { return s.Stats().Misses == 1 })
	var tr metadata.MD
	_, err := c.Charge(keyed(context.Background(), "k"), req, grpc.Trailer(&tr))
	assert.Equal(t, codes.Unavailable, status.Code(err))
	assert.Equal(t, []string{"1000"}, tr.Get("grpc-retry-pushback-ms"))
	g.open()
	require.NoError(t, <-first)
	assert.Equal(t, 1, o.CountID(chargeMethod, "p"), "the waiter did not run the handler")
	assert.Equal(t, uint64(1), s.Stats().StoreErrors)
}

// When the outcome cannot be stored, the caller still gets it.
func TestServerStoreFailsToComplete(t *testing.T) {
	o := origin.New(nil)
	store := &flakyStore{MemoryStore: dedupe.NewMemoryStore(dedupe.MemoryConfig{}), completeErr: errors.New("redis: connection reset")}
	s := dedupe.NewServer(dedupe.Config{AllowAnonymous: true, Store: store})
	c := startEcho(t, o, dedupeOpts(s))
	resp, err := c.Charge(keyed(context.Background(), "k"), &echov1.ChargeRequest{RequestId: "p", Account: "acct", AmountCents: 3})
	require.NoError(t, err)
	assert.Equal(t, "ch_1", resp.GetChargeId())
	assert.Equal(t, dedupe.Stats{Misses: 1, StoreErrors: 1}, s.Stats())
}

// TestRefusedKeepsTheStatusAndDeduplicatesSaysWhich: Refused marks an
// error without changing what grpc sends, and Deduplicates says which
// methods the interceptors deduplicate.
func TestRefusedKeepsTheStatusAndDeduplicatesSaysWhich(t *testing.T) {
	assert.NoError(t, dedupe.Refused(nil))
	st, err := status.New(codes.Unavailable, "shed").WithDetails(&errdetails.ErrorInfo{Reason: "OVERLOADED"})
	require.NoError(t, err)
	marked := dedupe.Refused(st.Err())
	got, ok := status.FromError(marked)
	require.True(t, ok)
	assert.Equal(t, codes.Unavailable, got.Code())
	assert.Equal(t, "shed", got.Message())
	assert.Len(t, got.Details(), 1)
	assert.ErrorIs(t, marked, st.Err())

	s := dedupe.NewServer(dedupe.Config{Methods: []string{"/other.Svc/Write"}})
	assert.True(t, s.Deduplicates(echov1.EchoService_Charge_FullMethodName), "retry_with_key")
	assert.False(t, s.Deduplicates(echov1.EchoService_Put_FullMethodName), "idempotent, no key")
	assert.True(t, s.Deduplicates("/other.Svc/Write"), "listed")
	assert.False(t, s.Deduplicates("/other.Svc/Read"))
}
