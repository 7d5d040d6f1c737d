package interceptor_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
	"github.com/stormguard/stormguard/semconv"
)

func attrs(kvs []attribute.KeyValue) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range kvs {
		m[kv.Key] = kv.Value
	}
	return m
}

func eventNames(s tracetest.SpanStub) []string {
	var names []string
	for _, e := range s.Events {
		names = append(names, e.Name)
	}
	return names
}

// collect reads all metrics and returns the data points of name, by a
// describing attribute.
func collect(t *testing.T, r *sdkmetric.ManualReader) map[string]metricdata.Aggregation {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, r.Collect(context.Background(), &rm))
	out := map[string]metricdata.Aggregation{}
	for _, sm := range rm.ScopeMetrics {
		assert.Equal(t, semconv.ScopeName, sm.Scope.Name)
		for _, m := range sm.Metrics {
			out[m.Name] = m.Data
		}
	}
	return out
}

func sumBy(t *testing.T, agg metricdata.Aggregation, key attribute.Key) map[string]int64 {
	t.Helper()
	sum, ok := agg.(metricdata.Sum[int64])
	require.True(t, ok, "%T", agg)
	out := map[string]int64{}
	for _, dp := range sum.DataPoints {
		v, _ := dp.Attributes.Value(key)
		out[v.Emit()] += dp.Value
	}
	return out
}

func TestSpansAndMetricsOfACallRetriedTwice(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	e := newEnv(t, origin.FailFirst(2, codes.Unavailable), interceptor.WithBudget(nil), interceptor.WithTelemetry(interceptor.Telemetry{MeterProvider: mp}))
	_, err := e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: "r"})
	require.NoError(t, err)

	spans := e.spans.GetSpans()
	require.Len(t, spans, 4, "one call span and three attempt spans")
	var callSpan tracetest.SpanStub
	var attempts []tracetest.SpanStub
	for _, s := range spans {
		if s.Name == "echo.v1.EchoService/Put" {
			callSpan = s
		} else {
			attempts = append(attempts, s)
		}
	}
	require.Equal(t, "echo.v1.EchoService/Put", callSpan.Name)
	assert.Equal(t, trace.SpanKindClient, callSpan.SpanKind)
	ca := attrs(callSpan.Attributes)
	assert.Equal(t, "grpc", ca["rpc.system.name"].AsString())
	assert.Equal(t, "echo.v1.EchoService/Put", ca["rpc.method"].AsString())
	assert.Equal(t, "OK", ca["rpc.response.status_code"].AsString())
	assert.Contains(t, ca["server.address"].AsString(), "bufconn-")
	assert.Equal(t, []string{semconv.EventRetryScheduled, semconv.EventRetryScheduled}, eventNames(callSpan))
	for _, ev := range callSpan.Events {
		ea := attrs(ev.Attributes)
		assert.Equal(t, "UNAVAILABLE", ea[semconv.AttrCause].AsString())
		assert.Greater(t, ea[semconv.AttrDelay].AsFloat64(), 0.0)
	}

	require.Len(t, attempts, 3)
	for i, a := range attempts {
		assert.Equal(t, "Attempt.echo.v1.EchoService/Put", a.Name)
		assert.Equal(t, callSpan.SpanContext.SpanID(), a.Parent.SpanID(), "attempts are children of the call span")
		aa := attrs(a.Attributes)
		assert.Equal(t, int64(i), aa[semconv.AttrPreviousAttempts].AsInt64())
		wantKind, wantCode := "retry", "UNAVAILABLE"
		if i == 0 {
			wantKind = "first"
		}
		if i == 2 {
			wantCode = "OK"
		}
		assert.Equal(t, wantKind, aa[semconv.AttrAttemptKind].AsString())
		assert.False(t, aa[semconv.AttrHedge].AsBool())
		assert.Equal(t, wantCode, aa["rpc.response.status_code"].AsString())
	}
	assert.True(t, attempts[0].EndTime.Before(attempts[1].StartTime))

	m := collect(t, reader)
	assert.Equal(t, map[string]int64{"first": 1, "retry": 2}, sumBy(t, m["stormguard.client.attempts"], semconv.AttrAttemptKind))
	assert.Equal(t, map[string]int64{"OK": 1}, sumBy(t, m["stormguard.client.calls"], "rpc.response.status_code"))
	retries, ok := m["grpc.client.call.retries"].(metricdata.Histogram[int64])
	require.True(t, ok)
	require.Len(t, retries.DataPoints, 1)
	assert.Equal(t, int64(2), retries.DataPoints[0].Sum)
	state, ok := m["stormguard.breaker.state"].(metricdata.Gauge[int64])
	require.True(t, ok)
	require.Len(t, state.DataPoints, 1)
	assert.Equal(t, int64(0), state.DataPoints[0].Value, "closed")
}

func TestRefusalEventsAndMetrics(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	e := newEnv(t, origin.Always(codes.Unavailable), interceptor.WithBudget(budget.NewRegistry(budgetNoBurst())), interceptor.WithTelemetry(interceptor.Telemetry{MeterProvider: mp}))
	_, _ = e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: "a"})
	_, _ = e.echo.Notify(t.Context(), &echov1.NotifyRequest{RequestId: "b"})
	_, _ = e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: "c"}, interceptor.MaxAttempts(1))

	reasons := map[string]string{}
	for _, s := range e.spans.GetSpans() {
		for _, ev := range s.Events {
			if ev.Name == semconv.EventRetryRefused {
				reasons[s.Name] += attrs(ev.Attributes)[semconv.AttrReason].AsString() + ";"
			}
		}
	}
	assert.Equal(t, map[string]string{
		"echo.v1.EchoService/Put":    "budget;max_attempts;",
		"echo.v1.EchoService/Notify": "not_idempotent;",
	}, reasons)
	m := collect(t, reader)
	assert.Equal(t, map[string]int64{"budget": 1, "not_idempotent": 1, "max_attempts": 1},
		sumBy(t, m["stormguard.client.refusals"], semconv.AttrReason))
	assert.Equal(t, map[string]int64{"UNAVAILABLE": 3}, sumBy(t, m["stormguard.client.calls"], "rpc.response.status_code"))
}

