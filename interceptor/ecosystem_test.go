package interceptor_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/semconv"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// Issue 16 item 5: callbacks on retry, refusal (with its reason) and
// breaker state change.
func TestHooks(t *testing.T) {
	var mu sync.Mutex
	var retries []interceptor.RetryEvent
	var refusals []interceptor.RefusalEvent
	var changes []string
	hooks := interceptor.Hooks{
		OnRetry:   func(e interceptor.RetryEvent) { mu.Lock(); retries = append(retries, e); mu.Unlock() },
		OnRefusal: func(e interceptor.RefusalEvent) { mu.Lock(); refusals = append(refusals, e); mu.Unlock() },
		OnBreakerChange: func(e interceptor.BreakerEvent) {
			mu.Lock()
			changes = append(changes, e.From.String()+"→"+e.To.String())
			mu.Unlock()
		},
	}
	e := newEnv(t, origin.Always(codes.Unavailable), interceptor.WithHooks(hooks), interceptor.WithBudget(nil),
		interceptor.WithBreaker(&breaker.Config{MinAttempts: 3}))
	_, err := e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: "h"})
	assert.Equal(t, codes.Unavailable, status.Code(err))
	_, err = e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: "i"})
	assert.Equal(t, codes.Unavailable, status.Code(err))
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, retries, 2, "the first call retried twice")
	assert.Equal(t, put, retries[0].Method)
	assert.Equal(t, 2, retries[0].Attempt)
	assert.Equal(t, 3, retries[1].Attempt)
	assert.Equal(t, codes.Unavailable, status.Code(retries[0].Err))
	require.Len(t, refusals, 2)
	assert.Equal(t, interceptor.ReasonMaxAttempts, refusals[0].Reason)
	assert.Equal(t, interceptor.ReasonBreaker, refusals[1].Reason, "the second call was refused by the open breaker")
	assert.Equal(t, semconv.EventBreakerRejected, refusals[1].Event)
	assert.Equal(t, []string{"closed→open"}, changes)
}

// Issue 16 item 5: a retry predicate narrows what retries and can never
// widen it to a method that may not be repeated (it is not even asked).
func TestRetryIfNarrowsNeverWidens(t *testing.T) {
	var asked []string
	var mu sync.Mutex
	retryIf := func(_ context.Context, method string, err error) bool {
		mu.Lock()
		asked = append(asked, method)
		mu.Unlock()
		return !strings.Contains(status.Convert(err).Message(), "permanent")
	}
	e := newEnv(t, func(c origin.Call) origin.Reply {
		if c.RequestID == "p" {
			return origin.Reply{Code: codes.Unavailable, Message: "permanent outage"}
		}
		return origin.Reply{Code: codes.Unavailable, Message: "blip"}
	}, interceptor.WithRetryPolicy(interceptor.RetryPolicy{If: retryIf}), interceptor.WithBudget(nil), interceptor.WithBreaker(nil))
	_, err := e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: "p"})
	assert.Equal(t, interceptor.ReasonRetryIf, refusedReason(t, e, err))
	assert.Equal(t, 1, e.origin.CountID(put, "p"), "the predicate refused the retry")
	_, _ = e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: "b"})
	assert.Equal(t, 3, e.origin.CountID(put, "b"), "the predicate allowed it")
	_, _ = e.echo.Notify(t.Context(), &echov1.NotifyRequest{RequestId: "n"})
	assert.Equal(t, 1, e.origin.CountID(notify, "n"))
	_, _ = e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: "c"}, interceptor.MaxAttempts(1))
	mu.Lock()
	defer mu.Unlock()
	for _, m := range asked {
		assert.Equal(t, put, m, "never asked about a method that may not be repeated")
	}
	assert.Len(t, asked, 3, "asked once for p, twice for b")
}

// refusedReason returns the reason the last call span recorded for a
// refusal (retry_if does not annotate the status).
func refusedReason(t *testing.T, e *env, err error) interceptor.Reason {
	t.Helper()
	assert.Equal(t, codes.Unavailable, status.Code(err))
	spans := e.spans.GetSpans()
	for i := len(spans) - 1; i >= 0; i-- {
		for _, ev := range spans[i].Events {
			if ev.Name == semconv.EventRetryRefused {
				for _, a := range ev.Attributes {
					if a.Key == semconv.AttrReason {
						return interceptor.Reason(a.Value.AsString())
					}
				}
			}
		}
	}
	return ""
}

