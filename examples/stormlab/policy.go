package main

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/stormguard/stormguard/semconv"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/grpc"

	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
	"github.com/stormguard/stormguard/overload"
)

// The backoff of every retrying row. It is small so that the lab is fast,
// and the same for the suite and for grpc-go as far as their formulas
// allow: the suite's n-th retry waits a random time in [d/2, d] with
// d = min(10ms, 1ms·2ⁿ⁻¹); grpc-go's waits d·[0.8, 1.2].
const (
	backoffBase = time.Millisecond
	backoffMax  = 10 * time.Millisecond
	// maxAttempts is every retrying row's limit, the first attempt included.
	maxAttempts = 3
)

// policyKey names a client setup: one row of every scenario's table.
type policyKey string

// The six setups compared in every scenario, in table order.
const (
	noRetries     policyKey = "none"          // grpc-go with retries disabled
	naive         policyKey = "naive"         // the suite with budget and breaker off
	grpcRetry     policyKey = "grpc"          // grpc-go's service-config retryPolicy
	grpcThrottled policyKey = "grpc-throttle" // ... plus retryThrottling
	suiteBudget   policyKey = "budget"        // the suite, budget on, breaker off
	suiteDefaults policyKey = "suite"         // the suite as NewClient() and NewServer() come
	// The suite's defaults with one of the server's overload mechanisms
	// off (the metastable scenario's extra rows).
	suiteNoAdmission policyKey = "suite-noadmission"
	suiteNoShedding  policyKey = "suite-noshedding"
	// The suite's client with a plain server, and with its server without
	// the overload protection (scenario 11, the overload blip).
	suiteClientOnly       policyKey = "suite-clientonly"
	suiteNoOverload       policyKey = "suite-nooverload"
	suiteBudgetNoOverload policyKey = "budget-nooverload"
	// The suite's defaults in shadow mode (WithShadowMode), against the
	// naive row's servers: it sends what the naive row sends and records
	// what its budget and breaker would have refused (scenarios 1-4, 6).
	suiteShadow policyKey = "suite-shadow"
	// The suite's defaults with calls marked by priority (the priority
	// scenario): each by its caller's class, or every call critical.
	suitePriority    policyKey = "suite-priority"
	suiteAllCritical policyKey = "suite-all-critical"
	// The suite's defaults with adaptive hedging on every method that may
	// be hedged (WithHedging(0, 2)): the metastable scenario's hedging row.
	suiteHedging policyKey = "suite-hedging"
)

// policy is one client setup, and the server side that goes with it.
type policy struct {
	key  policyKey
	name string
}

// policies returns the six setups, in table order.
func policies() []policy {
	return []policy{
		{noRetries, "no retries"},
		{naive, "3 attempts, no budget"},
		{grpcRetry, "grpc-go retryPolicy"},
		{grpcThrottled, "grpc-go retryPolicy+throttling"},
		{suiteBudget, "stormguard, budget only"},
		{suiteDefaults, "stormguard defaults"},
	}
}

// withShadow returns the six setups and the suite in shadow mode.
func withShadow() []policy {
	return append(policies(), policy{suiteShadow, "stormguard, shadow mode"})
}

// grpcServiceConfig is grpc-go's retry policy for the demo service, as a
// service config: 3 attempts on UNAVAILABLE, the lab's backoff, and,
// when throttled, the retryThrottling of gRFC A6 (tokens start at 10;
// each failed attempt takes one, each successful RPC gives 0.1 back;
// retries stop while 5 or fewer are left).
func grpcServiceConfig(throttled bool) string { return grpcServiceConfigWith(throttled, maxAttempts) }

// grpcServiceConfigWith is grpcServiceConfig with attempts in all.
func grpcServiceConfigWith(throttled bool, attempts int) string {
	throttling := ""
	if throttled {
		throttling = `, "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}`
	}
	return fmt.Sprintf(`{
  "methodConfig": [{
    "name": [{"service": %q}],
    "retryPolicy": {
      "maxAttempts": %d,
      "initialBackoff": "%gs",
      "maxBackoff": "%gs",
      "backoffMultiplier": 2,
      "retryableStatusCodes": ["UNAVAILABLE"]
    }
  }]%s
}`, echov1.EchoService_ServiceDesc.ServiceName, attempts, backoffBase.Seconds(), backoffMax.Seconds(), throttling)
}

