package deadline_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/stormguard/stormguard/deadline"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

func nopInvoker(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error {
	return nil
}

// BenchmarkClientUnary measures the client interceptor's own cost on a call
// with a deadline, with an invoker that does nothing.
func BenchmarkClientUnary(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	long, cancel2 := context.WithTimeout(context.Background(), time.Hour)
	defer cancel2()
	stale := metadata.AppendToOutgoingContext(ctx, deadline.MetadataKey, "12345")
	for _, bc := range []struct {
		name string
		ctx  context.Context
		cfg  deadline.ClientConfig
	}{
		{"deadline", ctx, deadline.ClientConfig{}},
		{"deadline 1h", long, deadline.ClientConfig{}},
		{"deadline+margin", ctx, deadline.ClientConfig{Margin: 5 * time.Millisecond, MarginFraction: 0.1}},
		{"stale header", stale, deadline.ClientConfig{}},
		{"no deadline", context.Background(), deadline.ClientConfig{}},
		{"default timeout", context.Background(), deadline.ClientConfig{DefaultTimeout: time.Second}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			in := deadline.NewClient(bc.cfg).Unary()
			b.ReportAllocs()
			for b.Loop() {
				if err := in(bc.ctx, "/echo.v1.EchoService/Get", nil, nil, nil, nopInvoker); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkAttemptContext measures the per-attempt building block alone.
func BenchmarkAttemptContext(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c := deadline.NewClient(deadline.ClientConfig{})
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.AttemptContext(ctx, time.Now()); err != nil {
			b.Fatal(err)
		}
	}
}

func nopHandler(context.Context, any) (any, error) { return nil, nil }

// BenchmarkServerUnary measures the server interceptor's own cost on a call
// with a deadline, with a handler that does nothing.
func BenchmarkServerUnary(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	with := func(v string) context.Context {
		return metadata.NewIncomingContext(ctx, metadata.MD{"content-type": {"application/grpc"}, deadline.MetadataKey: {v}})
	}
	info := &grpc.UnaryServerInfo{FullMethod: "/echo.v1.EchoService/Get"}
	for _, bc := range []struct {
		name string
		ctx  context.Context
	}{
		{"no header", metadata.NewIncomingContext(ctx, metadata.MD{"content-type": {"application/grpc"}})},
		{"header not tighter", with("3600000")},
		{"header tighter", with("1000")},
		{"header malformed", with("1000ms")},
	} {
		b.Run(bc.name, func(b *testing.B) {
			in := deadline.NewServer(deadline.ServerConfig{}).Unary()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := in(bc.ctx, nil, info, nopHandler); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkEndToEnd is a unary call over bufconn with a 5 s deadline:
// bare; with a plain interceptor that only appends a header of the same
// size (the cost of sending any metadata, for comparison); and with the
// client and server interceptors, without and with a margin (with one, the
// server derives a tighter context).
func BenchmarkEndToEnd(b *testing.B) {
	appendHeader := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		return invoker(metadata.AppendToOutgoingContext(ctx, deadline.MetadataKey, "4999"), method, req, reply, cc, opts...)
	}
	for _, bc := range []struct {
		name  string
		sopts []grpc.ServerOption
		copts []grpc.DialOption
	}{
		{"bare", nil, nil},
		{"bare+header", nil, []grpc.DialOption{grpc.WithUnaryInterceptor(appendHeader)}},
		{"deadline", serverOpts(deadline.NewServer(deadline.ServerConfig{})), clientOpts(deadline.NewClient(deadline.ClientConfig{}))},
		{"deadline+margin", serverOpts(deadline.NewServer(deadline.ServerConfig{})), clientOpts(deadline.NewClient(deadline.ClientConfig{Margin: 5 * time.Millisecond}))},
	} {
		b.Run(bc.name, func(b *testing.B) {
			l := origin.Bufconn()
			sopts, copts := bc.sopts, bc.copts
			srv := origin.Serve(l, echoServer{}, sopts...)
			defer srv.Stop()
			cc, err := l.Dial(copts...)
			require.NoError(b, err)
			defer cc.Close()
			client := echov1.NewEchoServiceClient(cc)
			ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
			defer cancel()
			req := &echov1.GetRequest{RequestId: "b", Key: "k"}
			for range 10 { // warm up the connection
				_, err := client.Get(ctx, req)
				require.NoError(b, err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, err := client.Get(ctx, req)
				cancel()
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// echoServer answers Get at once, with no bookkeeping of its own.
type echoServer struct {
	echov1.UnimplementedEchoServiceServer
}

func (echoServer) Register(s grpc.ServiceRegistrar) {
	echov1.RegisterEchoServiceServer(s, echoServer{})
}

func (echoServer) Get(_ context.Context, r *echov1.GetRequest) (*echov1.GetResponse, error) {
	return &echov1.GetResponse{RequestId: r.GetRequestId()}, nil
}

func BenchmarkParseHeader(b *testing.B) {
	var sink time.Duration
	b.ReportAllocs()
	for b.Loop() {
		d, _ := deadline.ParseHeader("1234567890")
		sink += d
	}
	_ = sink
}

func BenchmarkFormatHeader(b *testing.B) {
	for _, d := range []time.Duration{850 * time.Millisecond, 45 * time.Second} {
		b.Run(d.String(), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = deadline.FormatHeader(d)
			}
		})
	}
}
