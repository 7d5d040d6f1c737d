package interceptor

import (
	"context"
	"net"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/stormguard/stormguard/semconv"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	otelconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	grpccodes "google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/internal/codename"
	"github.com/stormguard/stormguard/internal/engine"
)

// gRFC A66 attribute keys of the grpc.client.call.* histograms.
const (
	attrGRPCMethod = attribute.Key("grpc.method")
	attrGRPCTarget = semconv.AttrGRPCTarget
	attrGRPCStatus = attribute.Key("grpc.status")
)

// telemetry holds the tracer and the instruments of one Client.
type telemetry struct {
	tracer      trace.Tracer // nil: spans off (an explicit no-op provider)
	calls       metric.Int64Counter
	attempts    metric.Int64Counter
	refusals    metric.Int64Counter
	wouldRefuse metric.Int64Counter
	retries     metric.Int64Histogram
	hedges      metric.Int64Histogram
	retryDelay  metric.Float64Histogram
	duration    metric.Float64Histogram
	reg         metric.Registration // the gauges' callback; nil if it failed
}

func newTelemetry(o *clientOptions, c *Client) *telemetry {
	tp := o.tracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	mp := o.meterProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	t := &telemetry{}
	// A no-op provider given explicitly costs nothing at all: no spans are
	// started (the global provider, which may get an SDK later, always
	// gets its spans).
	if _, isNoop := tp.(noop.TracerProvider); !isNoop {
		t.tracer = tp.Tracer(semconv.ScopeName, trace.WithSchemaURL(otelconv.SchemaURL))
	}
	m := mp.Meter(semconv.ScopeName, metric.WithSchemaURL(otelconv.SchemaURL))
	// Instrument errors go to the global OTel error handler; the returned
	// instrument is then a working no-op.
	var err error
	t.calls, err = m.Int64Counter(semconv.MetricCalls, metric.WithUnit("{call}"),
		metric.WithDescription("Logical client calls (one per RPC, whatever its attempts), by final status."))
	handle(err)
	t.attempts, err = m.Int64Counter(semconv.MetricAttempts, metric.WithUnit("{attempt}"),
		metric.WithDescription("Attempts sent, by kind (first, retry, hedge). Amplification = attempts / calls."))
	handle(err)
	t.refusals, err = m.Int64Counter(semconv.MetricRefusals, metric.WithUnit("{refusal}"),
		metric.WithDescription("Retries, hedges and calls refused, by reason."))
	handle(err)
	t.wouldRefuse, err = m.Int64Counter(semconv.MetricWouldRefuse, metric.WithUnit("{refusal}"),
		metric.WithDescription("Shadow mode: retries, hedges and calls the budget or the breaker would have refused, by reason."))
	handle(err)
	t.retries, err = m.Int64Histogram(semconv.MetricCallRetries, metric.WithUnit("{retry}"),
		metric.WithDescription("Retries per call, for calls that retried (gRFC A96)."),
		metric.WithExplicitBucketBoundaries(1, 2, 3, 4, 5, 10))
	handle(err)
	t.hedges, err = m.Int64Histogram(semconv.MetricCallHedges, metric.WithUnit("{hedge}"),
		metric.WithDescription("Hedges per call, for calls that hedged (gRFC A96)."),
		metric.WithExplicitBucketBoundaries(1, 2, 3, 4, 5, 10))
	handle(err)
	t.retryDelay, err = m.Float64Histogram(semconv.MetricCallRetryDelay, metric.WithUnit("s"),
		metric.WithDescription("Total time with no attempt in flight between the attempts of a call, for calls that retried or hedged (gRFC A96)."),
		metric.WithExplicitBucketBoundaries(latencyBounds...))
	handle(err)
	t.duration, err = m.Float64Histogram(semconv.MetricCallDuration, metric.WithUnit("s"),
		metric.WithDescription("Duration of logical client calls, all attempts and backoffs included (gRFC A66)."),
		metric.WithExplicitBucketBoundaries(latencyBounds...))
	handle(err)
	t.reg = registerGauges(m, c)
	return t
}