// Issue 16 item 7: in shadow mode the budget and the breaker decide and
// record what they would refuse, without refusing. The budget (no burst)
// would refuse every retry; the first attempts of a, b and c, the ones it
// would have sent, fail, so the breaker (3 attempts) opens and would
// refuse d's.
func TestShadowModeRecordsWithoutRefusing(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	e := newEnv(t, origin.Always(codes.Unavailable), interceptor.WithShadowMode(), interceptor.WithTelemetry(interceptor.Telemetry{MeterProvider: mp}),
		interceptor.WithBudget(budget.NewRegistry(budgetNoBurst())), interceptor.WithBreaker(&breaker.Config{MinAttempts: 3}))
	for _, id := range []string{"a", "b", "c", "d"} {
		_, err := e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: id})
		assert.Equal(t, codes.Unavailable, status.Code(err))
		assert.Equal(t, 3, e.origin.CountID(put, id), "nothing refused: every attempt was sent")
	}
	would := map[string]int64{}
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == semconv.MetricWouldRefuse {
				for _, p := range m.Data.(metricdata.Sum[int64]).DataPoints {
					r, _ := p.Attributes.Value(semconv.AttrReason)
					would[r.AsString()] += p.Value
				}
			}
			if m.Name == semconv.MetricRefusals {
				for _, p := range m.Data.(metricdata.Sum[int64]).DataPoints {
					r, _ := p.Attributes.Value(semconv.AttrReason)
					assert.Equal(t, string(interceptor.ReasonMaxAttempts), r.AsString(), "only the attempt limit refused")
				}
			}
		}
	}
	assert.Positive(t, would[string(interceptor.ReasonBudget)], "the budget would have refused retries")
	assert.Positive(t, would[string(interceptor.ReasonBreaker)], "the breaker opened and would have refused")
}

// Shadow mode records one would-be refusal for each attempt the same
// Client would not have sent: against a dead target, what it sends less
// what the defaults send. (The first call's three attempts are the
// evidence that the target serves nothing; the breaker opens after 20
// failed attempts, and from then on the defaults refuse first attempts at
// their pick.)
func TestShadowModeCountsWhatTheDefaultsWouldNotSend(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	real := newEnv(t, origin.Always(codes.Unavailable))
	shadow := newEnv(t, origin.Always(codes.Unavailable), interceptor.WithShadowMode(), interceptor.WithTelemetry(interceptor.Telemetry{MeterProvider: mp}))
	for i := range 30 {
		_, err := real.echo.Put(t.Context(), &echov1.PutRequest{RequestId: fmt.Sprint(i)})
		require.Equal(t, codes.Unavailable, status.Code(err))
		_, err = shadow.echo.Put(t.Context(), &echov1.PutRequest{RequestId: fmt.Sprint(i)})
		require.Equal(t, codes.Unavailable, status.Code(err))
	}
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	would := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == semconv.MetricWouldRefuse {
				for _, p := range m.Data.(metricdata.Sum[int64]).DataPoints {
					r, _ := p.Attributes.Value(semconv.AttrReason)
					would[r.AsString()] += p.Value
				}
			}
		}
	}
	assert.Equal(t, 90, shadow.origin.Total(), "shadow mode refuses nothing")
	assert.Less(t, real.origin.Total(), 30, "the defaults stop retrying, then sending")
	assert.Equal(t, map[string]int64{string(interceptor.ReasonBreaker): int64(90 - real.origin.Total())}, would)
}

