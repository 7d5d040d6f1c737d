package interceptor

import (
	"context"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/deadline"
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/internal/clock"
	"github.com/stormguard/stormguard/internal/engine"
	"github.com/stormguard/stormguard/internal/limits"
)

// The defaults of RetryPolicy.
const (
	defaultMaxAttempts = engine.DefaultMaxAttempts
	defaultBackoffBase = engine.DefaultBackoffBase
	defaultBackoffMax  = engine.DefaultBackoffMax
	defaultReplayLimit = 256 << 10
)

// MaxBackoff is the longest backoff before a retry, whatever sets it
// (RetryPolicy, or a service config's retryPolicy: its initialBackoff and
// maxBackoff are lowered to it), as MaxPushback is the longest delay taken
// from a server: a call without a deadline never waits more than a minute
// for its next attempt on a configuration's word.
const MaxBackoff = time.Minute

// A ClientOption configures a Client. Options are sealed: create them with
// the With... functions of this package.
type ClientOption interface{ applyClient(*clientOptions) }

type clientOptionFunc func(*clientOptions)

func (f clientOptionFunc) applyClient(o *clientOptions) { f(o) }

type clientOptions struct {
	maxAttempts    int
	budgets        *budget.Registry
	budgetSet      bool // WithBudget was given (budgets nil: off)
	breaker        *breaker.Config
	breakerSet     bool // WithBreaker was given (breaker nil: off)
	backoffBase    time.Duration
	backoffMax     time.Duration
	retryable      idempotency.CodeSet
	idempotent     []string
	hedging        bool
	hedgeDelay     time.Duration
	hedgeAttempts  int
	noKeys         bool
	deadlineCfg    deadline.ClientConfig
	replayLimit    int
	perAttempt     time.Duration
	failures       idempotency.CodeSet
	tracerProvider trace.TracerProvider
	meterProvider  metric.MeterProvider
	propagators    propagation.TextMapPropagator
	now            func() time.Time // nil: the monotonic clock (internal/clock.ClientOption sets it)
	newTimer       func(time.Duration) clock.Timer
	instrumented   bool
	shadow         bool
	hooks          Hooks
	retryIf        func(ctx context.Context, method string, err error) bool
	logger         *slog.Logger
	noFailover     bool
	noMarker       bool
	targetName     func(target string) string
	serviceConfig  string // WithDefaultServiceConfig's JSON ("": none)
}

// RetryPolicy says how the Client retries the methods that may be
// repeated. The zero value is the default; each zero field keeps its
// default, or what an earlier WithRetryPolicy set: policies accumulate. A
// method's own proto options (max_attempts, retryable_codes,
// per_attempt_timeout) take precedence over these.
type RetryPolicy struct {
	// MaxAttempts is the most attempts of one logical call, the first
	// included: 3 by default, at most 10 (negative values mean 1). Methods
	// that may not be repeated get one attempt whatever this says.
	MaxAttempts int
	// BackoffBase and BackoffMax bound the backoff between attempts: the
	// n-th retry waits a random time in [d/2, d] with d = min(BackoffMax,
	// BackoffBase·2ⁿ⁻¹): 50 ms and 1 s by default. A BackoffMax below
	// BackoffBase is raised to it, and both are lowered to MaxBackoff (one
	// minute). A server's grpc-retry-pushback-ms, or
	// the retry_delay of a google.rpc.RetryInfo in its status, replaces the
	// backoff (the longer of the two when both come); a delay beyond
	// MaxPushback, or one that does not fit in the call's deadline, means
	// no retry.
	BackoffBase, BackoffMax time.Duration
	// RetryableCodes are the status codes after which an attempt may be
	// retried: Unavailable only by default; an empty, non-nil slice means
	// none. OK is ignored.
	RetryableCodes []codes.Code
	// FailureCodes are the attempt outcomes the breakers and the endpoint
	// table count as failures: Unavailable, DeadlineExceeded,
	// ResourceExhausted and Internal by default; an empty, non-nil slice
	// means none. Cancellation by the caller is never a failure.
	FailureCodes []codes.Code
	// PerAttemptTimeout is how long a unary attempt may go unanswered
	// before a retry is sent (default: never; attempts may use all the
	// time the call has left). The retry is sent beside the slow attempt,
	// which is not cancelled: the first answer wins and the other attempt
	// is cancelled then (Envoy's hedge_on_per_try_timeout). It is sent
	// only if one may be (the method may be repeated, attempts are left,
	// the breaker, the budget and If allow it, and the target is not
	// overloaded: see ReasonOverload); if not, the slow attempt runs on,
	// and the span records semconv.EventTimeoutKept. A reply that
	// is not a proto message (a custom codec) cannot have two attempts in
	// flight: its attempt is cancelled at the timeout, only if a retry may
	// follow, and that retry is sent after the backoff. Streams ignore it.
	PerAttemptTimeout time.Duration
	// ReplayLimit bounds, per stream, the client messages kept to replay on
	// a retry: 256 KiB by default; negative means none. A stream that sends
	// more commits: it is not retried after that.
	ReplayLimit int
	// If, when not nil, narrows what is retried: after a failed attempt
	// that the suite would retry, If is asked, and a false refuses the
	// retry (reason retry_if). It is never asked about a method that may
	// not be repeated, nor about a code that is not retryable: it can
	// narrow, never widen. It is called on the call's goroutine and must be
	// safe for concurrent use.
	If func(ctx context.Context, fullMethod string, err error) bool
}

