package interceptor

import (
	"context"
	"net"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	grpccodes "google.golang.org/grpc/codes"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/internal/codename"
)

// ScopeName is the instrumentation scope of the tracer and meter.
const ScopeName = "github.com/stormguard/stormguard/interceptor"

// Span event names: one event on the call span per decision.
const (
	EventRetryScheduled  = "stormguard.retry.scheduled"
	EventRetryRefused    = "stormguard.retry.refused"
	EventHedgeSent       = "stormguard.hedge.sent"
	EventHedgeRefused    = "stormguard.hedge.refused"
	EventBreakerRejected = "stormguard.breaker.rejected"
	EventDeadlineFast    = "stormguard.deadline.fail_fast"
)

// Attribute keys of stormguard's spans, events and metrics.
const (
	// AttrReason says why a retry or hedge was refused: one of the Reason
	// values.
	AttrReason = attribute.Key("stormguard.reason")
	// AttrAttemptKind is first, retry or hedge.
	AttrAttemptKind = attribute.Key("stormguard.attempt.kind")
	// AttrPreviousAttempts is the number of attempts sent before this one
	// (gRFC A6 / A72 "previous-rpc-attempts").
	AttrPreviousAttempts = attribute.Key("previous-rpc-attempts")
	// AttrTransparentRetry is always false on stormguard's attempt spans
	// (gRFC A72); grpc's own transparent retries happen below them.
	AttrTransparentRetry = attribute.Key("transparent-retry")
	// AttrDelay is the wait before a retry or hedge, in seconds.
	AttrDelay = attribute.Key("stormguard.delay_s")
	// AttrCause is the status code that caused a retry.
	AttrCause = attribute.Key("stormguard.cause")
	// AttrHedge is true on attempt spans of hedges.
	AttrHedge = attribute.Key("stormguard.hedge")
	// AttrPushback is the server's grpc-retry-pushback-ms, when it sent one.
	AttrPushback = attribute.Key("stormguard.pushback_ms")
	// AttrBreakerState is closed, open or half-open.
	AttrBreakerState = attribute.Key("stormguard.breaker.state")
)

// Reason says why a retry or a hedge was not sent.
type Reason string

// Reasons for a refused retry or hedge.
const (
	ReasonBudget        Reason = "budget"         // the retry budget had no token
	ReasonBreaker       Reason = "breaker"        // the target's breaker is open
	ReasonDeadline      Reason = "deadline"       // the backoff would end past the deadline
	ReasonPushback      Reason = "pushback"       // the server said not to retry
	ReasonNotIdempotent Reason = "not_idempotent" // the method may not be repeated
	ReasonMaxAttempts   Reason = "max_attempts"   // the attempt limit is reached
	ReasonCode          Reason = "code"           // the status code is not retryable
)

// Attempt kinds.
const (
	kindFirst = iota
	kindRetry
	kindHedge
	numKinds
)

var kindNames = [numKinds]string{"first", "retry", "hedge"}

var allReasons = []Reason{ReasonBudget, ReasonBreaker, ReasonDeadline, ReasonPushback, ReasonNotIdempotent, ReasonMaxAttempts, ReasonCode}

