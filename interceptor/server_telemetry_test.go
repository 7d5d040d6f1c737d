package interceptor_test

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/deadline"
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/dedupe"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
	"github.com/stormguard/stormguard/overload"
	"github.com/stormguard/stormguard/semconv"
)

// The tests of the Server's refusal metric, stormguard.server.refusals:
// one refusal of each reason, over real gRPC (bufconn), read back with
// the OpenTelemetry SDK's ManualReader.

// refusalServer is an origin behind interceptor.NewServer(opts...) with
// WithServerTelemetry, over bufconn.
type refusalServer struct {
	echo   echov1.EchoServiceClient
	reader *sdkmetric.ManualReader
	spans  *tracetest.InMemoryExporter
}

func serveRefusals(t *testing.T, o *origin.Origin, opts ...interceptor.ServerOption) *refusalServer {
	t.Helper()
	rs := &refusalServer{reader: sdkmetric.NewManualReader(), spans: tracetest.NewInMemoryExporter()}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(rs.reader))
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(rs.spans))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()); _ = tp.Shutdown(context.Background()) })
	s := interceptor.NewServer(append([]interceptor.ServerOption{interceptor.WithServerTelemetry(interceptor.Telemetry{MeterProvider: mp})}, opts...)...)
	// A server span in the handler's context, as otelgrpc's stats handler
	// would start, for the refusal events.
	withSpan := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		ctx, span := tp.Tracer("test").Start(ctx, info.FullMethod)
		defer span.End()
		return handler(ctx, req)
	}
	l := origin.Bufconn()
	srv := origin.Serve(l, o, grpc.ChainUnaryInterceptor(withSpan, s.Unary()), grpc.ChainStreamInterceptor(s.Stream()))
	cc, err := l.Dial()
	require.NoError(t, err)
	t.Cleanup(func() { cc.Close(); srv.Stop() })
	rs.echo = echov1.NewEchoServiceClient(cc)
	return rs
}

// refusals returns the stormguard.server.refusals data points, by method
// and reason ("echo.v1.EchoService/Put shed"), after checking that each
// carries rpc.system.name=grpc.
func (rs *refusalServer) refusals(t *testing.T) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, rs.reader.Collect(context.Background(), &rm))
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != semconv.MetricServerRefusals {
				continue
			}
			assert.Equal(t, semconv.ScopeName, sm.Scope.Name)
			assert.Equal(t, "{refusal}", m.Unit)
			sum, ok := m.Data.(metricdata.Sum[int64])
			require.True(t, ok, "%T", m.Data)
			assert.True(t, sum.IsMonotonic)
			for _, dp := range sum.DataPoints {
				sys, _ := dp.Attributes.Value("rpc.system.name")
				assert.Equal(t, "grpc", sys.AsString())
				assert.Equal(t, 3, dp.Attributes.Len(), "rpc.system.name, rpc.method, stormguard.reason")
				method, _ := dp.Attributes.Value("rpc.method")
				reason, _ := dp.Attributes.Value(semconv.AttrReason)
				out[method.AsString()+" "+reason.AsString()] += dp.Value
			}
		}
	}
	return out
}

// events returns the reasons of the refusal events on the server spans.
func (rs *refusalServer) events() []string {
	var out []string
	for _, s := range rs.spans.GetSpans() {
		for _, e := range s.Events {
			if e.Name == semconv.EventServerRefused {
				for _, kv := range e.Attributes {
					if kv.Key == semconv.AttrReason {
						out = append(out, kv.Value.AsString())
					}
				}
			}
		}
	}
	return out
}

// holdOne starts a call that blocks in the handler until release is
// closed, and returns once it has arrived; wait waits for it to end.
func holdOne(t *testing.T, arrived <-chan struct{}, call func() error) (wait func()) {
	t.Helper()
	var wg sync.WaitGroup
	wg.Go(func() { assert.NoError(t, call()) })
	<-arrived
	return wg.Wait
}

