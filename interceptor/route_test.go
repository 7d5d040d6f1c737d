package interceptor_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
	"github.com/stormguard/stormguard/semconv"
)

// perClientConn dials addr the way etcd's clientv3 does: through a resolver
// of its own, with a target unique to each client object
// ("etcd-endpoints://0xc000.../host:port").
func perClientConn(t *testing.T, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	r := manual.NewBuilderWithScheme("etcd-endpoints")
	r.InitialState(resolver.State{Addresses: []resolver.Address{{Addr: addr}}})
	owner := new(int) // the "client object" whose address names the target
	cc, err := grpc.NewClient(fmt.Sprintf("etcd-endpoints://%p/%s", owner, addr), append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithResolvers(r),
	}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { cc.Close() })
	return cc
}

// Two ClientConns whose targets are different names of one dependency
// share one budget and one breaker once WithTargetName names it, and
// errors, hooks and Targets show the name.
func TestTargetNameSharesBudgetAndBreaker(t *testing.T) {
	o := origin.New(origin.Always(codes.Unavailable))
	l, err := origin.TCP()
	require.NoError(t, err)
	srv := origin.Serve(l, o)
	t.Cleanup(srv.Stop)

	var mu sync.Mutex
	var hookTargets []string
	budgets := budget.NewRegistry(budget.Config{})
	guard := interceptor.NewClient(append(noopProviders(), fast,
		interceptor.WithBudget(budgets),
		interceptor.WithBreaker(&breaker.Config{MinAttempts: 3}),
		interceptor.WithTargetName(func(target string) string {
			if strings.HasPrefix(target, "etcd-endpoints://") {
				return "etcd"
			}
			return ""
		}),
		interceptor.WithHooks(interceptor.Hooks{OnRefusal: func(e interceptor.RefusalEvent) {
			mu.Lock()
			hookTargets = append(hookTargets, e.Target)
			mu.Unlock()
		}}),
	)...)
	a := echov1.NewEchoServiceClient(perClientConn(t, l.Target, guard.DialOptions()...))
	b := echov1.NewEchoServiceClient(perClientConn(t, l.Target, guard.DialOptions()...))

	// Three failed attempts through the first client open the breaker...
	_, err = a.Put(t.Context(), &echov1.PutRequest{RequestId: "a"})
	require.Equal(t, codes.Unavailable, status.Code(err))
	sent := o.Total()
	// ...which the second client's calls meet: its first attempt goes to an
	// endpoint (its own connection) not yet seen to fail, and is sent; its
	// retry is refused. Its next call picks that endpoint, which has now
	// served nothing, and is refused before anything is sent.
	_, err = b.Put(t.Context(), &echov1.PutRequest{RequestId: "b"})
	first := o.Total() - sent
	_, err = b.Put(t.Context(), &echov1.PutRequest{RequestId: "c"})
	t.Logf("budgets: %d; the second client's calls sent %d and %d attempts; %v", budgets.Len(), first, o.Total()-sent-first, err)
	assert.Equal(t, 1, budgets.Len(), "one budget for both clients")
	var keys []string
	budgets.Range(func(target string, _ *budget.Budget) bool { keys = append(keys, target); return true })
	assert.Equal(t, []string{"etcd"}, keys)
	assert.Equal(t, 1, first, "the second client's first call was not retried: the shared breaker")
	assert.Equal(t, sent+1, o.Total(), "its second call was refused by the shared breaker")
	assert.Equal(t, interceptor.ReasonBreaker, interceptor.RefusedBy(err))
	assert.Equal(t, "stormguard: circuit breaker open for /echo.v1.EchoService/Put on etcd [stormguard #"+interceptor.Seal()+"]", status.Convert(err).Message(), "the error names the dependency")
	var names []string
	for _, ts := range guard.Targets() {
		names = append(names, ts.Target)
	}
	assert.Equal(t, []string{"etcd"}, names)
	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, hookTargets)
	for _, tg := range hookTargets {
		assert.Equal(t, "etcd", tg)
	}
}

