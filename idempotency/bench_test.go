package idempotency_test

import (
	"context"
	"strconv"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	echov1 "github.com/stormguard/stormguard/examples/proto/echo/v1"
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/internal/origin"
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
	u := idempotency.NewServer(idempotency.ServerConfig{}).Unary()
	ctx := benchCtx(metadata.Pairs("x-request-id", "1", "user-agent", "bench"))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := u(ctx, benchReq, benchInfo, benchHandler); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkServerHit(b *testing.B) {
	s := idempotency.NewServer(idempotency.ServerConfig{})
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

// BenchmarkServerMiss cycles through 4096 keys in a store of 1024 entries:
// every call is first sight of its key (the key was evicted since), and
// completing it evicts the least recently used record, the steady state
// of a full store.
func BenchmarkServerMiss(b *testing.B) {
	s := idempotency.NewServer(idempotency.ServerConfig{Store: idempotency.NewMemoryStore(idempotency.MemoryConfig{MaxEntries: 1024})})
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

func benchClient(b *testing.B, dedupe bool) echov1.EchoServiceClient {
	var opts []grpc.ServerOption
	if dedupe {
		opts = dedupeOpts(idempotency.NewServer(idempotency.ServerConfig{}))
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
