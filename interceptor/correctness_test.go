package interceptor_test

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/deadline"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

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
	_, err = echov1.NewEchoServiceClient(cc).Put(context.Background(), &echov1.PutRequest{RequestId: "t"})
	// The call ends at its 200 ms: either the retry runs out of time
	// (DeadlineExceeded), or, on a slow machine, its backoff would end past
	// the deadline and it is not sent (the first attempt's status).
	if status.Code(err) != codes.DeadlineExceeded {
		assert.Equal(t, codes.Unavailable, status.Code(err))
		assert.Equal(t, interceptor.ReasonDeadline, interceptor.RefusedBy(err))
	}
	calls := o.Calls()
	require.NotEmpty(t, calls)
	assert.LessOrEqual(t, len(calls), 2, "one failure at 150 ms, then the call's 200 ms are up")
	for i, c := range calls {
		require.True(t, c.HasDeadline)
		// A timeout per attempt would give the retry a deadline 150 ms
		// later than the first attempt's; the call's own is one deadline.
		assert.Less(t, c.Deadline.Sub(calls[0].Deadline), 50*time.Millisecond, "attempt %d has the call's deadline", i+1)
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
	ts := c.Targets()
	require.Len(t, ts, 1)
	assert.Len(t, ts[0].Breakers, interceptor.MaxRoutes, "a breaker per method, up to MaxRoutes")
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	found := false
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == interceptor.MetricBreakerState {
				g := m.Data.(metricdata.Gauge[int64])
				require.Equal(t, 1, len(g.DataPoints), "the breakers of unknown methods share one series")
				v, _ := g.DataPoints[0].Attributes.Value("rpc.method")
				assert.Equal(t, "_OTHER", v.AsString())
			}
			if m.Name != interceptor.MetricCalls {
				continue
			}
			found = true
			sum := m.Data.(metricdata.Sum[int64])
			require.Equal(t, 1, len(sum.DataPoints), "unknown methods share one series")
			v, _ := sum.DataPoints[0].Attributes.Value("rpc.method")
			assert.Equal(t, "_OTHER", v.AsString())
			assert.Equal(t, int64(interceptor.MaxRoutes+500), sum.DataPoints[0].Value)
		}
	}
	require.True(t, found, "the calls metric was reported")
}

// Issue 13 item 10: two Clients on one MeterProvider both report their
// targets' breaker state and budget balance.
func TestGaugesOfTwoClientsOnOneMeterProvider(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	var targets []string
	var guards []*interceptor.Client
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
		guards = append(guards, guard)
	}
	seen := gaugeTargets(t, reader)
	for _, name := range []string{interceptor.MetricBreakerState, interceptor.MetricBudgetBalance} {
		assert.ElementsMatch(t, targets, seen[name], name)
	}
	// Close unregisters a Client's gauges; the other's stay.
	require.NoError(t, guards[0].Close())
	seen = gaugeTargets(t, reader)
	for _, name := range []string{interceptor.MetricBreakerState, interceptor.MetricBudgetBalance} {
		assert.ElementsMatch(t, targets[1:], seen[name], name+", after the first Client's Close")
	}
}

// gaugeTargets collects reader and returns, per gauge, the endpoints it
// reports.
func gaugeTargets(t *testing.T, reader *sdkmetric.ManualReader) map[string][]string {
	t.Helper()
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
	return seen
}

func endpoint(s attribute.Set) string {
	h, _ := s.Value("server.address")
	p, _ := s.Value("server.port")
	return fmt.Sprintf("%s:%d", h.AsString(), p.AsInt64())
}

// Issue 13 item 11: the header is relative, so each hop's deadline landed
// later than its caller's by the time in transit. With the default margin,
// each hop's deadline is its caller's less the margin (rounded down to the
// millisecond): here in a synctest bubble, whose clock every client and
// server of a three-hop chain reads and which stands still while the call
// goes through, so that transit takes no time and only the arithmetic
// shows (depth_norace_test.go measures real transit on loopback).
func TestEachHopsDeadlineIsItsCallersLessTheMargin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := origin.New(nil)
		srvOpts := func() []grpc.ServerOption {
			s := interceptor.NewServer(interceptor.WithoutDedupe(), interceptor.WithServerDeadline(deadline.ServerConfig{}))
			return []grpc.ServerOption{grpc.ChainUnaryInterceptor(s.Unary())}
		}
		l := origin.Bufconn()
		defer origin.Serve(l, o, srvOpts()...).Stop()
		for range 3 {
			guard := interceptor.NewClient(noopProviders()...)
			cc, err := l.Dial(guard.DialOptions()...)
			require.NoError(t, err)
			defer cc.Close()
			next := origin.Bufconn()
			defer origin.Serve(next, &origin.Hop{Next: echov1.NewEchoServiceClient(cc)}, srvOpts()...).Stop()
			l = next
		}
		guard := interceptor.NewClient(noopProviders()...)
		cc, err := l.Dial(guard.DialOptions()...)
		require.NoError(t, err)
		defer cc.Close()
		dl := time.Now().Add(2 * time.Second)
		ctx, cancel := context.WithDeadline(t.Context(), dl)
		defer cancel()
		_, err = echov1.NewEchoServiceClient(cc).Put(ctx, &echov1.PutRequest{RequestId: "depth"})
		require.NoError(t, err)
		calls := o.Calls()
		require.Len(t, calls, 1)
		want := dl.Add(-4 * deadline.DefaultMargin) // the caller's client and three hops
		assert.Equal(t, want, calls[0].Deadline, "four margins below the caller's deadline")
	})
}

// Issue 13, "decide and document": budgets and breakers are keyed on the
// target in grpc's canonical form, so "host:port" and "dns:///host:port"
// (the same resolver and endpoints) share one; a target naming another
// resolver ("passthrough:///host:port") keeps its own.
func TestTargetsAreKeyedInCanonicalForm(t *testing.T) {
	l, err := origin.TCP()
	require.NoError(t, err)
	srv := origin.Serve(l, origin.New(nil))
	defer srv.Stop()
	guard := interceptor.NewClient(noopProviders()...)
	defer guard.Close()
	for _, target := range []string{l.Target, "dns:///" + l.Target, "passthrough:///" + l.Target} {
		cc, err := grpc.NewClient(target, append(guard.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
		require.NoError(t, err)
		defer cc.Close()
		_, err = echov1.NewEchoServiceClient(cc).Put(t.Context(), &echov1.PutRequest{})
		require.NoError(t, err, target)
	}
	requests := map[string]uint64{}
	for _, ts := range guard.Targets() {
		require.NotNil(t, ts.Budget)
		requests[ts.Target] = ts.Budget.Requests
	}
	assert.Equal(t, map[string]uint64{"dns:///" + l.Target: 2, "passthrough:///" + l.Target: 1}, requests)
}