// WithRetryPolicy sets how the Client retries (see RetryPolicy): its
// non-zero fields replace the defaults, or what an earlier WithRetryPolicy
// set.
func WithRetryPolicy(p RetryPolicy) ClientOption {
	return clientOptionFunc(func(o *clientOptions) {
		if p.MaxAttempts != 0 {
			o.maxAttempts = clampAttempts(p.MaxAttempts)
		}
		if p.BackoffBase > 0 {
			o.backoffBase = p.BackoffBase
		}
		if p.BackoffMax > 0 {
			o.backoffMax = p.BackoffMax
		}
		if p.RetryableCodes != nil {
			o.retryable = codeSet(p.RetryableCodes)
		}
		if p.FailureCodes != nil {
			o.failures = codeSet(p.FailureCodes)
		}
		if p.PerAttemptTimeout > 0 {
			o.perAttempt = p.PerAttemptTimeout
		}
		switch {
		case p.ReplayLimit > 0:
			o.replayLimit = p.ReplayLimit
		case p.ReplayLimit < 0:
			o.replayLimit = 0
		}
		if p.If != nil {
			o.retryIf = p.If
		}
	})
}

// codeSet is cs as a set, noCodes for an empty one.
func codeSet(cs []codes.Code) idempotency.CodeSet {
	if set := idempotency.Codes(cs...); set != 0 {
		return set
	}
	return noCodes
}

// noCodes marks an explicitly empty code set (the zero CodeSet means
// "default").
const noCodes idempotency.CodeSet = 1 // bit 0 is OK, never a member

// WithBudget sets the retry budgets: one per target, from r
// (r.For(target)), so that several Clients, or code outside this package,
// can share them. The default is budget.NewRegistry(budget.Config{}): 10%
// of the calls, lent ahead up to 5 at a time. nil turns the budget off:
// retries and hedges are then bounded only by the attempt limit, the
// breaker and the deadline, which is rarely right in production, and
// hedges and per-attempt-timeout retries no longer yield to a target
// that is overloaded (see ReasonOverload). The
// budgets are asked with the Client's own times (budget.Budget.WithdrawAt).
func WithBudget(r *budget.Registry) ClientOption {
	return clientOptionFunc(func(o *clientOptions) { o.budgets, o.budgetSet = r, true })
}

// WithBreaker configures the circuit breakers (see the breaker package).
// They are per target and method, so that a method that serves is never
// refused because another method of the same target fails; the Client
// keeps up to 10,000 of them, each named by its target and method
// ("dns:///host:443/pkg.Svc/Method", the target its Config.OnStateChange
// receives). The default is &breaker.Config{}. Their Config.OnStateChange,
// if any, is kept, and Hooks.OnBreakerChange is called too; like a hook's,
// a panic in it is recovered and logged (see Hooks). nil turns the
// breakers off.
func WithBreaker(c *breaker.Config) ClientOption {
	return clientOptionFunc(func(o *clientOptions) { o.breaker, o.breakerSet = c, true })
}

