package interceptor_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"

	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
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

// budgetNoBurst is the default budget without its start-up burst, so that
// a single call cannot retry.
func budgetNoBurst() budget.Config { return budget.Config{Burst: -1} }
