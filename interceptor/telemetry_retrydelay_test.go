package interceptor_test

import (
	"context"
	"io"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
	"github.com/stormguard/stormguard/semconv"
)

// The tests of gRFC A96's grpc.client.call.retry_delay: the time a call
// had no attempt in flight, recorded once per call that retried or hedged.
// They run in a synctest bubble over bufconn, so that time passes only
// where something waits for it (the origin's work, a backoff, a hedging
// delay), and the histogram can be checked to the nanosecond against the
// backoffs the Client reports (Hooks.OnRetry).

// delayEnv is an origin over bufconn, in the caller's bubble, and a Client
// of it whose metrics go to a ManualReader and whose retries are summed.
type delayEnv struct {
	echo   echov1.EchoServiceClient
	target string
	reader *sdkmetric.ManualReader

	mu      sync.Mutex
	backoff time.Duration // the sum of the delays OnRetry reported
	retries int
	slow    time.Duration // how long OnRetry takes
}

func newDelayEnv(t *testing.T, script origin.Script, opts ...interceptor.ClientOption) *delayEnv {
	t.Helper()
	e := &delayEnv{reader: sdkmetric.NewManualReader()}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(e.reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	guard := interceptor.NewClient(append([]interceptor.ClientOption{
		interceptor.WithBudget(nil),
		interceptor.WithRetryPolicy(interceptor.RetryPolicy{BackoffBase: 100 * time.Millisecond, BackoffMax: time.Second}),
		interceptor.WithTelemetry(interceptor.Telemetry{MeterProvider: mp}),
		interceptor.WithHooks(interceptor.Hooks{OnRetry: func(ev interceptor.RetryEvent) {
			e.mu.Lock()
			e.backoff += ev.Delay
			e.retries++
			slow := e.slow
			e.mu.Unlock()
			time.Sleep(slow)
		}}),
	}, opts...)...)
	l := origin.Bufconn()
	srv := origin.Serve(l, origin.New(script))
	cc, err := l.Dial(grpc.WithChainUnaryInterceptor(guard.Unary()), grpc.WithChainStreamInterceptor(guard.Stream()))
	require.NoError(t, err)
	t.Cleanup(func() { cc.Close(); srv.Stop() })
	e.echo, e.target = echov1.NewEchoServiceClient(cc), cc.Target()
	return e
}

func (e *delayEnv) setSlow(d time.Duration) {
	e.mu.Lock()
	e.slow = d
	e.mu.Unlock()
}

func (e *delayEnv) backoffs() (time.Duration, int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.backoff, e.retries
}

// histograms returns the data points of the float64 histogram name, and
// the metric's unit.
func (e *delayEnv) histogram(t *testing.T, name string) ([]metricdata.HistogramDataPoint[float64], string) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, e.reader.Collect(context.Background(), &rm))
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				h, ok := m.Data.(metricdata.Histogram[float64])
				require.True(t, ok, "%s is a %T", name, m.Data)
				return h.DataPoints, m.Unit
			}
		}
	}
	return nil, ""
}

// seconds is d in seconds, as the histograms record it.
func seconds(d time.Duration) float64 { return d.Seconds() }

// TestRetryDelayIsTheTimeWithNoAttemptInFlight: a Put whose first two
// attempts fail after 30 ms of work, and whose third succeeds after 30 ms,
// records one retry delay: the two backoffs and nothing else (not the
// 90 ms of work, which the call duration holds). A Put that succeeds at
// once records none (gRFC A96: per call that retried; gRPC's own
// implementation records none without retries either).
func TestRetryDelayIsTheTimeWithNoAttemptInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newDelayEnv(t, func(c origin.Call) origin.Reply {
			r := origin.Reply{Delay: 30 * time.Millisecond}
			if c.RequestID == "retried" && c.Attempt <= 2 {
				r.Code, r.Message = codes.Unavailable, "not yet"
			}
			return r
		})
		_, err := e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: "retried"})
		require.NoError(t, err)
		_, err = e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: "at-once"})
		require.NoError(t, err)

		backoff, retries := e.backoffs()
		require.Equal(t, 2, retries)
		require.Positive(t, backoff)
		dps, unit := e.histogram(t, semconv.MetricCallRetryDelay)
		require.Len(t, dps, 1, "one attribute set")
		dp := dps[0]
		assert.Equal(t, "s", unit)
		assert.Equal(t, uint64(1), dp.Count, "one record: the call that retried")
		assert.InDelta(t, seconds(backoff), dp.Sum, 1e-9, "the backoffs, and only them")
		assert.Equal(t, attribute.NewSet(
			attribute.String("grpc.method", "echo.v1.EchoService/Put"),
			attribute.String("grpc.target", e.target),
		), dp.Attributes, "gRFC A96's attributes")
		assert.Len(t, dp.Bounds, 41, "gRFC A66's latency buckets")

		durations, _ := e.histogram(t, semconv.MetricCallDuration)
		var total float64
		for _, d := range durations {
			total += d.Sum
		}
		assert.InDelta(t, seconds(backoff+90*time.Millisecond+30*time.Millisecond), total, 1e-9,
			"the call durations hold the retried call's backoffs and 90 ms of work, and the other's 30 ms")
	})
}

