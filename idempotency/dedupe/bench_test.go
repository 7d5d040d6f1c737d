package dedupe_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/dedupe"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// The interceptor on its own, called as grpc calls it (a transport stream
// in the context, incoming metadata, a handler that answers at once).

func benchCtx(md metadata.MD) context.Context {
	return grpc.NewContextWithServerTransportStream(metadata.NewIncomingContext(context.Background(), md), &fakeStream{method: chargeMethod})
}

var (
	benchReq  = &echov1.ChargeRequest{RequestId: "bench-request-0001", Account: "acct-1", AmountCents: 4999}
	benchResp = &echov1.ChargeResponse{RequestId: "bench-request-0001", ChargeId: "ch_1", BalanceCents: 4999}
	benchInfo = &grpc.UnaryServerInfo{FullMethod: chargeMethod}
)

func benchHandler(context.Context, any) (any, error) { return benchResp, nil }

func BenchmarkServerNoKey(b *testing.B) {
	u := dedupe.NewServer(dedupe.Config{AllowAnonymous: true}).Unary()
	ctx := benchCtx(metadata.Pairs("x-request-id", "1", "user-agent", "bench"))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := u(ctx, benchReq, benchInfo, benchHandler); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkServerHit(b *testing.B) {
	s := dedupe.NewServer(dedupe.Config{AllowAnonymous: true})
	u := s.Unary()
	ctx := benchCtx(metadata.Pairs(idempotency.MetadataKey, idempotency.NewKey(), "user-agent", "bench"))
	if _, err := u(ctx, benchReq, benchInfo, benchHandler); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := u(ctx, benchReq, benchInfo, nil); err != nil { // nil: the handler must not run
			b.Fatal(err)
		}
	}
	if st := s.Stats(); st.Misses != 1 {
		b.Fatalf("%+v", st)
	}
}

// BenchmarkServerPassThrough: a keyed read (Get, NO_SIDE_EFFECTS) is not
// deduplicated: one cached method lookup.
func BenchmarkServerPassThrough(b *testing.B) {
	u := dedupe.NewServer(dedupe.Config{}).Unary()
	ctx := benchCtx(metadata.Pairs(idempotency.MetadataKey, idempotency.NewKey(), "user-agent", "bench"))
	info := &grpc.UnaryServerInfo{FullMethod: echov1.EchoService_Get_FullMethodName}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := u(ctx, benchReq, info, benchHandler); err != nil {
			b.Fatal(err)
		}
	}
}

// benchHitAs is BenchmarkServerHit for a caller whose identity ctx
// carries: the cost of DefaultIdentity on every keyed request.
func benchHitAs(b *testing.B, ctx context.Context) {
	s := dedupe.NewServer(dedupe.Config{})
	u := s.Unary()
	if _, err := u(ctx, benchReq, benchInfo, benchHandler); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := u(ctx, benchReq, benchInfo, nil); err != nil {
			b.Fatal(err)
		}
	}
	if st := s.Stats(); st.Misses != 1 {
		b.Fatalf("%+v", st)
	}
}

// BenchmarkServerHitAuthorization: the caller sends a bearer token of
// about the size of a JWT (800 bytes).
func BenchmarkServerHitAuthorization(b *testing.B) {
	token := "Bearer " + strings.Repeat("eyJhbGciOiJSUzI1NiJ9", 40)
	benchHitAs(b, benchCtx(metadata.Pairs(idempotency.MetadataKey, idempotency.NewKey(), "authorization", token)))
}

// BenchmarkServerHitTLS: the caller presented a TLS client certificate.
func BenchmarkServerHitTLS(b *testing.B) {
	pki := newTestPKI(b)
	cert, err := x509.ParseCertificate(pki.issue("client", false).Certificate[0])
	if err != nil {
		b.Fatal(err)
	}
	ctx := peer.NewContext(benchCtx(metadata.Pairs(idempotency.MetadataKey, idempotency.NewKey())),
		&peer.Peer{AuthInfo: credentials.TLSInfo{State: tls.ConnectionState{PeerCertificates: []*x509.Certificate{cert, pki.ca}}}})
	benchHitAs(b, ctx)
}

