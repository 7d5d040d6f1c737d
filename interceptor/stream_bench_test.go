package interceptor_test

import (
	"context"
	"testing"

	"google.golang.org/grpc"

	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// BenchmarkStream100 measures a server stream of 100 messages and a bidi
// ping-pong of 100 messages over bufconn, bare and through the suite.
func BenchmarkStream100(b *testing.B) {
	o := origin.New(nil)
	l := origin.Bufconn()
	srv := origin.Serve(l, o)
	defer srv.Stop()
	for _, mode := range []string{"bare", "suite"} {
		var opts []grpc.DialOption
		if mode == "suite" {
			opts = append(opts, grpc.WithChainStreamInterceptor(interceptor.NewClient(noopProviders()...).Stream()))
		}
		cc, err := l.Dial(opts...)
		if err != nil {
			b.Fatal(err)
		}
		c := echov1.NewEchoServiceClient(cc)
		ctx := context.Background()
		b.Run("server-stream/"+mode, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				s, err := c.List(ctx, &echov1.ListRequest{Count: 100})
				if err != nil {
					b.Fatal(err)
				}
				n := 0
				for {
					if _, err := s.Recv(); err != nil {
						break
					}
					n++
				}
				if n != 100 {
					b.Fatalf("got %d messages", n)
				}
			}
		})
		b.Run("bidi-pingpong/"+mode, func(b *testing.B) {
			b.ReportAllocs()
			msg := &echov1.ChatRequest{}
			for b.Loop() {
				s, err := c.Chat(ctx)
				if err != nil {
					b.Fatal(err)
				}
				for range 100 {
					if err := s.Send(msg); err != nil {
						b.Fatal(err)
					}
					if _, err := s.Recv(); err != nil {
						b.Fatal(err)
					}
				}
				if err := s.CloseSend(); err != nil {
					b.Fatal(err)
				}
				if _, err := s.Recv(); err == nil {
					b.Fatal("expected io.EOF")
				}
			}
		})
		cc.Close()
	}
}
