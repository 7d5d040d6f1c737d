package interceptor_test

import (
	"context"
	"testing"
	"time"

	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

func recordingTracer(b *testing.B) interceptor.ClientOption {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(discard{}))
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return interceptor.WithTelemetry(interceptor.Telemetry{TracerProvider: tp})
}

// discard is a span processor that drops ended spans, so the benchmark
// measures recording, not exporting.
type discard struct{}

func (discard) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (discard) OnEnd(sdktrace.ReadOnlySpan)                     {}
func (discard) Shutdown(context.Context) error                  { return nil }
func (discard) ForceFlush(context.Context) error                { return nil }

// BenchmarkUnaryFakeInvoker measures the interceptor's own cost on the
// success path: the invoker returns at once.
func BenchmarkUnaryFakeInvoker(b *testing.B) {
	cc, err := grpc.NewClient("passthrough:///bench", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer cc.Close()
	invoker := func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error { return nil }
	req, reply := &echov1.PutRequest{}, &echov1.PutResponse{}
	run := func(b *testing.B, ctx context.Context, ic grpc.UnaryClientInterceptor) {
		b.ReportAllocs()
		for b.Loop() {
			if err := ic(ctx, echov1.EchoService_Put_FullMethodName, req, reply, cc, invoker); err != nil {
				b.Fatal(err)
			}
		}
	}
	bare := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	withLongDeadline, cancelLong := context.WithTimeout(context.Background(), time.Hour)
	defer cancelLong()
	b.Run("bare", func(b *testing.B) { run(b, context.Background(), bare) })
	b.Run("suite", func(b *testing.B) { run(b, context.Background(), interceptor.NewClient(noopProviders()...).Unary()) })
	// A deadline adds the stormguard-deadline-ms header, written by the
	// attempt's call credentials when grpc asks for them; the fake
	// invoker never asks, so these measure what the interceptor itself
	// does with a deadline (bench/compare's BufconnDeadline measures the
	// header on the wire).
	b.Run("suite-deadline-5s", func(b *testing.B) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second) // b.Loop runs ~1s
		defer cancel()
		run(b, ctx, interceptor.NewClient(noopProviders()...).Unary())
	})
	b.Run("suite-deadline-1h", func(b *testing.B) { run(b, withLongDeadline, interceptor.NewClient(noopProviders()...).Unary()) })
	b.Run("suite-unmarked", func(b *testing.B) {
		ic := interceptor.NewClient(noopProviders()...).Unary()
		req, reply := &echov1.NotifyRequest{}, &echov1.NotifyResponse{}
		b.ReportAllocs()
		for b.Loop() {
			if err := ic(context.Background(), echov1.EchoService_Notify_FullMethodName, req, reply, cc, invoker); err != nil {
				b.Fatal(err)
			}
		}
	})
	// After a call has failed, the Client remembers failed calls (so that
	// a retry loop outside the suite is seen): every call then looks
	// itself up there.
	b.Run("suite-after-a-failure", func(b *testing.B) {
		ic := interceptor.NewClient(noopProviders()...).Unary()
		failing := func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error {
			return status.Error(codes.Unavailable, "down")
		}
		failCtx, cancelFail := context.WithTimeout(context.Background(), time.Hour)
		defer cancelFail()
		_ = ic(failCtx, echov1.EchoService_Put_FullMethodName, &echov1.PutRequest{}, &echov1.PutResponse{}, cc, failing, interceptor.MaxAttempts(1))
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		defer cancel()
		run(b, ctx, ic)
	})
	// A call in the context of a failed call, with other content: the
	// failure's context and route are remembered, so the call's request
	// is digested to tell it apart.
	b.Run("suite-same-context-as-a-failure", func(b *testing.B) {
		ic := interceptor.NewClient(noopProviders()...).Unary()
		failing := func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error {
			return status.Error(codes.Unavailable, "down")
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		defer cancel()
		_ = ic(ctx, echov1.EchoService_Put_FullMethodName, &echov1.PutRequest{RequestId: "failed"}, &echov1.PutResponse{}, cc, failing, interceptor.MaxAttempts(1))
		run(b, ctx, ic)
	})
	b.Run("suite-global-providers", func(b *testing.B) { run(b, context.Background(), interceptor.NewClient().Unary()) })
	b.Run("suite-recording-tracer", func(b *testing.B) {
		run(b, context.Background(), interceptor.NewClient(recordingTracer(b), interceptor.WithTelemetry(interceptor.Telemetry{MeterProvider: metricnoop.NewMeterProvider()})).Unary())
	})
}

// BenchmarkUnaryBufconn is a whole call over an in-memory connection.
func BenchmarkUnaryBufconn(b *testing.B) {
	o := origin.New(nil)
	l := origin.Bufconn()
	srv := origin.Serve(l, o)
	defer srv.Stop()
	run := func(b *testing.B, opts ...grpc.DialOption) {
		cc, err := l.Dial(opts...)
		if err != nil {
			b.Fatal(err)
		}
		defer cc.Close()
		c := echov1.NewEchoServiceClient(cc)
		ctx := context.Background()
		if _, err := c.Put(ctx, &echov1.PutRequest{}); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := c.Put(ctx, &echov1.PutRequest{}); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("bare", func(b *testing.B) { run(b) })
	b.Run("suite", func(b *testing.B) {
		run(b, grpc.WithChainUnaryInterceptor(interceptor.NewClient(noopProviders()...).Unary()))
	})
	b.Run("suite-recording-tracer", func(b *testing.B) {
		run(b, grpc.WithChainUnaryInterceptor(interceptor.NewClient(recordingTracer(b), interceptor.WithTelemetry(interceptor.Telemetry{MeterProvider: metricnoop.NewMeterProvider()})).Unary()))
	})
}

// nowSink keeps BenchmarkTimeNow's readings alive.
var nowSink time.Time

// BenchmarkTimeNow is BenchmarkUnaryFakeInvoker's yardstick: one reading
// of the clock, on the same machine in the same run.
func BenchmarkTimeNow(b *testing.B) {
	for b.Loop() {
		nowSink = time.Now()
	}
}