// clientOptions are the suite's options for p (nil for the other rows),
// followed by extra.
func (p policy) clientOptions(extra ...interceptor.ClientOption) []interceptor.ClientOption {
	opts := []interceptor.ClientOption{interceptor.WithRetryPolicy(interceptor.RetryPolicy{BackoffBase: backoffBase, BackoffMax: backoffMax}), interceptor.WithRetryPolicy(interceptor.RetryPolicy{MaxAttempts: maxAttempts})}
	switch p.key {
	case naive:
		opts = append(opts, interceptor.WithBudget(nil), interceptor.WithBreaker(nil))
	case suiteBudget, suiteBudgetNoOverload:
		opts = append(opts, interceptor.WithBreaker(nil))
	case suiteShadow:
		opts = append(opts, interceptor.WithShadowMode())
	case suiteHedging:
		opts = append(opts, interceptor.WithHedging(0, 2))
	case suiteDefaults, suiteOutlier, suiteByHand, suiteNoAdmission, suiteNoShedding, suiteClientOnly, suiteNoOverload, suitePriority, suiteAllCritical:
	default:
		return nil
	}
	return append(opts, extra...)
}

// server returns the suite's server side of p's setup, and its overload
// protection: as it comes for the suite's rows (with one overload
// mechanism off for the extra rows), without the don't-retry pushback,
// the overload protection and the retry budget for the naive row, and nil
// (plain grpc-go servers) for the others.
func (p policy) server() (*interceptor.Server, *overload.Guard) {
	var g *overload.Guard
	switch p.key {
	case naive, suiteShadow:
		return interceptor.NewServer(interceptor.WithoutPushback(), interceptor.WithOverload(nil), interceptor.WithServerBudget(nil)), nil
	case suiteBudget, suiteDefaults, suiteOutlier, suiteByHand, suitePriority, suiteAllCritical, suiteHedging:
		g = overload.New(overload.Config{})
	case suiteNoAdmission:
		g = overload.New(overload.Config{NoAdmission: true})
	case suiteNoShedding:
		g = overload.New(overload.Config{NoShedding: true})
	case suiteNoOverload, suiteBudgetNoOverload:
	default:
		return nil, nil
	}
	return interceptor.NewServer(interceptor.WithOverload(g)), g
}

// hasServer reports whether p's setup has the suite's server side.
func (p policy) hasServer() bool {
	s, _ := p.server()
	return s != nil
}

// env is the servers and connections of one row, on 127.0.0.1, stopped
// and closed together.
type env struct {
	p       policy
	extra   []interceptor.ClientOption // more options for the suite's clients
	servers []*origin.Server
	guards  []*overload.Guard // the overload protection of the suite's server sides, if any
	conns   []*grpc.ClientConn
	// shadow reads the would-refuse counter of the shadow row's clients,
	// which share shadowMP.
	shadow   *sdkmetric.ManualReader
	shadowMP *sdkmetric.MeterProvider
}

func newEnv(p policy, extra ...interceptor.ClientOption) *env { return &env{p: p, extra: extra} }

// serve serves svc behind p's server side on a fresh 127.0.0.1 port, with
// opts after the policy's own options.
func (e *env) serve(svc origin.Registerer, opts ...grpc.ServerOption) (*origin.Listener, error) {
	l, err := origin.TCP()
	if err != nil {
		return nil, err
	}
	var sopts []grpc.ServerOption
	if s, g := e.p.server(); s != nil {
		if g != nil {
			e.guards = append(e.guards, g)
		}
		sopts = append(sopts, grpc.ChainUnaryInterceptor(s.Unary()), grpc.ChainStreamInterceptor(s.Stream()))
	}
	e.servers = append(e.servers, origin.Serve(l, svc, append(sopts, opts...)...))
	return l, nil
}

