package interceptor_test

import (
	"fmt"
	"hash/fnv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// This file holds what the tests of several files share: the demo
// service's method names, an origin served over bufconn behind a Client
// (env), and small helpers. The scripted invoker and streamer are in
// fake_test.go.

// The demo service's methods.
const (
	get      = echov1.EchoService_Get_FullMethodName
	put      = echov1.EchoService_Put_FullMethodName
	charge   = echov1.EchoService_Charge_FullMethodName
	notify   = echov1.EchoService_Notify_FullMethodName
	transfer = echov1.EchoService_Transfer_FullMethodName
	list     = echov1.EchoService_List_FullMethodName
	upload   = echov1.EchoService_Upload_FullMethodName
	chat     = echov1.EchoService_Chat_FullMethodName
)

// env is an origin served over bufconn and a client of it through the
// suite's interceptors.
type env struct {
	origin *origin.Origin
	server *origin.Server
	cc     *grpc.ClientConn
	echo   echov1.EchoServiceClient
	guard  *interceptor.Client
	spans  *tracetest.InMemoryExporter
}

// fast keeps test backoffs short.
var fast = interceptor.WithRetryPolicy(interceptor.RetryPolicy{BackoffBase: time.Millisecond, BackoffMax: 2 * time.Millisecond})

// newEnv serves script over bufconn and returns it with a Client of it
// (fast backoffs, spans recorded in env.spans, then opts). Everything is
// closed by t's cleanup; in a synctest bubble, call it inside the bubble.
func newEnv(t testing.TB, script origin.Script, opts ...interceptor.ClientOption) *env {
	t.Helper()
	e := &env{origin: origin.New(script), spans: tracetest.NewInMemoryExporter()}
	tp := trace.NewTracerProvider(trace.WithSyncer(e.spans))
	t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })
	e.guard = interceptor.NewClient(append([]interceptor.ClientOption{fast, interceptor.WithTelemetry(interceptor.Telemetry{TracerProvider: tp})}, opts...)...)
	l := origin.Bufconn()
	e.server = origin.Serve(l, e.origin)
	cc, err := l.Dial(grpc.WithChainUnaryInterceptor(e.guard.Unary()), grpc.WithChainStreamInterceptor(e.guard.Stream()))
	require.NoError(t, err)
	e.cc = cc
	e.echo = echov1.NewEchoServiceClient(cc)
	t.Cleanup(func() { cc.Close(); e.server.Stop() })
	return e
}

// noopProviders returns the options that record no spans and no metrics.
func noopProviders() []interceptor.ClientOption {
	return []interceptor.ClientOption{
		interceptor.WithTelemetry(interceptor.Telemetry{TracerProvider: noop.NewTracerProvider()}),
		interceptor.WithTelemetry(interceptor.Telemetry{MeterProvider: metricnoop.NewMeterProvider()}),
	}
}

// budgetNoBurst is the default budget without its start-up burst, so that
// a single call cannot retry.
func budgetNoBurst() budget.Config { return budget.Config{Burst: -1} }

// naive turns the budget and the breaker off: every retryable failure is
// retried up to the attempt limit.
var naive = []interceptor.ClientOption{interceptor.WithBudget(nil), interceptor.WithBreaker(nil)}

// concurrently runs n calls of f at once and returns how many succeeded,
// and how many ended with each code.
func concurrently(n int, f func(i int) error) (ok int, codesSeen map[codes.Code]int) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	codesSeen = map[codes.Code]int{}
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			err := f(i)
			mu.Lock()
			defer mu.Unlock()
			codesSeen[status.Code(err)]++
		}()
	}
	close(start)
	wg.Wait()
	return codesSeen[codes.OK], codesSeen
}

// drawFails decides, the same way in every run, whether attempt n of call
// id fails with probability p.
func drawFails(id string, n int, p float64) bool {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s/%d", id, n)
	return float64(h.Sum64()%1_000_000)/1e6 < p
}