// latencyBounds are gRFC A66's latency bucket boundaries, in seconds, of
// the call duration and retry delay histograms.
var latencyBounds = []float64{0, 0.00001, 0.00005, 0.0001, 0.0003, 0.0006, 0.0008, 0.001, 0.002,
	0.003, 0.004, 0.005, 0.006, 0.008, 0.01, 0.013, 0.016, 0.02, 0.025, 0.03, 0.04, 0.05, 0.065, 0.08,
	0.1, 0.13, 0.16, 0.2, 0.25, 0.3, 0.4, 0.5, 0.65, 0.8, 1, 2, 5, 10, 20, 50, 100}

// registerGauges registers this Client's breaker-state and budget-balance
// observations. The gauges are registered with a callback per Client
// (Meter.RegisterCallback), not at creation, because creating an
// instrument a second time on one Meter returns the first one and drops
// the new callbacks: two Clients on one MeterProvider would otherwise
// report only the first Client's targets.
func registerGauges(m metric.Meter, c *Client) metric.Registration {
	state, err := m.Int64ObservableGauge(semconv.MetricBreakerState, metric.WithUnit("{state}"),
		metric.WithDescription("Breaker state per target and method: 0 closed, 1 open, 2 half-open."))
	handle(err)
	balance, err2 := m.Float64ObservableGauge(semconv.MetricBudgetBalance, metric.WithUnit("{retry}"),
		metric.WithDescription("Retries (or hedges) the target's budget would grant now."))
	handle(err2)
	if err != nil || err2 != nil {
		return nil
	}
	reg, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		observeBreakers(c, func(v int64, attrs []attribute.KeyValue) {
			o.ObserveInt64(state, v, metric.WithAttributes(attrs...))
		})
		if c.budgets != nil {
			now := c.now()
			c.budgets.Range(func(target string, b *budget.Budget) bool {
				o.ObserveFloat64(balance, b.StatsAt(now).Balance, metric.WithAttributes(targetAttrs(target)...))
				return true
			})
		}
		return nil
	}, state, balance)
	handle(err)
	return reg
}

func handle(err error) {
	if err != nil {
		otel.Handle(err)
	}
}

// observeBreakers reports the state of each breaker of c with its target
// and method attributes. The methods the protobuf registry does not know
// share the method "_OTHER" (as in the other metrics): their breakers are
// reported as one, open if any is open, else half-open if any is.
func observeBreakers(c *Client, observe func(v int64, attrs []attribute.KeyValue)) {
	type point struct {
		v     int64
		attrs []attribute.KeyValue
	}
	var others map[string]*point // by target
	c.brk.Range(func(k routeKey, rb *routeBreaker) bool {
		v := breakerStateValue(rb.b.StateAt(c.now()))
		if rb.known {
			observe(v, append(targetAttrs(k.target), otelconv.RPCMethod(strings.TrimPrefix(k.method, "/"))))
			return true
		}
		if others == nil {
			others = map[string]*point{}
		}
		p, ok := others[k.target]
		if !ok {
			p = &point{v: v, attrs: append(targetAttrs(k.target), otelconv.RPCMethod(otherMethodSemconv))}
			others[k.target] = p
		}
		if v == 1 || (v == 2 && p.v == 0) { // open wins, then half-open
			p.v = v
		}
		return true
	})
	for _, p := range others {
		observe(p.v, p.attrs)
	}
}

func breakerStateValue(s breaker.State) int64 {
	switch s {
	case breaker.StateOpen:
		return 1
	case breaker.StateHalfOpen:
		return 2
	}
	return 0
}

// targetAttrs returns server.address and server.port for a grpc target
// ("dns:///host:port", "host:port", "passthrough:///name", ...).
func targetAttrs(target string) []attribute.KeyValue {
	host, port := splitTarget(target)
	attrs := []attribute.KeyValue{otelconv.ServerAddress(host)}
	if port > 0 {
		attrs = append(attrs, otelconv.ServerPort(port))
	}
	return attrs
}

func splitTarget(target string) (host string, port int) {
	rest := target
	if i := strings.Index(rest, "://"); i >= 0 {
		rest = rest[i+3:]
		if j := strings.IndexByte(rest, '/'); j >= 0 { // authority, then endpoint
			rest = rest[j+1:]
		}
	} else if i := strings.Index(rest, ":///"); i >= 0 {
		rest = rest[i+4:]
	}
	if h, p, err := net.SplitHostPort(rest); err == nil {
		if n, err := strconv.Atoi(p); err == nil && n > 0 && n < 65536 {
			return h, n
		}
		return h, 0
	}
	return rest, 0
}