// TestRetryDelayOfHedgedCalls: a hedge sent while the first attempt still
// runs leaves no time without an attempt in flight (a retry delay of 0 is
// recorded: the call hedged), even when the hedge fails and is replaced
// after an OnRetry hook that takes 5 ms; a hedged call whose first attempt
// fails before its hedge is due, with no other attempt in flight, retries
// after the backoff, which is its retry delay.
func TestRetryDelayOfHedgedCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newDelayEnv(t, func(c origin.Call) origin.Reply {
			switch {
			case (c.RequestID == "hedged" || c.RequestID == "failed-hedge") && c.Attempt == 1:
				return origin.Reply{Delay: time.Second} // a later attempt wins
			case c.RequestID == "failed-hedge" && c.Attempt == 2:
				return origin.Reply{Delay: 10 * time.Millisecond, Code: codes.Unavailable, Message: "down"}
			case c.RequestID == "failed-first" && c.Attempt == 1:
				return origin.Reply{Delay: 10 * time.Millisecond, Code: codes.Unavailable, Message: "down"}
			}
			return origin.Reply{Delay: 10 * time.Millisecond}
		}, interceptor.WithHedging(50*time.Millisecond, 3))

		_, err := e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: "hedged"})
		require.NoError(t, err)
		dps, _ := e.histogram(t, semconv.MetricCallRetryDelay)
		require.Len(t, dps, 1)
		assert.Equal(t, uint64(1), dps[0].Count, "a call that hedged records its retry delay")
		assert.Zero(t, dps[0].Sum, "an attempt was in flight all along")

		e.setSlow(5 * time.Millisecond)
		_, err = e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: "failed-hedge"})
		require.NoError(t, err)
		e.setSlow(0)
		_, retries := e.backoffs()
		require.Equal(t, 1, retries, "the failed hedge was replaced")
		dps, _ = e.histogram(t, semconv.MetricCallRetryDelay)
		require.Len(t, dps, 1)
		assert.Equal(t, uint64(2), dps[0].Count)
		assert.Zero(t, dps[0].Sum, "the first attempt was in flight while the failed hedge was replaced")

		_, err = e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: "failed-first"})
		require.NoError(t, err)
		backoff, retries := e.backoffs()
		require.Equal(t, 2, retries, "the replaced hedge's delay was 0: another attempt ran")
		dps, _ = e.histogram(t, semconv.MetricCallRetryDelay)
		require.Len(t, dps, 1)
		assert.Equal(t, uint64(3), dps[0].Count)
		assert.InDelta(t, seconds(backoff), dps[0].Sum, 1e-9, "the backoff after the failed first attempt")
	})
}

// TestRetryDelayOfARetriedStream: a server stream whose first attempt
// fails before any response is opened again after the backoff; the
// backoff is its retry delay.
func TestRetryDelayOfARetriedStream(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newDelayEnv(t, func(c origin.Call) origin.Reply {
			if c.Attempt == 1 {
				return origin.Reply{Delay: 20 * time.Millisecond, Code: codes.Unavailable, Message: "down"}
			}
			return origin.Reply{Delay: 20 * time.Millisecond}
		})
		stream, err := e.echo.List(t.Context(), &echov1.ListRequest{RequestId: "s", Count: 2})
		require.NoError(t, err)
		n := 0
		for {
			_, err := stream.Recv()
			if err == io.EOF {
				break
			}
			require.NoError(t, err)
			n++
		}
		require.Equal(t, 2, n)
		backoff, retries := e.backoffs()
		require.Equal(t, 1, retries)
		dps, _ := e.histogram(t, semconv.MetricCallRetryDelay)
		require.Len(t, dps, 1)
		assert.Equal(t, uint64(1), dps[0].Count)
		assert.InDelta(t, seconds(backoff), dps[0].Sum, 1e-9)
		assert.Equal(t, "echo.v1.EchoService/List", func() string { v, _ := dps[0].Attributes.Value("grpc.method"); return v.AsString() }())
	})
}