// WithIdempotent marks methods IDEMPOTENT, for protos you cannot annotate:
// each entry is a full method ("/pkg.Svc/Method", the RPC's name as in
// the proto, case included) or a whole service ("/pkg.Svc/"). It never
// lowers what the proto says. Calls accumulate.
//
// A whole service marks every method of it, writes included: a service
// with any method that is not safe to repeat (etcd's KV has Put, Txn and
// DeleteRange beside Range) must be marked method by method. NewClient
// checks the entries against the protobuf registry (see
// idempotency.CheckMarks): it logs a warning for a method the registry
// does not know in a service it knows, naming the closest method, since
// such an entry marks nothing; and logs, at Info, the methods a
// whole-service entry marks.
func WithIdempotent(fullMethods ...string) ClientOption {
	return clientOptionFunc(func(o *clientOptions) { o.idempotent = append(o.idempotent, fullMethods...) })
}

// WithHedging hedges every method that may be hedged (NO_SIDE_EFFECTS or
// IDEMPOTENT, or retry_with_key with a key) and has no hedging policy of its
// own: when no answer has come delay after the last attempt was sent, another
// attempt is sent, budget and breaker permitting, up to maxAttempts in all
// (0: RetryPolicy.MaxAttempts). Hedges yield to a target that is
// overloaded (ReasonOverload): while its answers lately said so, or most
// recent calls ran past the delay, none is sent. Delay 0 is adaptive:
// about the (1 − 0.75 × budget ratio) quantile of the method's observed
// latency, so that hedges use at most about three quarters of the retry
// budget, and at least three times its median, so that only attempts slow for
// the method are hedged. Off by default.
func WithHedging(delay time.Duration, maxAttempts int) ClientOption {
	return clientOptionFunc(func(o *clientOptions) {
		o.hedging = true
		o.hedgeDelay = max(delay, 0)
		o.hedgeAttempts = maxAttempts
	})
}

// WithoutIdempotencyKeys stops the client from generating idempotency keys
// for retry_with_key methods: such a method is then retried only when the
// caller supplies a key (idempotency.WithKey or idempotency.CallKey), and
// otherwise sent once.
func WithoutIdempotencyKeys() ClientOption {
	return clientOptionFunc(func(o *clientOptions) { o.noKeys = true })
}

// WithDeadline configures deadline propagation (see the deadline package):
// fail-fast minimum, default timeout for calls without a deadline, and the
// margin taken off the deadline sent downstream.
func WithDeadline(c deadline.ClientConfig) ClientOption {
	return clientOptionFunc(func(o *clientOptions) { o.deadlineCfg = c })
}

// Telemetry is where the Client records its spans, metrics and logs (and,
// given to WithServerTelemetry, where the Server records its metric: its
// MeterProvider only). Nil fields keep their defaults, or what an earlier
// WithTelemetry set.
type Telemetry struct {
	// TracerProvider defaults to otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// MeterProvider defaults to otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// Propagators, when set, inject the trace context of each attempt into
	// its outgoing metadata. The default injects nothing, leaving that to
	// otelgrpc or the server's own instrumentation.
	Propagators propagation.TextMapPropagator
	// Logger is for the Client's rare warnings; it defaults to
	// slog.Default().
	Logger *slog.Logger
	// InstrumentedAttempts says that another instrumentation records each
	// attempt as a CLIENT span: otelgrpc's stats handler
	// (otelgrpc.NewClientHandler) or grpc-go's stats/opentelemetry. The
	// suite's call span then becomes an INTERNAL span named
	// "Sent.pkg.Svc/Method" (gRFC A72), so that a call has exactly one
	// CLIENT span per attempt, each below the suite's
	// "Attempt.pkg.Svc/Method" span that says why it was sent.
	InstrumentedAttempts bool
}

// WithTelemetry sets where the Client records its spans, metrics and logs
// (see Telemetry): its non-nil fields replace the defaults, or what an
// earlier WithTelemetry set.
func WithTelemetry(t Telemetry) ClientOption {
	return clientOptionFunc(func(o *clientOptions) {
		if t.TracerProvider != nil {
			o.tracerProvider = t.TracerProvider
		}
		if t.MeterProvider != nil {
			o.meterProvider = t.MeterProvider
		}
		if t.Propagators != nil {
			o.propagators = t.Propagators
		}
		if t.Logger != nil {
			o.logger = t.Logger
		}
		o.instrumented = o.instrumented || t.InstrumentedAttempts
	})
}