// numCodes is the number of gRPC status codes (OK to Unauthenticated).
const numCodes = int(grpccodes.Unauthenticated) + 1

func codeIndex(c grpccodes.Code) int {
	if int(c) >= numCodes {
		return int(grpccodes.Unknown)
	}
	return int(c)
}

// otherMethod is the metric attribute value of a method the protobuf
// registry does not know (semantic conventions: "_OTHER"; gRFC A66:
// "other"), so that a proxy forwarding caller-chosen names cannot grow
// metric cardinality without bound.
const (
	otherMethodSemconv = "_OTHER"
	otherMethodA66     = "other"
)

// routeTelemetry is what a route's calls record with: the names of its
// spans, and its metrics' attribute sets and option slices (routeMetrics).
type routeTelemetry struct {
	name string // span name: "pkg.Svc/Method"
	*routeMetrics
	attemptName lazy[string] // "Attempt.pkg.Svc/Method", made when a span needs it
}

// routeMetrics holds what a route's calls record metrics with: attribute
// sets and option slices, built on first use and then shared, so that a
// call records spans and metrics without building any, and a route that
// only ever sees OK costs only what OK needs. The methods the protobuf
// registry does not know are recorded as one ("_OTHER"): their routes to
// one target share one routeMetrics, so that a proxy forwarding
// caller-chosen names pays for it once (see Client.otherMetrics).
type routeMetrics struct {
	base     []attribute.KeyValue
	a66      []attribute.KeyValue
	callSpan []trace.SpanStartOption

	attempt  [engine.NumKinds]lazy[attemptOptions]
	calls    [numCodes]lazy[[]metric.AddOption]
	duration [numCodes]lazy[[]metric.RecordOption]
	refusals lazyMap[Reason, []metric.AddOption]
	would    lazyMap[Reason, []metric.AddOption]
	perCall  lazy[[]metric.RecordOption] // retries, hedges, retry delay
}

type attemptOptions struct {
	span   []trace.SpanStartOption
	metric []metric.AddOption
}

// newRouteTelemetry returns the telemetry of the route of method to target
// (its name: see WithTargetName). m is its metrics, when they are shared
// (a method the registry does not know); nil makes them.
func newRouteTelemetry(method, target string, known, instrumented bool, m *routeMetrics) *routeTelemetry {
	name := strings.TrimPrefix(method, "/")
	if instrumented {
		name = "Sent." + name // gRFC A72: the call span above instrumented attempts
	}
	if m == nil {
		m = newRouteMetrics(method, target, known, instrumented)
	}
	return &routeTelemetry{name: name, routeMetrics: m}
}

// newRouteMetrics makes the metrics of method's routes to target; for a
// method the registry does not know, of every such method's.
func newRouteMetrics(method, target string, known, instrumented bool) *routeMetrics {
	semName := strings.TrimPrefix(method, "/")
	a66Name := semName
	if !known {
		semName, a66Name = otherMethodSemconv, otherMethodA66
	}
	m := &routeMetrics{
		base: append([]attribute.KeyValue{otelconv.RPCSystemNameGRPC, otelconv.RPCMethod(semName)}, targetAttrs(target)...),
		a66:  []attribute.KeyValue{attrGRPCMethod.String(a66Name), attrGRPCTarget.String(target)},
	}
	kind := trace.SpanKindClient
	if instrumented {
		kind = trace.SpanKindInternal
	}
	m.callSpan = []trace.SpanStartOption{trace.WithSpanKind(kind), trace.WithAttributes(m.base...)}
	return m
}

// attemptSpanName returns the name of the route's attempt spans.
func (rt *routeTelemetry) attemptSpanName() string {
	return *rt.attemptName.get(func() string { return "Attempt." + strings.TrimPrefix(rt.name, "Sent.") })
}