// Issue 16 item 6: the Client lists its targets with budget balance and
// breaker state, and serves them as JSON.
func TestTargetsAndStateHandler(t *testing.T) {
	e := newEnv(t, origin.Succeed())
	_, err := e.echo.Put(t.Context(), &echov1.PutRequest{})
	require.NoError(t, err)
	ts := e.guard.Targets()
	require.Len(t, ts, 1)
	assert.Equal(t, e.server.Listener.Target, ts[0].Target)
	require.NotNil(t, ts[0].Budget)
	assert.Equal(t, uint64(1), ts[0].Budget.Requests)
	require.Len(t, ts[0].Breakers, 1, "one breaker per method called")
	assert.Equal(t, put, ts[0].Breakers[0].Method)
	assert.Equal(t, "closed", ts[0].Breakers[0].State)
	require.Len(t, ts[0].Endpoints, 1)
	assert.Equal(t, int64(1), ts[0].Endpoints[0].OK)

	rec := httptest.NewRecorder()
	e.guard.StateHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/debug/stormguard", nil))
	assert.Equal(t, http.StatusOK, rec.Code)
	assert.Equal(t, "application/json", rec.Header().Get("Content-Type"))
	var body struct {
		Targets []interceptor.TargetState `json:"targets"`
	}
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body))
	assert.Equal(t, ts[0].Target, body.Targets[0].Target)
	rec = httptest.NewRecorder()
	e.guard.StateHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/debug/stormguard", nil))
	assert.Equal(t, http.StatusMethodNotAllowed, rec.Code)
}

const retryPolicy = `{"methodConfig":[{"name":[{"service":"echo.v1.EchoService"}],
  "retryPolicy":{"maxAttempts":3,"initialBackoff":"0.001s","maxBackoff":"0.002s","backoffMultiplier":2,"retryableStatusCodes":["UNAVAILABLE"]}}]}`

// Issue 16 item 1: forgetting grpc.WithDisableRetry with a service config
// retryPolicy made a dead origin see 6 attempts for one call (9 without
// the budget). The suite notices the policy, sends one attempt of its own
// (grpc-go retries it), and says so once in the log and on every call
// span. DialOptions disables grpc-go's retries, and the suite retries.
func TestGRPCRetryPolicyIsNotMultiplied(t *testing.T) {
	var logs bytes.Buffer
	o := origin.New(origin.Always(codes.Unavailable))
	l := origin.Bufconn()
	srv := origin.Serve(l, o)
	defer srv.Stop()
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	guard := interceptor.NewClient(fast, interceptor.WithBudget(nil), interceptor.WithBreaker(nil), interceptor.WithTelemetry(interceptor.Telemetry{TracerProvider: tp}),
		interceptor.WithTelemetry(interceptor.Telemetry{Logger: slog.New(slog.NewTextHandler(&logs, nil))}))
	// grpc-go's retries left on: ConnectOptions does not disable them.
	cc, err := grpc.NewClient(l.Target, l.ConnectOptions(grpc.WithDefaultServiceConfig(retryPolicy), grpc.WithChainUnaryInterceptor(guard.Unary()))...)
	require.NoError(t, err)
	defer cc.Close()
	for _, id := range []string{"a", "b"} {
		_, err = echov1.NewEchoServiceClient(cc).Put(t.Context(), &echov1.PutRequest{RequestId: id})
		assert.Equal(t, codes.Unavailable, status.Code(err))
		assert.Equal(t, 3, o.CountID(put, id), "grpc-go's 3 attempts, not 3×3")
	}
	assert.Equal(t, 1, strings.Count(logs.String(), "retryPolicy"), "reported once: %s", logs.String())
	last := spans.GetSpans()[len(spans.GetSpans())-1]
	assert.Contains(t, last.Attributes, semconv.AttrGRPCRetryPolicy.Bool(true))

	// Through DialOptions, grpc-go does not retry, and the suite does.
	guard = interceptor.NewClient(fast, interceptor.WithBudget(nil), interceptor.WithBreaker(nil), interceptor.WithTelemetry(interceptor.Telemetry{TracerProvider: tp}))
	cc2, err := grpc.NewClient(l.Target, l.ConnectOptions(append([]grpc.DialOption{grpc.WithDefaultServiceConfig(retryPolicy)}, guard.DialOptions()...)...)...)
	require.NoError(t, err)
	defer cc2.Close()
	_, err = echov1.NewEchoServiceClient(cc2).Put(t.Context(), &echov1.PutRequest{RequestId: "c"})
	assert.Equal(t, codes.Unavailable, status.Code(err))
	assert.Equal(t, 3, o.CountID(put, "c"), "the suite's 3 attempts")
}

// Issue 16 item 2: beside otelgrpc's stats handler, on one MeterProvider,
// no metric name is reported by both, and with WithInstrumentedAttempts a
// call has exactly one CLIENT span per attempt: otelgrpc's, each below the
// suite's Attempt span, all below one INTERNAL Sent span.
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