// benchStore returns a store of n entries for one identity that protects
// no record by a retry horizon: in a full store, each new key evicts the
// oldest record, as a store in its steady state does (rather than refusing
// the key because the records are young).
func benchStore(n int) *dedupe.MemoryStore {
	return dedupe.NewMemoryStore(dedupe.MemoryConfig{
		MaxEntries: n, MaxEntriesPerIdentity: n, MaxBytesPerIdentity: dedupe.DefaultMaxBytes,
		TTL: 1 << 62, RetryHorizon: -1,
	})
}

// BenchmarkServerMiss cycles through 4096 keys in a store of 1024 entries:
// every call is first sight of its key (the key was evicted since), and
// completing it evicts the least recently used record, the steady state
// of a full store.
func BenchmarkServerMiss(b *testing.B) {
	s := dedupe.NewServer(dedupe.Config{AllowAnonymous: true, Store: benchStore(1024)})
	u := s.Unary()
	ctxs := make([]context.Context, 4096)
	for i := range ctxs {
		ctxs[i] = benchCtx(metadata.Pairs(idempotency.MetadataKey, idempotency.NewKey(), "user-agent", "bench"))
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, err := u(ctxs[i%len(ctxs)], benchReq, benchInfo, benchHandler); err != nil {
			b.Fatal(err)
		}
		i++
	}
	if st := s.Stats(); st.Hits != 0 {
		b.Fatalf("%+v", st)
	}
}

// The same over real grpc on bufconn, end to end (client, transport,
// server), for scale.

func benchClient(b *testing.B, withDedupe bool) echov1.EchoServiceClient {
	var opts []grpc.ServerOption
	if withDedupe {
		opts = dedupeOpts(dedupe.NewServer(dedupe.Config{AllowAnonymous: true, Store: benchStore(dedupe.DefaultMaxEntries)}))
	}
	return startEcho(b, origin.New(nil), opts)
}

