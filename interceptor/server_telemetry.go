package interceptor

import (
	"context"
	"strings"

	"github.com/stormguard/stormguard/semconv"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	otelconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/stormguard/stormguard/idempotency/dedupe"
	"github.com/stormguard/stormguard/internal/cowmap"
)

// serverReason says why the Server refused a call before its handler ran.
type serverReason uint8

// Server refusal reasons; their names are semconv's ServerReason values.
const (
	serverShed serverReason = iota
	serverDoomed
	serverDedupeBusy
	serverRetryBudget
	numServerReasons
)

var serverReasonNames = [numServerReasons]string{
	semconv.ServerReasonShed, semconv.ServerReasonDoomed, semconv.ServerReasonDedupeBusy, semconv.ServerReasonRetryBudget,
}

// serverTelemetry is the Server's instrument, created once, and the
// options its refusals are recorded with, built on first use per method
// and reason.
type serverTelemetry struct {
	refusals metric.Int64Counter
	methods  cowmap.Map[string, *serverMethodTelemetry]
	other    *serverMethodTelemetry // every method beyond maxRoutes
}

type serverMethodTelemetry struct {
	base []attribute.KeyValue
	opts [numServerReasons]lazy[[]metric.AddOption]
}

func newServerTelemetry(mp metric.MeterProvider) *serverTelemetry {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(semconv.ScopeName, metric.WithSchemaURL(otelconv.SchemaURL))
	t := &serverTelemetry{}
	var err error
	t.refusals, err = m.Int64Counter(semconv.MetricServerRefusals, metric.WithUnit("{refusal}"),
		metric.WithDescription("Calls the server refused before their handler ran, by reason (shed, doomed, dedupe_busy, retry_budget)."))
	handle(err)
	t.methods.Max = maxRoutes
	t.other = newServerMethodTelemetry(otherMethodSemconv)
	return t
}

func newServerMethodTelemetry(method string) *serverMethodTelemetry {
	return &serverMethodTelemetry{base: []attribute.KeyValue{otelconv.RPCSystemNameGRPC, otelconv.RPCMethod(strings.TrimPrefix(method, "/"))}}
}

func (t *serverTelemetry) method(full string) *serverMethodTelemetry {
	if mt, ok := t.methods.Load(full); ok {
		return mt
	}
	if t.methods.Len() >= maxRoutes {
		return t.other
	}
	return t.methods.LoadOrCreate(full, newServerMethodTelemetry)
}

// refused records that the call of method arriving with ctx was refused
// for r before its handler ran: the metric, and an event on the call's
// span when one records (another instrumentation's server span).
func (s *Server) refused(ctx context.Context, method string, r serverReason) {
	mt := s.tel.method(method)
	opts := mt.opts[r].get(func() []metric.AddOption {
		return addOpts(mt.base, semconv.AttrReason.String(serverReasonNames[r]))
	})
	s.tel.refusals.Add(ctx, 1, *opts...)
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.AddEvent(semconv.EventServerRefused, trace.WithAttributes(semconv.AttrReason.String(serverReasonNames[r])))
	}
}

// admissionReason is why the overload protection refused a call with err:
// doomed when the deadline left is shorter than the method needs, shed
// otherwise.
func admissionReason(err error) serverReason {
	if err == errDeadlineTooShort {
		return serverDoomed
	}
	return serverShed
}

// refusedByDedupe records err, returned by the deduplicating interceptor,
// as a refusal if it is one for want of room in the idempotency store.
func (s *Server) refusedByDedupe(ctx context.Context, method string, err error) {
	if err != nil && dedupe.Busy(err) {
		s.refused(ctx, method, serverDedupeBusy)
	}
}
