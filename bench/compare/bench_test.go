package compare

import (
	"context"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// BenchmarkFakeInvoker is the success path with an invoker that returns at
// once: what each interceptor itself costs per call. grpc-go's retry is not
// here: it is not an interceptor but part of grpc's call machinery, so it
// can only be measured with a real connection (BenchmarkBufconn). The
// caller's context has no deadline.
func BenchmarkFakeInvoker(b *testing.B) { fakeInvoker(b, context.Background()) }

// BenchmarkFakeInvokerDeadline is BenchmarkFakeInvoker with a deadline on
// the caller's context, as most production calls have: stormguard then
// propagates it, and failsafe-go merges the caller's context with its
// executor's.
func BenchmarkFakeInvokerDeadline(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	fakeInvoker(b, ctx)
}

func fakeInvoker(b *testing.B, ctx context.Context) {
	cc, err := grpc.NewClient("passthrough:///bench", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer cc.Close()
	invoker := func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error { return nil }
	passThrough := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	for _, c := range append([]contender{bare()}, retrying()...) {
		if c.serviceConfig != "" {
			continue // grpc-go's retry: not an interceptor
		}
		ic := passThrough
		if c.interceptor != nil {
			ic = c.interceptor()
		}
		b.Run("lib="+c.name, func(b *testing.B) {
			req, reply := &echov1.PutRequest{}, &echov1.PutResponse{}
			b.ReportAllocs()
			ops, cpu := 0, cpuTime()
			for b.Loop() {
				if err := ic(ctx, echov1.EchoService_Put_FullMethodName, req, reply, cc, invoker); err != nil {
					b.Fatal(err)
				}
				ops++
			}
			reportCPU(b, cpu, ops)
		})
	}
}

// BenchmarkBufconn is the success path end to end: a Put over an in-memory
// connection to an origin that answers OK at once. Client and server run
// in this process, so B/op and allocs/op include the server's share. The
// caller's context has no deadline.
func BenchmarkBufconn(b *testing.B) { bufconn(b, context.Background()) }

// BenchmarkBufconnDeadline is BenchmarkBufconn with a deadline on the
// caller's context: grpc sends grpc-timeout, and stormguard also sends
// stormguard-deadline-ms.
func BenchmarkBufconnDeadline(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	bufconn(b, ctx)
}

func bufconn(b *testing.B, ctx context.Context) {
	for _, c := range append([]contender{bare()}, retrying()...) {
		b.Run("lib="+c.name, func(b *testing.B) {
			o := origin.New(origin.Succeed())
			l := origin.Bufconn()
			srv := origin.Serve(l, o)
			defer srv.Stop()
			client := echov1.NewEchoServiceClient(c.mustDial(b, l))
			req := &echov1.PutRequest{}
			if _, err := client.Put(ctx, req); err != nil { // connect
				b.Fatal(err)
			}
			b.ReportAllocs()
			ops, cpu := 0, cpuTime()
			for b.Loop() {
				if _, err := client.Put(ctx, req); err != nil {
					b.Fatal(err)
				}
				ops++
			}
			reportCPU(b, cpu, ops)
		})
	}
}

// BenchmarkFailFirst is the failure path: the origin fails the first
// attempt of every request with UNAVAILABLE, so a call that is retried
// takes two attempts. Each call carries a new request_id (one small
// allocation, the same for every contender).
//
// Besides ns/op it reports attempts/op (attempts the origin saw per call)
// and errors/op (calls that failed). stormguard with its defaults is not
// comparable here: its budget allows retries for about 10% of the calls and
// then its breaker opens, so most calls fail fast, by design. The row
// "stormguard-nobudget-nobreaker" is the equivalent configuration.
func BenchmarkFailFirst(b *testing.B) {
	for _, c := range retrying() {
		b.Run("lib="+c.name, func(b *testing.B) {
			o := origin.New(origin.FailFirst(1, codes.Unavailable))
			l := origin.Bufconn()
			srv := origin.Serve(l, o)
			defer srv.Stop()
			client := echov1.NewEchoServiceClient(c.mustDial(b, l))
			ctx := context.Background()
			if _, err := client.Put(ctx, &echov1.PutRequest{RequestId: "warmup"}); err != nil { // connect
				b.Fatal(err)
			}
			before := o.Total()
			var id []byte
			calls, errs := 0, 0
			b.ReportAllocs()
			cpu := cpuTime()
			for b.Loop() {
				calls++
				id = strconv.AppendInt(id[:0], int64(calls), 10)
				if _, err := client.Put(ctx, &echov1.PutRequest{RequestId: string(id)}); err != nil {
					errs++
				}
			}
			reportCPU(b, cpu, calls)
			b.ReportMetric(float64(o.Total()-before)/float64(calls), "attempts/op")
			b.ReportMetric(float64(errs)/float64(calls), "errors/op")
		})
	}
}

// reportCPU reports the CPU time the process used per operation since
// start: every thread, so a bufconn call's server side and the garbage
// collector count too. On a machine shared with other work it varies less
// than ns/op, which also counts the time spent waiting for a CPU.
func reportCPU(b *testing.B, start time.Duration, ops int) {
	if ops > 0 {
		b.ReportMetric(float64(cpuTime()-start)/float64(ops), "cpu-ns/op")
	}
}
