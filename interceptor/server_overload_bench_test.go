package interceptor_test

import (
	"context"
	"testing"
	"time"

	"github.com/stormguard/stormguard/semconv"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// BenchmarkServerUnaryOverload measures the server interceptor's own cost
// with and without the overload protection: the handler returns at once.
// The context carries a deadline and the incoming metadata a request
// has (and, for the retry, grpc-previous-rpc-attempts).
func BenchmarkServerUnaryOverload(b *testing.B) {
	info := &grpc.UnaryServerInfo{FullMethod: echov1.EchoService_Put_FullMethodName}
	handler := func(context.Context, any) (any, error) { return nil, nil }
	req := &echov1.PutRequest{}
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	first := metadata.NewIncomingContext(ctx, metadata.Pairs("user-agent", "grpc-go/1.85.0", "content-type", "application/grpc"))
	retry := metadata.NewIncomingContext(ctx, metadata.Pairs("user-agent", "grpc-go/1.85.0", "content-type", "application/grpc",
		semconv.PreviousAttemptsKey, "1"))
	run := func(b *testing.B, ctx context.Context, s *interceptor.Server) {
		ic := s.Unary()
		b.ReportAllocs()
		for b.Loop() {
			if _, err := ic(ctx, req, info, handler); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("without", func(b *testing.B) {
		run(b, first, interceptor.NewServer(interceptor.WithDedupe(nil), interceptor.WithOverload(nil)))
	})
	b.Run("with", func(b *testing.B) { run(b, first, interceptor.NewServer(interceptor.WithDedupe(nil))) })
	b.Run("with-retry", func(b *testing.B) { run(b, retry, interceptor.NewServer(interceptor.WithDedupe(nil))) })
}

// BenchmarkServerOverloadBufconn measures a whole unary call over bufconn
// through the suite's server, with and without the overload protection.
func BenchmarkServerOverloadBufconn(b *testing.B) {
	for _, c := range []struct {
		name string
		opts []interceptor.ServerOption
	}{
		{"without", []interceptor.ServerOption{interceptor.WithOverload(nil)}},
		{"with", nil},
	} {
		b.Run(c.name, func(b *testing.B) {
			s := interceptor.NewServer(c.opts...)
			l := origin.Bufconn()
			srv := origin.Serve(l, origin.New(nil), grpc.ChainUnaryInterceptor(s.Unary()))
			defer srv.Stop()
			cc, err := l.Dial()
			if err != nil {
				b.Fatal(err)
			}
			defer cc.Close()
			echo := echov1.NewEchoServiceClient(cc)
			ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
			defer cancel()
			req := &echov1.PutRequest{RequestId: "r"}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := echo.Put(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