// telemetry holds the tracer and the instruments, created once per Client.
type telemetry struct {
	tracer   trace.Tracer
	calls    metric.Int64Counter
	attempts metric.Int64Counter
	refusals metric.Int64Counter
	retries  metric.Int64Histogram
	hedges   metric.Int64Histogram
	duration metric.Float64Histogram
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
		t.tracer = tp.Tracer(ScopeName, trace.WithSchemaURL(semconv.SchemaURL))
	}
	m := mp.Meter(ScopeName, metric.WithSchemaURL(semconv.SchemaURL))
	// Instrument errors are reported to the global OTel error handler; the
	// returned instrument is then a working no-op.
	var err error
	t.calls, err = m.Int64Counter("stormguard.client.calls", metric.WithUnit("{call}"),
		metric.WithDescription("Logical client calls (one per RPC, whatever its attempts), by final status."))
	handle(err)
	t.attempts, err = m.Int64Counter("stormguard.client.attempts", metric.WithUnit("{attempt}"),
		metric.WithDescription("Attempts sent, by kind (first, retry, hedge). Amplification = attempts / calls."))
	handle(err)
	t.refusals, err = m.Int64Counter("stormguard.client.refusals", metric.WithUnit("{refusal}"),
		metric.WithDescription("Retries, hedges and calls refused, by reason."))
	handle(err)
	t.retries, err = m.Int64Histogram("grpc.client.call.retries", metric.WithUnit("{retry}"),
		metric.WithDescription("Retries per call, for calls that retried (gRFC A96)."),
		metric.WithExplicitBucketBoundaries(1, 2, 3, 4, 5, 10))
	handle(err)
	t.hedges, err = m.Int64Histogram("grpc.client.call.hedges", metric.WithUnit("{hedge}"),
		metric.WithDescription("Hedges per call, for calls that hedged (gRFC A96)."),
		metric.WithExplicitBucketBoundaries(1, 2, 3, 4, 5, 10))
	handle(err)
	t.duration, err = m.Float64Histogram("rpc.client.call.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of logical client calls, all attempts included."))
	handle(err)

	_, err = m.Int64ObservableGauge("stormguard.breaker.state", metric.WithUnit("{state}"),
		metric.WithDescription("Breaker state per target: 0 closed, 1 open, 2 half-open."),
		metric.WithInt64Callback(func(_ context.Context, obs metric.Int64Observer) error {
			if c.breakers == nil {
				return nil
			}
			c.breakers.Range(func(target string, b *breaker.Breaker) bool {
				obs.Observe(breakerStateValue(b.State()), metric.WithAttributes(targetAttrs(target)...))
				return true
			})
			return nil
		}))
	handle(err)
	_, err = m.Float64ObservableGauge("stormguard.budget.balance", metric.WithUnit("{retry}"),
		metric.WithDescription("Retries (or hedges) the target's budget would grant now."),
		metric.WithFloat64Callback(func(_ context.Context, obs metric.Float64Observer) error {
			if c.budgets == nil {
				return nil
			}
			c.budgets.Range(func(target string, b *budget.Budget) bool {
				obs.Observe(b.Stats().Balance, metric.WithAttributes(targetAttrs(target)...))
				return true
			})
			return nil
		}))
	handle(err)
	return t
}

func handle(err error) {
	if err != nil {
		otel.Handle(err)
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
	attrs := []attribute.KeyValue{semconv.ServerAddress(host)}
	if port > 0 {
		attrs = append(attrs, semconv.ServerPort(port))
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

// routeTelemetry holds what a route precomputes so that a call records
// spans and metrics without building attributes or option slices.
type routeTelemetry struct {
	callStart    []trace.SpanStartOption
	attemptStart [numKinds][]trace.SpanStartOption
	attemptOpts  [numKinds][]metric.AddOption
	callOpts     [grpccodes.Unauthenticated + 1][]metric.AddOption
	callRecord   []metric.RecordOption
	refusalOpts  map[Reason][]metric.AddOption
	statusAttr   [grpccodes.Unauthenticated + 1]attribute.KeyValue
}

func newRouteTelemetry(method, target string) *routeTelemetry {
	name := strings.TrimPrefix(method, "/")
	base := append([]attribute.KeyValue{semconv.RPCSystemNameGRPC, semconv.RPCMethod(name)}, targetAttrs(target)...)
	rt := &routeTelemetry{refusalOpts: map[Reason][]metric.AddOption{}}
	rt.callStart = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(base...)}
	for k := range numKinds {
		attrs := []attribute.KeyValue{
			AttrAttemptKind.String(kindNames[k]),
			AttrHedge.Bool(k == kindHedge),
			AttrTransparentRetry.Bool(false),
		}
		rt.attemptStart[k] = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...)}
		set := attribute.NewSet(append(append([]attribute.KeyValue(nil), base...), AttrAttemptKind.String(kindNames[k]))...)
		rt.attemptOpts[k] = []metric.AddOption{metric.WithAttributeSet(set)}
	}
	for c := range rt.callOpts {
		rt.statusAttr[c] = semconv.RPCResponseStatusCode(codename.Name(grpccodes.Code(c)))
		set := attribute.NewSet(append(append([]attribute.KeyValue(nil), base...), rt.statusAttr[c])...)
		rt.callOpts[c] = []metric.AddOption{metric.WithAttributeSet(set)}
	}
	rt.callRecord = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(base...))}
	for _, r := range allReasons {
		set := attribute.NewSet(append(append([]attribute.KeyValue(nil), base...), AttrReason.String(string(r)))...)
		rt.refusalOpts[r] = []metric.AddOption{metric.WithAttributeSet(set)}
	}
	return rt
}

func codeIndex(c grpccodes.Code) int {
	if c > grpccodes.Unauthenticated {
		return int(grpccodes.Unknown)
	}
	return int(c)
}

// endSpan sets the span's status from a gRPC code and ends it.
func endSpan(span trace.Span, rt *routeTelemetry, code grpccodes.Code, msg string) {
	if span == nil {
		return
	}
	if span.IsRecording() {
		span.SetAttributes(rt.statusAttr[codeIndex(code)])
		if code != grpccodes.OK {
			span.SetStatus(codes.Error, msg)
		}
	}
	span.End()
}