func (rt *routeMetrics) attemptOpts(k engine.Kind) *attemptOptions {
	return rt.attempt[k].get(func() attemptOptions {
		attrs := []attribute.KeyValue{
			semconv.AttrAttemptKind.String(k.String()),
			semconv.AttrHedge.Bool(k == engine.Hedge),
			semconv.AttrTransparentRetry.Bool(false),
		}
		return attemptOptions{
			span:   []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...)},
			metric: addOpts(rt.base, semconv.AttrAttemptKind.String(k.String())),
		}
	})
}

func (rt *routeMetrics) callOpts(c grpccodes.Code) []metric.AddOption {
	i := codeIndex(c)
	return *rt.calls[i].get(func() []metric.AddOption {
		return addOpts(rt.base, otelconv.RPCResponseStatusCode(codename.Name(grpccodes.Code(i))))
	})
}

func (rt *routeMetrics) durationOpts(c grpccodes.Code) []metric.RecordOption {
	i := codeIndex(c)
	return *rt.duration[i].get(func() []metric.RecordOption {
		return recordOpts(rt.a66, attrGRPCStatus.String(codename.Name(grpccodes.Code(i))))
	})
}

func (rt *routeMetrics) perCallOpts() []metric.RecordOption {
	return *rt.perCall.get(func() []metric.RecordOption { return recordOpts(rt.a66) })
}

func (rt *routeMetrics) refusalOpts(r Reason) []metric.AddOption {
	return rt.refusals.get(r, func() []metric.AddOption { return addOpts(rt.base, semconv.AttrReason.String(string(r))) })
}

func (rt *routeMetrics) wouldRefuseOpts(r Reason) []metric.AddOption {
	return rt.would.get(r, func() []metric.AddOption { return addOpts(rt.base, semconv.AttrReason.String(string(r))) })
}

func addOpts(base []attribute.KeyValue, extra ...attribute.KeyValue) []metric.AddOption {
	set := attribute.NewSet(append(append([]attribute.KeyValue(nil), base...), extra...)...)
	return []metric.AddOption{metric.WithAttributeSet(set)}
}

func recordOpts(base []attribute.KeyValue, extra ...attribute.KeyValue) []metric.RecordOption {
	set := attribute.NewSet(append(append([]attribute.KeyValue(nil), base...), extra...)...)
	return []metric.RecordOption{metric.WithAttributeSet(set)}
}

// lazy is a value built on first use, lock-free afterwards. Concurrent
// first uses may each build it; one result wins and the others are
// dropped.
type lazy[T any] struct{ p atomic.Pointer[T] }

func (l *lazy[T]) get(build func() T) *T {
	if v := l.p.Load(); v != nil {
		return v
	}
	v := build()
	if l.p.CompareAndSwap(nil, &v) {
		return &v
	}
	return l.p.Load()
}

// lazyMap is lazy per key, for the few keys of the refusal table.
type lazyMap[K comparable, V any] struct {
	p atomic.Pointer[map[K]V]
}

func (l *lazyMap[K, V]) get(k K, build func() V) V {
	for {
		old := l.p.Load()
		if old != nil {
			if v, ok := (*old)[k]; ok {
				return v
			}
		}
		v := build()
		next := make(map[K]V, 1)
		if old != nil {
			for k2, v2 := range *old {
				next[k2] = v2
			}
		}
		next[k] = v
		if l.p.CompareAndSwap(old, &next) {
			return v
		}
	}
}

// endSpan sets the span's status from a gRPC code and ends it.
func endSpan(span trace.Span, code grpccodes.Code, msg string) {
	if span == nil {
		return
	}
	if span.IsRecording() {
		span.SetAttributes(otelconv.RPCResponseStatusCode(codename.Name(code)))
		if code != grpccodes.OK {
			span.SetStatus(codes.Error, msg)
		}
	}
	span.End()
}

// mdCarrier lets propagators write into gRPC metadata, whose keys must be
// lower case (propagation.HeaderCarrier would write "Traceparent", which
// grpc refuses).
type mdCarrier metadata.MD

func (c mdCarrier) Get(key string) string {
	if vs := metadata.MD(c).Get(key); len(vs) > 0 {
		return vs[0]
	}
	return ""
}

func (c mdCarrier) Set(key, value string) { metadata.MD(c).Set(key, value) }

func (c mdCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}