// Without a name, a target keeps its own budget, and an empty name keeps
// the default: "host:port" and "dns:///host:port" are one target.
func TestTargetNameDefault(t *testing.T) {
	budgets := budget.NewRegistry(budget.Config{})
	guard := interceptor.NewClient(append(noopProviders(), fast, interceptor.WithBudget(budgets),
		interceptor.WithTargetName(func(string) string { return "" }))...)
	l, err := origin.TCP()
	require.NoError(t, err)
	srv := origin.Serve(l, origin.New(origin.Succeed()))
	t.Cleanup(srv.Stop)
	for _, target := range []string{l.Target, "dns:///" + l.Target} {
		cc, err := grpc.NewClient(target, append(guard.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
		require.NoError(t, err)
		_, err = echov1.NewEchoServiceClient(cc).Put(t.Context(), &echov1.PutRequest{RequestId: target})
		require.NoError(t, err)
		cc.Close()
	}
	var keys []string
	budgets.Range(func(target string, _ *budget.Budget) bool { keys = append(keys, target); return true })
	assert.Equal(t, []string{"dns:///" + l.Target}, keys)
}

// One broken method never gets a method that serves refused: Put fails
// every attempt, enough of them to open a breaker, while Get, called
// rarely, serves. Every Get is sent and succeeds (the old per-target
// breaker refused all ten), and Put stays refused by its own breaker.
func TestBrokenMethodDoesNotRefuseAnother(t *testing.T) {
	e := newEnv(t, func(c origin.Call) origin.Reply {
		if c.Method == put {
			return origin.Reply{Code: codes.Unavailable, Message: "Put is broken"}
		}
		return origin.Reply{}
	})
	for i := range 25 {
		_, _ = e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: fmt.Sprint("p", i)}, interceptor.MaxAttempts(1))
	}
	_, err := e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: "refused"})
	require.Equal(t, interceptor.ReasonBreaker, interceptor.RefusedBy(err), "Put's breaker is open")
	refused := 0
	for i := range 10 {
		if _, err := e.echo.Get(t.Context(), &echov1.GetRequest{RequestId: fmt.Sprint("g", i)}); err != nil {
			refused++
			t.Logf("Get %d: %v", i, err)
		}
	}
	assert.Zero(t, refused, "Gets refused because Put fails")
	assert.Equal(t, 10, e.origin.Count(get))
	ts := e.guard.Targets()
	require.Len(t, ts, 1)
	require.Len(t, ts[0].Breakers, 2, "one breaker per method")
	assert.Equal(t, get, ts[0].Breakers[0].Method)
	assert.Equal(t, "closed", ts[0].Breakers[0].State)
	assert.Equal(t, put, ts[0].Breakers[1].Method)
	assert.Equal(t, "open", ts[0].Breakers[1].State)
}

// Each distinct method name cost about 10 KB for the Client's life, without
// bound (a proxy forwarding caller-chosen names grew by 100 MiB for 10,000).
// Routes are now bounded, and a method the registry does not know shares its
// metric attributes ("_OTHER").
func TestRoutesAreBounded(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	c := interceptor.NewClient(interceptor.WithTelemetry(interceptor.Telemetry{MeterProvider: mp}), interceptor.WithTelemetry(interceptor.Telemetry{TracerProvider: noop.NewTracerProvider()}))
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
			if m.Name == semconv.MetricBreakerState {
				g := m.Data.(metricdata.Gauge[int64])
				require.Equal(t, 1, len(g.DataPoints), "the breakers of unknown methods share one series")
				v, _ := g.DataPoints[0].Attributes.Value("rpc.method")
				assert.Equal(t, "_OTHER", v.AsString())
			}
			if m.Name != semconv.MetricCalls {
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

// Budgets and breakers are keyed on the target in grpc's canonical form, so
// "host:port" and "dns:///host:port" (the same resolver and endpoints) share
// one; a target naming another resolver ("passthrough:///host:port") keeps its
// own.
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

// BenchmarkFirstCallOfARoute measures a call to a method the Client has not
// seen yet (a proxy forwarding caller-chosen names), over the first 10,000
// of a Client: making the route, its breaker and what the call records.
func BenchmarkFirstCallOfARoute(b *testing.B) {
	names := make([]string, interceptor.MaxRoutes)
	for i := range names {
		names[i] = fmt.Sprintf("/proxy.v1.Any/M%d", i)
	}
	cc, err := grpc.NewClient("passthrough:///bench", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer cc.Close()
	ok := func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error { return nil }
	var ic grpc.UnaryClientInterceptor
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if i%len(names) == 0 {
			ic = interceptor.NewClient(interceptor.WithTelemetry(interceptor.Telemetry{TracerProvider: noop.NewTracerProvider()})).Unary()
		}
		_ = ic(context.Background(), names[i%len(names)], &echov1.PutRequest{}, &echov1.PutResponse{}, cc, ok)
	}
}
