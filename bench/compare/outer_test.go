package compare

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	grpcretry "github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/retry"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// TestMiddlewareRetryOutsideTheSuite installs go-grpc-middleware's retry
// (100 tries, 1 ms apart, on UNAVAILABLE, with its default attempt header)
// outside the suite, as a client library installs its own, in front of an
// origin that serves 100 calls and then answers UNAVAILABLE at once (a
// lost quorum). Each of its tries calls the suite again; the suite takes
// a try that comes back for a retry of its logical call, so that every
// request beyond one per logical call is paid from the retry budget, but
// for a probe of the dead target every half a second.
func TestMiddlewareRetryOutsideTheSuite(t *testing.T) {
	const healthy, outage = 100, 200
	var down atomic.Bool
	o := origin.New(func(origin.Call) origin.Reply {
		if down.Load() {
			return origin.Reply{Code: codes.Unavailable, Message: "etcdserver: no leader"}
		}
		return origin.Reply{}
	})
	l := origin.Bufconn()
	srv := origin.Serve(l, o)
	defer srv.Stop()
	budgets := budget.NewRegistry(budget.Config{})
	guard := interceptor.NewClient(
		interceptor.WithTelemetry(interceptor.Telemetry{TracerProvider: tracenoop.NewTracerProvider()}),
		interceptor.WithTelemetry(interceptor.Telemetry{MeterProvider: metricnoop.NewMeterProvider()}),
		interceptor.WithRetryPolicy(interceptor.RetryPolicy{BackoffBase: time.Millisecond, BackoffMax: 2 * time.Millisecond}),
		interceptor.WithBudget(budgets),
	)
	var tries atomic.Int64
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		tries.Add(1)
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	cc, err := l.Dial(append([]grpc.DialOption{grpc.WithChainUnaryInterceptor(
		grpcretry.UnaryClientInterceptor(
			grpcretry.WithMax(100),
			grpcretry.WithCodes(codes.Unavailable),
			grpcretry.WithBackoff(grpcretry.BackoffLinear(time.Millisecond))),
		count,
	)}, guard.DialOptions()...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	c := echov1.NewEchoServiceClient(cc)
	run := func(prefix string, n int) (ok int) {
		var next, okN atomic.Int64
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for {
					i := next.Add(1) - 1
					if i >= int64(n) {
						return
					}
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					if _, err := c.Put(ctx, &echov1.PutRequest{RequestId: fmt.Sprint(prefix, i)}); err == nil {
						okN.Add(1)
					}
					cancel()
				}
			})
		}
		wg.Wait()
		return int(okN.Load())
	}
	granted := func() (n uint64) {
		budgets.Range(func(_ string, b *budget.Budget) bool { n += b.Stats().Granted; return true })
		return n
	}
	if ok := run("h", healthy); ok != healthy || o.Total() != healthy {
		t.Fatalf("healthy: %d/%d ok, %d requests", ok, healthy, o.Total())
	}
	down.Store(true)
	tries.Store(0)
	grantedBefore := granted()
	began := time.Now()
	ok := run("o", outage)
	elapsed := time.Since(began)
	sent, paid := o.Total()-healthy, granted()-grantedBefore
	t.Logf("%d logical calls, %d tries in %v: %d requests (%.2f per call), %d retries paid from the budget",
		outage, tries.Load(), elapsed.Round(time.Millisecond), sent, float64(sent)/outage, paid)
	if ok != 0 {
		t.Errorf("%d calls succeeded against a dead origin", ok)
	}
	if tries.Load() <= outage {
		t.Errorf("go-grpc-middleware did not try again: %d tries", tries.Load())
	}
	if per := float64(sent) / outage; per > 1.2 {
		t.Errorf("%.2f requests per logical call, want at most 1.2", per)
	}
	// Beyond the first try of each logical call and the retries the budget
	// paid for, the suite sends a probe of the dead target at most every
	// 0.45 s (half a second, jittered).
	if probes := int64(sent) - outage - int64(paid); probes > int64(elapsed/(450*time.Millisecond))+1 {
		t.Errorf("%d requests for %d logical calls and %d paid retries in %v: %d unpaid, more than the probes", sent, outage, paid, elapsed, probes)
	}
}