func BenchmarkBufconnNoDedupe(b *testing.B) {
	c := benchClient(b, false)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Charge(ctx, benchReq); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkBufconnHit(b *testing.B) {
	c := benchClient(b, true)
	// One key for every call: all but the first are replays.
	ctx := keyed(context.Background(), idempotency.NewKey())
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Charge(ctx, benchReq); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkBufconnMiss(b *testing.B) {
	c := benchClient(b, true)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++ // a new key per call: 2 of the allocations are the client's
		if _, err := c.Charge(keyed(context.Background(), "bench-"+strconv.Itoa(i)), benchReq); err != nil {
			b.Fatal(err)
		}
	}
}

// The stream interceptor on its own, on a server-streaming List whose
// handler sends benchListCount responses.

const benchListCount = 3

var benchListReq = &echov1.ListRequest{RequestId: "bench-request-0001", Count: benchListCount}

func benchListHandler(_ any, ss grpc.ServerStream) error {
	req := new(echov1.ListRequest)
	if err := ss.RecvMsg(req); err != nil {
		return err
	}
	for i := range req.GetCount() {
		if err := ss.SendMsg(&echov1.ListResponse{RequestId: req.GetRequestId(), Index: i, Payload: []byte("payload")}); err != nil {
			return err
		}
	}
	return nil
}

// noopStreamHandler stands for a handler, so that a pass-through benchmark
// measures the interceptor alone.
func noopStreamHandler(any, grpc.ServerStream) error { return nil }

// benchStream runs the stream interceptor of c on a List stream with
// incoming md, b.N times, and checks that each call sent want responses.
func benchStream(b *testing.B, c dedupe.Config, md metadata.MD, h grpc.StreamHandler, want int) *dedupe.Server {
	s := dedupe.NewServer(c)
	st := s.Stream()
	ctx := grpc.NewContextWithServerTransportStream(metadata.NewIncomingContext(context.Background(), md), &fakeStream{method: listMethod})
	f := &fakeServerStream{ctx: ctx, req: benchListReq}
	call := func() {
		f.recvd, f.sent = false, f.sent[:0]
		if err := st(nil, f, serverStreaming, h); err != nil {
			b.Fatal(err)
		}
		if len(f.sent) != want {
			b.Fatalf("sent %d, want %d", len(f.sent), want)
		}
	}
	call() // the first call of a keyed stream runs the handler and stores it
	b.ReportAllocs()
	for b.Loop() {
		call()
	}
	return s
}

// BenchmarkStreamPassThrough: no Streams configured; a keyed stream.
func BenchmarkStreamPassThrough(b *testing.B) {
	benchStream(b, dedupe.Config{AllowAnonymous: true}, metadata.Pairs(idempotency.MetadataKey, idempotency.NewKey()), noopStreamHandler, 0)
}

// BenchmarkStreamNotOptedIn: Streams lists other methods; a keyed List
// passes through.
func BenchmarkStreamNotOptedIn(b *testing.B) {
	c := dedupe.Config{AllowAnonymous: true, Methods: []string{"/other.v1.Svc/", echov1.EchoService_Chat_FullMethodName}}
	benchStream(b, c, metadata.Pairs(idempotency.MetadataKey, idempotency.NewKey()), noopStreamHandler, 0)
}

// BenchmarkStreamNoKey: List is opted in; the stream carries no key.
func BenchmarkStreamNoKey(b *testing.B) {
	c := dedupe.Config{AllowAnonymous: true, Methods: []string{listMethod}}
	benchStream(b, c, metadata.Pairs("x-request-id", "1", "user-agent", "bench"), noopStreamHandler, 0)
}

// BenchmarkStreamHandlerAlone is the bench List handler without
// deduplication (no Streams), for comparison with a hit, which replaces it.
func BenchmarkStreamHandlerAlone(b *testing.B) {
	benchStream(b, dedupe.Config{AllowAnonymous: true}, nil, benchListHandler, benchListCount)
}

// BenchmarkStreamHit: every call after the first is a replay of its 3
// responses; the handler must not run.
func BenchmarkStreamHit(b *testing.B) {
	c := dedupe.Config{AllowAnonymous: true, Methods: []string{listMethod}}
	ran := false
	h := func(srv any, ss grpc.ServerStream) error {
		if ran {
			b.Fatal("handler ran twice")
		}
		ran = true
		return benchListHandler(srv, ss)
	}
	s := benchStream(b, c, metadata.Pairs(idempotency.MetadataKey, idempotency.NewKey(), "user-agent", "bench"), h, benchListCount)
	if st := s.Stats(); st.Misses != 1 {
		b.Fatalf("%+v", st)
	}
}

// BenchmarkStreamMiss: a new key per call (in a store of 1024 entries, so
// each completion evicts the least recently used record): read, claim,
// run and record.
func BenchmarkStreamMiss(b *testing.B) {
	s := dedupe.NewServer(dedupe.Config{
		AllowAnonymous: true,
		Methods:        []string{listMethod},
		Store:          benchStore(1024),
	})
	st := s.Stream()
	ctxs := make([]context.Context, 4096)
	for i := range ctxs {
		ctxs[i] = grpc.NewContextWithServerTransportStream(metadata.NewIncomingContext(context.Background(),
			metadata.Pairs(idempotency.MetadataKey, idempotency.NewKey(), "user-agent", "bench")), &fakeStream{method: listMethod})
	}
	f := &fakeServerStream{req: benchListReq}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		f.ctx, f.recvd, f.sent = ctxs[i%len(ctxs)], false, f.sent[:0]
		if err := st(nil, f, serverStreaming, benchListHandler); err != nil {
			b.Fatal(err)
		}
		i++
	}
	if st := s.Stats(); st.Hits != 0 {
		b.Fatalf("%+v", st)
	}
}

// The stream interceptor over real grpc on bufconn, end to end.

func benchList(b *testing.B, c echov1.EchoServiceClient, ctx context.Context) {
	b.ReportAllocs()
	for b.Loop() {
		ls, err := c.List(ctx, benchListReq)
		if err != nil {
			b.Fatal(err)
		}
		n := 0
		for {
			if _, err := ls.Recv(); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				b.Fatal(err)
			}
			n++
		}
		if n != benchListCount {
			b.Fatalf("received %d", n)
		}
	}
}

func BenchmarkBufconnStreamNoDedupe(b *testing.B) {
	benchList(b, startEcho(b, origin.New(nil), nil), keyed(context.Background(), idempotency.NewKey()))
}

func BenchmarkBufconnStreamHit(b *testing.B) {
	s := dedupe.NewServer(dedupe.Config{AllowAnonymous: true, Methods: []string{listMethod}})
	benchList(b, startEcho(b, origin.New(nil), dedupeOpts(s)), keyed(context.Background(), idempotency.NewKey()))
	if st := s.Stats(); st.Misses != 1 {
		b.Fatalf("%+v", st)
	}
}