func TestHedgeEvents(t *testing.T) {
	e := newEnv(t, firstAttemptStalls, interceptor.WithHedging(2*time.Millisecond, 2))
	_, err := e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: "h"})
	require.NoError(t, err)
	var callSpan tracetest.SpanStub
	hedges := 0
	for _, s := range e.spans.GetSpans() {
		if s.Name == "echo.v1.EchoService/Put" {
			callSpan = s
		} else if attrs(s.Attributes)[semconv.AttrHedge].AsBool() {
			hedges++
			assert.Equal(t, "hedge", attrs(s.Attributes)[semconv.AttrAttemptKind].AsString())
		}
	}
	assert.Equal(t, 1, hedges)
	assert.Equal(t, []string{semconv.EventHedgeSent}, eventNames(callSpan))
}

func TestPropagatorsInjectIntoEveryAttempt(t *testing.T) {
	e := newEnv(t, origin.FailFirst(1, codes.Unavailable), interceptor.WithBudget(nil),
		interceptor.WithTelemetry(interceptor.Telemetry{Propagators: propagation.TraceContext{}}))
	_, err := e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: "p"})
	require.NoError(t, err)
	calls := e.origin.Calls()
	require.Len(t, calls, 2)
	var parents []string
	for _, c := range calls {
		tp := c.Metadata.Get("traceparent")
		require.Len(t, tp, 1, "one traceparent per attempt")
		parents = append(parents, tp[0])
	}
	assert.NotEqual(t, parents[0], parents[1], "each attempt is its own parent span")
	// The traceparent names the attempt span.
	for _, s := range e.spans.GetSpans() {
		if s.Name == "Attempt.echo.v1.EchoService/Put" {
			assert.Contains(t, parents, "00-"+s.SpanContext.TraceID().String()+"-"+s.SpanContext.SpanID().String()+"-01")
		}
	}
}

// Two Clients on one MeterProvider both report their targets' breaker state
// and budget balance.
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
		guard := interceptor.NewClient(interceptor.WithTelemetry(interceptor.Telemetry{MeterProvider: mp}), interceptor.WithTelemetry(interceptor.Telemetry{TracerProvider: noop.NewTracerProvider()}))
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
	for _, name := range []string{semconv.MetricBreakerState, semconv.MetricBudgetBalance} {
		assert.ElementsMatch(t, targets, seen[name], name)
	}
	// Close unregisters a Client's gauges; the other's stay.
	require.NoError(t, guards[0].Close())
	seen = gaugeTargets(t, reader)
	for _, name := range []string{semconv.MetricBreakerState, semconv.MetricBudgetBalance} {
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

// Beside otelgrpc's stats handler, on one MeterProvider, no metric name is
// reported by both, and with WithInstrumentedAttempts a call has exactly one
// CLIENT span per attempt: otelgrpc's, each below the suite's Attempt span,
// all below one INTERNAL Sent span.
func TestBesideOtelgrpc(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	defer tp.Shutdown(context.Background())

	o := origin.New(origin.FailFirst(1, codes.Unavailable))
	l := origin.Bufconn()
	srv := origin.Serve(l, o)
	defer srv.Stop()
	guard := interceptor.NewClient(fast, interceptor.WithTelemetry(interceptor.Telemetry{TracerProvider: tp}), interceptor.WithTelemetry(interceptor.Telemetry{MeterProvider: mp}), interceptor.WithTelemetry(interceptor.Telemetry{InstrumentedAttempts: true}))
	cc, err := l.Dial(append(guard.DialOptions(), grpc.WithStatsHandler(otelgrpc.NewClientHandler(
		otelgrpc.WithTracerProvider(tp), otelgrpc.WithMeterProvider(mp))))...)
	require.NoError(t, err)
	defer cc.Close()
	_, err = echov1.NewEchoServiceClient(cc).Put(t.Context(), &echov1.PutRequest{RequestId: "x"})
	require.NoError(t, err)

	byID := map[trace.SpanID]tracetest.SpanStub{}
	var clients []tracetest.SpanStub
	var sent *tracetest.SpanStub
	for _, s := range spans.GetSpans() {
		byID[s.SpanContext.SpanID()] = s
		if s.SpanKind == trace.SpanKindClient {
			clients = append(clients, s)
		}
		if s.Name == "Sent.echo.v1.EchoService/Put" {
			s := s
			sent = &s
		}
	}
	require.NotNil(t, sent)
	assert.Equal(t, trace.SpanKindInternal, sent.SpanKind)
	require.Len(t, clients, 2, "one CLIENT span per attempt")
	for _, c := range clients {
		assert.Equal(t, "echo.v1.EchoService/Put", c.Name)
		parent := byID[c.Parent.SpanID()]
		assert.Equal(t, "Attempt.echo.v1.EchoService/Put", parent.Name)
		assert.Equal(t, sent.SpanContext.SpanID(), parent.Parent.SpanID())
	}

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	names := map[string][]string{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			names[m.Name] = append(names[m.Name], sm.Scope.Name)
		}
	}
	require.NotEmpty(t, names["rpc.client.call.duration"], "otelgrpc reports per attempt")
	require.NotEmpty(t, names[semconv.MetricCallDuration], "the suite reports per call")
	for name, scopes := range names {
		assert.Len(t, scopes, 1, "%s is reported by %v", name, scopes)
	}
}
