package compare

import (
	"fmt"
	"testing"
	"time"

	failsafebudget "github.com/failsafe-go/failsafe-go/budget"
	"github.com/failsafe-go/failsafe-go/failsafegrpc"
	"github.com/failsafe-go/failsafe-go/retrypolicy"
	grpcretry "github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/retry"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
)

// Every contender is configured the same way: at most 3 attempts (the first
// included), only UNAVAILABLE is retried, and the smallest backoff the
// library accepts, which is 0 or (for stormguard and grpc-go, which refuse
// 0) 1ns. See README.md for what each setting does inside each library.
const (
	attempts = 3
	// backoff is the backoff given to the libraries that refuse 0.
	backoff = time.Nanosecond
)

// contender is one way of making a retrying unary call.
type contender struct {
	name string
	// interceptor returns a new unary client interceptor, or nil when the
	// contender retries inside grpc itself (grpc-go's retryPolicy) or not
	// at all (bare).
	interceptor func() grpc.UnaryClientInterceptor
	// serviceConfig, when set, is the default service config that turns on
	// grpc-go's own retries; every other contender dials with grpc's
	// retries disabled.
	serviceConfig string
}

// dial connects to l the way the contender needs.
func (c contender) dial(l *origin.Listener) (*grpc.ClientConn, error) {
	if c.serviceConfig != "" {
		return grpc.NewClient(l.Target, l.ConnectOptions(grpc.WithDefaultServiceConfig(c.serviceConfig))...)
	}
	var opts []grpc.DialOption
	if c.interceptor != nil {
		opts = append(opts, grpc.WithChainUnaryInterceptor(c.interceptor()))
	}
	return l.Dial(opts...) // grpc.WithDisableRetry
}

func (c contender) mustDial(tb testing.TB, l *origin.Listener) *grpc.ClientConn {
	tb.Helper()
	cc, err := c.dial(l)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = cc.Close() })
	return cc
}

func bare() contender { return contender{name: "bare"} }

// stormguard with its defaults (per-target retry budget of 10% plus a floor
// of 1 retry/s, per-target circuit breaker), telemetry going to no-op
// providers.
func stormguard() contender {
	return contender{name: "stormguard", interceptor: func() grpc.UnaryClientInterceptor {
		return interceptor.NewClient(stormguardOptions()...).Unary()
	}}
}

// stormguardLean is stormguard with the budget and the breaker turned off:
// the configuration that retries exactly like the other libraries (every
// UNAVAILABLE attempt is retried up to 3 attempts).
func stormguardLean() contender {
	return contender{name: "stormguard-nobudget-nobreaker", interceptor: func() grpc.UnaryClientInterceptor {
		return interceptor.NewClient(append(stormguardOptions(), interceptor.WithBudget(nil), interceptor.WithBreaker(nil))...).Unary()
	}}
}

func stormguardOptions() []interceptor.ClientOption {
	return []interceptor.ClientOption{
		interceptor.WithTelemetry(interceptor.Telemetry{TracerProvider: tracenoop.NewTracerProvider()}),
		interceptor.WithTelemetry(interceptor.Telemetry{MeterProvider: metricnoop.NewMeterProvider()}),
		interceptor.WithRetryPolicy(interceptor.RetryPolicy{MaxAttempts: attempts}),
		interceptor.WithRetryPolicy(interceptor.RetryPolicy{RetryableCodes: []codes.Code{codes.Unavailable}}),
		interceptor.WithRetryPolicy(interceptor.RetryPolicy{BackoffBase: backoff, BackoffMax: backoff}),
	}
}

// grpcGo is grpc-go's own retry (gRFC A6) configured by the service config,
// for every method of the service (grpc-go does not know which methods are
// idempotent).
func grpcGo() contender {
	return contender{name: "grpc-go-retrypolicy", serviceConfig: grpcServiceConfig("")}
}

// grpcGoThrottled adds grpc-go's optional retry throttling (gRFC A6
// retryThrottling): a token bucket of 10 tokens, each failure takes 1, each
// success gives back 0.1, and retries stop while it holds half or less.
func grpcGoThrottled() contender {
	return contender{name: "grpc-go-retrypolicy+throttling", serviceConfig: grpcServiceConfig(`"retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1},`)}
}

func grpcServiceConfig(extra string) string {
	// initialBackoff and maxBackoff must be > 0: 1ns is the smallest
	// duration the service config can say.
	return fmt.Sprintf(`{%s
  "methodConfig": [{
    "name": [{"service": "echo.v1.EchoService"}],
    "retryPolicy": {
      "maxAttempts": %d,
      "initialBackoff": "0.000000001s",
      "maxBackoff": "0.000000001s",
      "backoffMultiplier": 2,
      "retryableStatusCodes": ["UNAVAILABLE"]
    }
  }]
}`, extra, attempts)
}

// middleware is go-grpc-middleware v2's interceptors/retry. Its WithMax is
// the number of attempts, the first included (the loop runs attempt <
// max), despite the option's doc calling it retries.
func middleware() contender {
	return contender{name: "go-grpc-middleware", interceptor: func() grpc.UnaryClientInterceptor {
		return grpcretry.UnaryClientInterceptor(
			grpcretry.WithMax(attempts),
			grpcretry.WithCodes(codes.Unavailable),
			grpcretry.WithBackoff(grpcretry.BackoffLinear(0)),
		)
	}}
}

// failsafeGo is failsafe-go's failsafegrpc client interceptor with a retry
// policy (default delay: none).
func failsafeGo() contender {
	return contender{name: "failsafe-go", interceptor: func() grpc.UnaryClientInterceptor {
		return failsafegrpc.NewUnaryClientInterceptor[any](failsafeRetryPolicy().Build())
	}}
}

// failsafeGoBudget adds failsafe-go's optional retry budget with its
// defaults (retries may be at most 20% of the executions in flight, with
// at least 3 concurrent retries always allowed).
func failsafeGoBudget() contender {
	return contender{name: "failsafe-go+budget", interceptor: func() grpc.UnaryClientInterceptor {
		return failsafegrpc.NewUnaryClientInterceptor[any](failsafeRetryPolicy().WithBudget(failsafebudget.New()).Build())
	}}
}

func failsafeRetryPolicy() retrypolicy.Builder[any] {
	return retrypolicy.NewBuilder[any]().
		HandleIf(func(_ any, err error) bool { return status.Code(err) == codes.Unavailable }).
		WithMaxAttempts(attempts).
		// Return the last attempt's status, as the others do, rather than
		// a retrypolicy.ExceededError.
		ReturnLastFailure()
}

// retrying are the contenders of the comparison, in the order they are
// reported.
func retrying() []contender {
	return []contender{grpcGo(), stormguard(), stormguardLean(), middleware(), failsafeGo()}
}
