package interceptor_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// slack bounds how much later than computed a deadline may land on a busy
// machine under -race.
const slack = 25 * time.Millisecond

// Issue 13 item 7: grpc-go applies a service config's method timeout to
// the whole call; through the suite it must not become a timeout per
// attempt (which stretched a 200 ms bound to 4 attempts and 576 ms).
func TestServiceConfigTimeoutBoundsTheWholeCall(t *testing.T) {
	o := origin.New(func(origin.Call) origin.Reply {
		return origin.Reply{Delay: 150 * time.Millisecond, Code: codes.Unavailable, Message: "slow failure"}
	})
	l := origin.Bufconn()
	srv := origin.Serve(l, o)
	defer srv.Stop()
	guard := interceptor.NewClient(append(noopProviders(), fast, interceptor.WithoutBudget(), interceptor.WithMaxAttempts(5))...)
	cc, err := l.Dial(grpc.WithDefaultServiceConfig(`{"methodConfig":[{"name":[{"service":"echo.v1.EchoService"}],"timeout":"0.2s"}]}`),
		grpc.WithChainUnaryInterceptor(guard.Unary()))
	require.NoError(t, err)
	defer cc.Close()
	start := time.Now()
	_, err = echov1.NewEchoServiceClient(cc).Put(context.Background(), &echov1.PutRequest{RequestId: "t"})
	assert.Equal(t, codes.DeadlineExceeded, status.Code(err))
	calls := o.Calls()
	require.NotEmpty(t, calls)
	assert.LessOrEqual(t, len(calls), 2, "one failure at 150 ms, then the call's 200 ms are up")
	for i, c := range calls {
		require.True(t, c.HasDeadline)
		assert.False(t, c.Deadline.After(start.Add(200*time.Millisecond+slack)), "attempt %d's deadline is the call's", i+1)
	}
}

// Issue 13 item 6: each distinct method name cost about 10 KB for the
// Client's life, without bound (a proxy forwarding caller-chosen names grew
// by 100 MiB for 10,000). Routes are now bounded, and a method the
// registry does not know shares its metric attributes ("_OTHER").
func TestRoutesAreBounded(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	c := interceptor.NewClient(interceptor.WithMeterProvider(mp), interceptor.WithTracerProvider(noop.NewTracerProvider()))
	ic := c.Unary()
	cc := dialPassthrough(t)
	inv := func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error { return nil }
	for i := range interceptor.MaxRoutes + 500 {
		require.NoError(t, ic(t.Context(), fmt.Sprintf("/proxy.v1.Any/M%d", i), &echov1.PutRequest{}, &echov1.PutResponse{}, cc, inv))
	}
	assert.Equal(t, interceptor.MaxRoutes, interceptor.RouteCount(c))
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != interceptor.MetricCalls {
				continue
			}
			sum := m.Data.(metricdata.Sum[int64])
			require.Equal(t, 1, len(sum.DataPoints), "unknown methods share one series")
			v, _ := sum.DataPoints[0].Attributes.Value("rpc.method")
			assert.Equal(t, "_OTHER", v.AsString())
			assert.Equal(t, int64(interceptor.MaxRoutes+500), sum.DataPoints[0].Value)
		}
	}
}

// Issue 13 item 10: two Clients on one MeterProvider both report their
// targets' breaker state and budget balance.
func TestGaugesOfTwoClientsOnOneMeterProvider(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	var targets []string
	for range 2 {
		l, err := origin.TCP()
		require.NoError(t, err)
		srv := origin.Serve(l, origin.New(nil))
		defer srv.Stop()
		guard := interceptor.NewClient(interceptor.WithMeterProvider(mp), interceptor.WithTracerProvider(noop.NewTracerProvider()))
		defer guard.Close()
		cc, err := l.Dial(guard.DialOptions()...)
		require.NoError(t, err)
		defer cc.Close()
		_, err = echov1.NewEchoServiceClient(cc).Put(t.Context(), &echov1.PutRequest{})
		require.NoError(t, err)
		targets = append(targets, l.Target)
	}
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	seen := map[string][]string{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					seen[m.Name] = append(seen[m.Name], endpoint(p.Attributes))
				}
			case metricdata.Gauge[float64]:
				for _, p := range d.DataPoints {
					seen[m.Name] = append(seen[m.Name], endpoint(p.Attributes))
				}
			}
		}
	}
	for _, name := range []string{interceptor.MetricBreakerState, interceptor.MetricBudgetBalance} {
		assert.ElementsMatch(t, targets, seen[name], name)
	}
}

func endpoint(s attribute.Set) string {
	h, _ := s.Value("server.address")
	p, _ := s.Value("server.port")
	return fmt.Sprintf("%s:%d", h.AsString(), p.AsInt64())
}

// Issue 13 item 11: the header is relative, so each hop's deadline landed
// later than its caller's by the time in transit (1.5 ms over three hops
// on loopback). With the default margin no handler at any depth has a
// deadline later than the original caller's.
func TestNoDeadlineLaterThanTheCallersAtAnyDepth(t *testing.T) {
	o := origin.New(nil)
	srvOpts := func() []grpc.ServerOption {
		s := interceptor.NewServer(interceptor.WithoutDedupe())
		return []grpc.ServerOption{grpc.ChainUnaryInterceptor(s.Unary())}
	}
	l, err := origin.TCP()
	require.NoError(t, err)
	defer origin.Serve(l, o, srvOpts()...).Stop()
	for range 3 {
		guard := interceptor.NewClient(noopProviders()...)
		cc, err := l.Dial(guard.DialOptions()...)
		require.NoError(t, err)
		defer cc.Close()
		next, err := origin.TCP()
		require.NoError(t, err)
		defer origin.Serve(next, &origin.Hop{Next: echov1.NewEchoServiceClient(cc)}, srvOpts()...).Stop()
		l = next
	}
	guard := interceptor.NewClient(noopProviders()...)
	cc, err := l.Dial(guard.DialOptions()...)
	require.NoError(t, err)
	defer cc.Close()
	top := echov1.NewEchoServiceClient(cc)
	for i := range 50 {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		dl, _ := ctx.Deadline()
		_, err := top.Put(ctx, &echov1.PutRequest{RequestId: fmt.Sprint(i)})
		cancel()
		require.NoError(t, err)
		calls := o.Calls()
		got := calls[len(calls)-1]
		require.True(t, got.HasDeadline)
		assert.False(t, got.Deadline.After(dl), "call %d: the origin's deadline is %v later than the caller's", i, got.Deadline.Sub(dl))
	}
}