// dial returns a client of l through p's client side. Each call makes a
// new suite Client, so each has its own budgets and breakers.
func (e *env) dial(l *origin.Listener) (echov1.EchoServiceClient, error) {
	var cc *grpc.ClientConn
	var err error
	switch e.p.key {
	case noRetries:
		cc, err = l.Dial()
	case grpcRetry, grpcThrottled:
		cc, err = grpc.NewClient(l.Target, l.ConnectOptions(grpc.WithDefaultServiceConfig(grpcServiceConfig(e.p.key == grpcThrottled)))...)
	default:
		extra := e.extra
		if e.p.key == suiteShadow {
			if e.shadow == nil {
				e.shadow = sdkmetric.NewManualReader()
				e.shadowMP = sdkmetric.NewMeterProvider(sdkmetric.WithReader(e.shadow))
			}
			extra = append(slices.Clip(extra), interceptor.WithTelemetry(interceptor.Telemetry{MeterProvider: e.shadowMP}))
		}
		guard := interceptor.NewClient(e.p.clientOptions(extra...)...)
		cc, err = l.Dial(grpc.WithChainUnaryInterceptor(guard.Unary()), grpc.WithChainStreamInterceptor(guard.Stream()))
	}
	if err != nil {
		return nil, err
	}
	e.conns = append(e.conns, cc)
	return echov1.NewEchoServiceClient(cc), nil
}

// wouldRefuse returns what the shadow row's clients would have refused so
// far, by reason (nil for the other rows).
func (e *env) wouldRefuse() map[string]int {
	if e.shadow == nil {
		return nil
	}
	var rm metricdata.ResourceMetrics
	if err := e.shadow.Collect(context.Background(), &rm); err != nil {
		return nil
	}
	out := map[string]int{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			sum, ok := m.Data.(metricdata.Sum[int64])
			if m.Name != semconv.MetricWouldRefuse || !ok {
				continue
			}
			for _, dp := range sum.DataPoints {
				reason, _ := dp.Attributes.Value(semconv.AttrReason)
				out[reason.AsString()] += int(dp.Value)
			}
		}
	}
	return out
}

// oneHop serves svc and returns a client of it.
func (e *env) oneHop(svc origin.Registerer, opts ...grpc.ServerOption) (echov1.EchoServiceClient, error) {
	l, err := e.serve(svc, opts...)
	if err != nil {
		return nil, err
	}
	return e.dial(l)
}

// chain serves o behind hops services, each forwarding to the next through
// p's client side, and returns a client of the top one:
// client → hop → ... → hop → o.
func (e *env) chain(o *origin.Origin, hops int) (echov1.EchoServiceClient, error) {
	l, err := e.serve(o)
	if err != nil {
		return nil, err
	}
	for range hops {
		next, err := e.dial(l)
		if err != nil {
			return nil, err
		}
		if l, err = e.serve(&origin.Hop{Next: next}); err != nil {
			return nil, err
		}
	}
	return e.dial(l)
}

// clients dials n clients of l (each its own suite Client) and waits until
// every connection of e is ready, so that the first calls do not queue
// behind the connection set-up.
func (e *env) clients(ctx context.Context, l *origin.Listener, n int) ([]echov1.EchoServiceClient, error) {
	var clients []echov1.EchoServiceClient
	for range n {
		c, err := e.dial(l)
		if err != nil {
			return nil, err
		}
		clients = append(clients, c)
	}
	return clients, connectAll(ctx, e.conns)
}

// close closes the connections, then stops the servers (waiting for their
// handlers when they were served with grpc.WaitForHandlers). A second
// close does nothing.
func (e *env) close() {
	for _, cc := range e.conns {
		_ = cc.Close()
	}
	for i := len(e.servers) - 1; i >= 0; i-- {
		e.servers[i].Stop()
	}
	if e.shadowMP != nil {
		_ = e.shadowMP.Shutdown(context.Background())
		e.shadowMP = nil
	}
	e.conns, e.servers = nil, nil
}