// WithShadowMode makes the budget and the breaker decide and record
// without refusing: where they would refuse a retry, a hedge or a call,
// the Client records a stormguard.would_refuse event and a
// stormguard.client.would_refuse metric (by reason) and sends the attempt
// anyway, once per attempt that would not have been sent. Such an
// attempt's outcome is kept from the breaker, the budget and the endpoint
// table, so that their later decisions are those the Client would have
// made without shadow mode. The rules that keep calls safe still apply: a
// method that may not be repeated is sent once, attempts stop at the
// attempt limit, the deadline and a server's pushback. For a safe rollout:
// watch what would be refused before it is.
func WithShadowMode() ClientOption {
	return clientOptionFunc(func(o *clientOptions) { o.shadow = true })
}

// WithHooks sets callbacks for the Client's decisions (see Hooks). Nil
// fields are ignored; a later WithHooks replaces an earlier one.
func WithHooks(h Hooks) ClientOption {
	return clientOptionFunc(func(o *clientOptions) { o.hooks = h })
}

// WithoutFailover turns per-endpoint fail-over off: every retry is paid
// from the budget, and none avoids an endpoint. By default, a retry after
// a failure on an endpoint that fails while the target's other endpoints
// serve goes to another endpoint and is not charged to the budget, unless
// grpc can pick no other endpoint: then it is paid (see the package
// documentation).
func WithoutFailover() ClientOption {
	return clientOptionFunc(func(o *clientOptions) { o.noFailover = true })
}

// WithDefaultServiceConfig gives the ClientConns dialed with DialOptions a
// default service config (JSON, as grpc.WithDefaultServiceConfig takes
// it), used until and unless their resolver gives one. DialOptions passes
// it on to grpc, so that grpc applies it as usual (timeouts, load
// balancing), and the suite carries out its methods' retryPolicy and
// hedgingPolicy and its retryThrottling (see DialOptions). An invalid
// config makes grpc.NewClient fail, as grpc.WithDefaultServiceConfig's
// does. A later WithDefaultServiceConfig replaces an earlier one; ""
// removes it. Interceptors installed by hand do not read it.
func WithDefaultServiceConfig(json string) ClientOption {
	return clientOptionFunc(func(o *clientOptions) { o.serviceConfig = json })
}

// WithTargetName names the dependency behind each ClientConn's target:
// name(target) keys the budget, the breaker and the endpoint table, and is
// the target that metrics (server.address, grpc.target), errors ("circuit
// breaker open for /pkg.Svc/M on etcd"), hooks, logs and Targets show.
// ClientConns whose targets get the same name share one budget and one
// breaker per method.
//
// By default the key is the target in grpc's canonical form (see the
// package documentation). That is wrong for client libraries that dial a
// target of their own per client object: etcd's clientv3 dials
// "etcd-endpoints://0xc000123456/host:port", unique to each
// clientv3.Client, so two clients of one cluster would never share a
// budget or a breaker, and each would add its own series to the metrics.
// Name them:
//
//	interceptor.WithTargetName(func(target string) string {
//		if strings.HasPrefix(target, "etcd-endpoints://") {
//			return "etcd"
//		}
//		return "" // the default
//	})
//
// An empty name keeps the default. name is called once per target and
// method, when the Client first sees them, and must be safe for concurrent
// use. nil is ignored; a later WithTargetName replaces an earlier one.
func WithTargetName(name func(target string) string) ClientOption {
	return clientOptionFunc(func(o *clientOptions) {
		if name != nil {
			o.targetName = name
		}
	})
}

// WithoutRefusalMarker keeps the message of a status whose retry was
// refused as the server sent it. By default it ends with a marker,
// " [stormguard: retry refused: budget #<seal>]" (the seal is this
// process's: see RefusedBy), so that RefusedBy can tell why
// even through a client that keeps only a status's code and message (etcd's
// clientv3 does). A client that maps known messages to errors of its own
// (clientv3's rpctypes, for "etcdserver: no leader") does not recognise a
// marked message and returns the status itself; this option keeps the
// mapping, and RefusedBy then reads only the status details.
func WithoutRefusalMarker() ClientOption {
	return clientOptionFunc(func(o *clientOptions) { o.noMarker = true })
}

func clampAttempts(n int) int { return min(max(n, 1), limits.MaxAttempts) }
