package compare

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/clock"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// BenchmarkStormguardBreakdown takes stormguard's success path (fake
// invoker, as in BenchmarkFakeInvoker) apart: each row turns one more
// feature off, so the differences between rows are what each costs. The
// last row replaces the clock by a constant (through internal/clock's seam), which
// is not a configuration anyone should run: it only measures what reading
// the clock costs on this machine.
func BenchmarkStormguardBreakdown(b *testing.B) {
	cc, err := grpc.NewClient("passthrough:///bench", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer cc.Close()
	invoker := func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error { return nil }
	frozen := time.Now()
	for _, v := range []struct {
		name string
		opts []interceptor.ClientOption
	}{
		{"defaults", nil},
		{"no-budget", []interceptor.ClientOption{interceptor.WithBudget(nil)}},
		{"no-breaker", []interceptor.ClientOption{interceptor.WithBreaker(nil)}},
		{"no-budget-no-breaker", []interceptor.ClientOption{interceptor.WithBudget(nil), interceptor.WithBreaker(nil)}},
		{"no-budget-no-breaker-frozen-clock", []interceptor.ClientOption{interceptor.WithBudget(nil), interceptor.WithBreaker(nil),
			clock.ClientOption(func() time.Time { return frozen }, nil).(interceptor.ClientOption)}},
	} {
		ic := interceptor.NewClient(append(stormguardOptions(), v.opts...)...).Unary()
		b.Run("variant="+v.name, func(b *testing.B) {
			ctx := context.Background()
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

var sinkTime time.Time

// BenchmarkTimeNow is what one time.Now costs on this machine: stormguard
// reads the clock twice per successful call, the other contenders not at
// all on the success path.
func BenchmarkTimeNow(b *testing.B) {
	for b.Loop() {
		sinkTime = time.Now()
	}
}