// TestServerRefusalsAreCountedByReason: a call shed at a concurrency
// limit of one counts shed; calls with less time left than the server's
// minimum, unary and stream, count doomed; a call with less time left
// than the method needs now (overload admission) counts doomed; a keyed
// write the idempotency store has no room for counts dedupe_busy; retries
// over the method's server retry budget count retry_budget. Calls that
// are served count nothing.
func TestServerRefusalsAreCountedByReason(t *testing.T) {
	const put, list, charge = "echo.v1.EchoService/Put", "echo.v1.EchoService/List", "echo.v1.EchoService/Charge"
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute) // a regression fails, not hangs
	defer cancel()

	t.Run("shed", func(t *testing.T) {
		release, arrived := make(chan struct{}), make(chan struct{}, 1)
		o := origin.New(func(c origin.Call) origin.Reply {
			if c.RequestID == "held" {
				arrived <- struct{}{}
				<-release
			}
			return origin.Reply{}
		})
		rs := serveRefusals(t, o, interceptor.WithOverload(overload.New(overload.Config{NoAdmission: true, NoAdaptive: true, MaxConcurrency: 1})))
		wait := holdOne(t, arrived, func() error { _, err := rs.echo.Put(ctx, &echov1.PutRequest{RequestId: "held"}); return err })
		_, err := rs.echo.Put(ctx, &echov1.PutRequest{RequestId: "shed"})
		require.Equal(t, semconv.ErrorReasonOverloaded, errorInfo(err).GetReason(), "%v", err)
		close(release)
		wait()
		_, err = rs.echo.Put(ctx, &echov1.PutRequest{RequestId: "served"})
		require.NoError(t, err)
		assert.Equal(t, map[string]int64{put + " shed": 1}, rs.refusals(t))
		assert.Equal(t, []string{"shed"}, rs.events(), "an event on the server span")
	})

	t.Run("doomed: less than the server's minimum left", func(t *testing.T) {
		rs := serveRefusals(t, origin.New(nil), interceptor.WithServerDeadline(deadline.ServerConfig{MinRemaining: 30 * time.Second}))
		short, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err := rs.echo.Put(short, &echov1.PutRequest{RequestId: "u"})
		require.Equal(t, codes.DeadlineExceeded, status.Code(err))
		stream, err := rs.echo.List(short, &echov1.ListRequest{RequestId: "s", Count: 1})
		require.NoError(t, err)
		_, err = stream.Recv()
		require.Equal(t, codes.DeadlineExceeded, status.Code(err))
		_, err = rs.echo.Put(ctx, &echov1.PutRequest{RequestId: "served"})
		require.NoError(t, err, "about a minute left")
		assert.Equal(t, map[string]int64{put + " doomed": 1, list + " doomed": 1}, rs.refusals(t))
	})

	t.Run("doomed: less than the method needs now", func(t *testing.T) {
		// In a synctest bubble, whose clock the Guard reads and which
		// stands still while the call is made: after a standing queue
		// (trainedGuard) a call needs about 5 s, and with 2 s left it
		// cannot make it.
		synctest.Test(t, func(t *testing.T) {
			now := time.Now()
			g := trainedGuard(t, now)
			rs := serveRefusals(t, origin.New(nil), interceptor.WithOverload(g))
			short, cancel := context.WithDeadline(t.Context(), now.Add(2*time.Second))
			defer cancel()
			_, err := rs.echo.Put(short, &echov1.PutRequest{RequestId: "short"})
			require.Equal(t, semconv.ErrorReasonDeadlineTooShort, errorInfo(err).GetReason(), "%v", err)
			assert.Equal(t, map[string]int64{put + " doomed": 1}, rs.refusals(t))
		})
	})

	t.Run("dedupe_busy", func(t *testing.T) {
		release, arrived := make(chan struct{}), make(chan struct{}, 1)
		o := origin.New(func(c origin.Call) origin.Reply {
			if c.RequestID == "held" {
				arrived <- struct{}{}
				<-release
			}
			return origin.Reply{}
		})
		store := dedupe.NewMemoryStore(dedupe.MemoryConfig{MaxEntries: 1})
		rs := serveRefusals(t, o, interceptor.WithDedupe(dedupe.NewServer(dedupe.Config{
			AllowAnonymous: true, Store: store, Methods: []string{echov1.EchoService_List_FullMethodName},
		})))
		keyed := func(key string) context.Context {
			return metadata.AppendToOutgoingContext(ctx, idempotency.MetadataKey, key)
		}
		wait := holdOne(t, arrived, func() error {
			_, err := rs.echo.Charge(keyed("a"), &echov1.ChargeRequest{RequestId: "held"})
			return err
		})
		_, err := rs.echo.Charge(keyed("b"), &echov1.ChargeRequest{RequestId: "busy"})
		require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
		stream, err := rs.echo.List(keyed("c"), &echov1.ListRequest{RequestId: "busy", Count: 1})
		require.NoError(t, err)
		_, err = stream.Recv()
		require.Equal(t, codes.ResourceExhausted, status.Code(err), "a deduplicated stream: %v", err)
		close(release)
		wait()
		_, err = rs.echo.Charge(keyed("a"), &echov1.ChargeRequest{RequestId: "held"})
		require.NoError(t, err, "a replay is no refusal")
		assert.Equal(t, map[string]int64{charge + " dedupe_busy": 1, list + " dedupe_busy": 1}, rs.refusals(t))
		assert.Equal(t, []string{"dedupe_busy"}, rs.events(), "the unary call's server span")
	})

	t.Run("retry_budget", func(t *testing.T) {
		rs := serveRefusals(t, origin.New(origin.Always(codes.Unavailable)),
			interceptor.WithServerBudget(budget.NewRegistry(budget.Config{Burst: -1})))
		for i := range 20 { // the method fails: its first attempts fail
			_, err := rs.echo.Put(ctx, &echov1.PutRequest{RequestId: "first"})
			require.Equal(t, codes.Unavailable, status.Code(err), "first attempt %d", i)
		}
		refused := 0
		for range 10 {
			_, err := rs.echo.Put(retryCtx(ctx, 1), &echov1.PutRequest{RequestId: "retry"})
			if errorInfo(err).GetReason() == semconv.ErrorReasonRetryBudget {
				refused++
			}
		}
		require.Positive(t, refused)
		// The same for a stream method, whose budget is its own.
		listOnce := func(ctx context.Context) error {
			stream, err := rs.echo.List(ctx, &echov1.ListRequest{RequestId: "l", Count: 1})
			require.NoError(t, err)
			_, err = stream.Recv()
			return err
		}
		for range 20 {
			require.Equal(t, codes.Unavailable, status.Code(listOnce(ctx)))
		}
		refusedStreams := 0
		for range 10 {
			if errorInfo(listOnce(retryCtx(ctx, 1))).GetReason() == semconv.ErrorReasonRetryBudget {
				refusedStreams++
			}
		}
		require.Positive(t, refusedStreams)
		assert.Equal(t, map[string]int64{put + " retry_budget": int64(refused), list + " retry_budget": int64(refusedStreams)}, rs.refusals(t))
	})
}

// TestServerTelemetryWithoutAMeterProviderKeepsTheEarlierOne: a later
// WithServerTelemetry whose MeterProvider is nil changes nothing.
func TestServerTelemetryWithoutAMeterProviderKeepsTheEarlierOne(t *testing.T) {
	rs := serveRefusals(t, origin.New(nil), interceptor.WithServerDeadline(deadline.ServerConfig{MinRemaining: time.Minute}),
		interceptor.WithServerTelemetry(interceptor.Telemetry{}))
	short, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	_, err := rs.echo.Put(short, &echov1.PutRequest{RequestId: "u"})
	require.Equal(t, codes.DeadlineExceeded, status.Code(err))
	assert.Equal(t, map[string]int64{"echo.v1.EchoService/Put doomed": 1}, rs.refusals(t))
}
