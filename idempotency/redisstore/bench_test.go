package redisstore_test

import (
	"context"
	"strconv"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/dedupe"
	"github.com/stormguard/stormguard/idempotency/redisstore"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// benchStores are the stores the benchmarks compare, each large enough
// for any b.N of a benchmark run.
func benchStores(b *testing.B) []struct {
	name string
	new  func(b *testing.B) dedupe.Store
} {
	return []struct {
		name string
		new  func(b *testing.B) dedupe.Store
	}{
		{"memory", func(*testing.B) dedupe.Store {
			return dedupe.NewMemoryStore(dedupe.MemoryConfig{MaxEntries: 1 << 22, MaxEntriesPerIdentity: 1 << 22,
				MaxBytes: 1 << 30, MaxBytesPerIdentity: 1 << 30})
		}},
		{"redis", func(b *testing.B) dedupe.Store {
			rc := client(b, sharedAddr(b))
			b.Cleanup(func() { rc.FlushDB(context.Background()) })
			return primed(b, redisstore.Config{Client: rc, Prefix: prefix(b), MaxEntries: 1 << 22,
				MaxEntriesPerIdentity: 1 << 22, MaxBytes: 200 << 20, MaxBytesPerIdentity: 200 << 20})
		}},
	}
}

// BenchmarkKeyedCharge is one keyed Charge over real gRPC (bufconn), one
// at a time, through the dedupe server interceptor with each store: a miss
// (a new key: claim, handler, complete) and a hit (a key already
// completed: claim, replay). "none" is the same call without the
// interceptor: the difference is the added latency.
func BenchmarkKeyedCharge(b *testing.B) {
	o := origin.New(nil)
	serve := func(b *testing.B, opts ...grpc.ServerOption) echov1.EchoServiceClient {
		l := origin.Bufconn()
		srv := origin.Serve(l, o, opts...)
		cc, err := l.Dial()
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = cc.Close(); srv.Stop() })
		return echov1.NewEchoServiceClient(cc)
	}
	req := &echov1.ChargeRequest{RequestId: "r", Account: "acct", AmountCents: 1}
	base := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer bench")
	b.Run("none", func(b *testing.B) {
		c := serve(b)
		ctx := metadata.AppendToOutgoingContext(base, idempotency.MetadataKey, "k")
		b.ReportAllocs()
		for b.Loop() {
			if _, err := c.Charge(ctx, req); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, st := range benchStores(b) {
		b.Run(st.name+"/miss", func(b *testing.B) {
			d := dedupe.NewServer(dedupe.Config{Store: st.new(b)})
			c := serve(b, grpc.ChainUnaryInterceptor(d.Unary()))
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				i++
				ctx := metadata.AppendToOutgoingContext(base, idempotency.MetadataKey, "miss-"+strconv.Itoa(i))
				if _, err := c.Charge(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
			if s := d.Stats(); s.Misses != uint64(i) {
				b.Fatalf("%+v after %d calls", s, i)
			}
		})
		b.Run(st.name+"/hit", func(b *testing.B) {
			d := dedupe.NewServer(dedupe.Config{Store: st.new(b)})
			c := serve(b, grpc.ChainUnaryInterceptor(d.Unary()))
			ctx := metadata.AppendToOutgoingContext(base, idempotency.MetadataKey, "hit")
			if _, err := c.Charge(ctx, req); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.Charge(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
			if s := d.Stats(); s.Misses != 1 {
				b.Fatalf("%+v", s)
			}
		})
	}
}

// BenchmarkStore is the store alone: Claim and Complete of a new key
// (miss), and Claim of a completed one (hit).
func BenchmarkStore(b *testing.B) {
	ctx := context.Background()
	for _, st := range benchStores(b) {
		b.Run(st.name+"/miss", func(b *testing.B) {
			s := st.new(b)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				i++
				sc := dedupe.Scope{Identity: "bench", Key: "miss-" + strconv.Itoa(i)}
				c, err := s.Claim(ctx, sc, fp("r"))
				if err != nil || c.State != dedupe.Owned {
					b.Fatal(c.State, err)
				}
				if err := s.Complete(ctx, c, &dedupe.Record{Fingerprint: fp("r"), Response: []byte("charged")}); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(st.name+"/hit", func(b *testing.B) {
			s := st.new(b)
			sc := dedupe.Scope{Identity: "bench", Key: "hit"}
			c, err := s.Claim(ctx, sc, fp("r"))
			if err != nil {
				b.Fatal(err)
			}
			if err := s.Complete(ctx, c, &dedupe.Record{Fingerprint: fp("r"), Response: []byte("charged")}); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				c, err := s.Claim(ctx, sc, fp("r"))
				if err != nil || c.State != dedupe.Done {
					b.Fatal(c.State, err)
				}
			}
		})
	}
}

// BenchmarkPing is one Redis round trip on loopback, for scale.
func BenchmarkPing(b *testing.B) {
	rc := client(b, sharedAddr(b))
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if err := rc.Ping(ctx).Err(); err != nil {
			b.Fatal(err)
		}
	}
}
