package interceptor

import (
	"context"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/deadline"
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/dedupe"
	"github.com/stormguard/stormguard/internal/clock"
	"github.com/stormguard/stormguard/internal/limits"
)

// Defaults of the client options.
const (
	// DefaultMaxAttempts is the most attempts of one logical call, the first
	// included.
	DefaultMaxAttempts = 3
	// DefaultBackoffBase and DefaultBackoffMax bound the exponential backoff
	// between attempts: the n-th retry waits a random time in
	// [d/2, d] with d = min(DefaultBackoffMax, DefaultBackoffBase·2ⁿ⁻¹).
	DefaultBackoffBase = 50 * time.Millisecond
	DefaultBackoffMax  = time.Second
	// DefaultReplayLimit bounds the client messages a stream buffers for
	// replay on a retry, like grpc-go's retry buffer.
	DefaultReplayLimit = 256 << 10
)

// A ClientOption configures a Client. Options are sealed: create them with
// the With... functions of this package.
type ClientOption interface{ applyClient(*clientOptions) }

type clientOptionFunc func(*clientOptions)

func (f clientOptionFunc) applyClient(o *clientOptions) { f(o) }

type clientOptions struct {
	maxAttempts    int
	budgetCfg      budget.Config
	budgets        *budget.Registry
	noBudget       bool
	breakerCfg     breaker.Config
	breakers       *breaker.Registry
	noBreaker      bool
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
	now            func() time.Time // nil: time.Now
	newTimer       func(time.Duration) clock.Timer
	instrumented   bool
	shadow         bool
	hooks          Hooks
	retryIf        func(ctx context.Context, method string, err error) bool
	logger         *slog.Logger
	noFailover     bool
	noMarker       bool
	targetName     func(target string) string
}

// WithMaxAttempts sets the most attempts of one logical call, the first
// included (default 3; values below 1 mean 1; capped at 10). A method's
// proto max_attempts takes precedence. Methods that may not be repeated
// get one attempt whatever this says.
func WithMaxAttempts(n int) ClientOption {
	return clientOptionFunc(func(o *clientOptions) { o.maxAttempts = clampAttempts(n) })
}

// WithBudget gives each target a retry budget configured by c (default:
// budget.Config{}: 10% of requests, lent ahead up to 5 at a time). The
// budgets run on the Client's clock (WithClock). Ignored when WithBudgets
// is also given.
func WithBudget(c budget.Config) ClientOption {
	return clientOptionFunc(func(o *clientOptions) { o.budgetCfg = c; o.noBudget = false })
}

// WithBudgets uses r for the per-target budgets, so that several Clients
// (or code outside this package) can share them. A nil r is ignored.
func WithBudgets(r *budget.Registry) ClientOption {
	return clientOptionFunc(func(o *clientOptions) {
		if r != nil {
			o.budgets = r
			o.noBudget = false
		}
	})
}

// WithoutBudget turns the retry budget off: retries and hedges are bounded
// only by the attempt limit, the breaker and the deadline. This is how the
// storm lab reproduces a client without a budget; it is rarely right in
// production.
func WithoutBudget() ClientOption {
	return clientOptionFunc(func(o *clientOptions) { o.noBudget = true; o.budgets = nil })
}

// WithBreaker gives each method of each target a circuit breaker
// configured by c (default: breaker.Config{}). Breakers are per target and
// method, so that a method that serves is never refused because another
// method of the same target fails; each is named BreakerName(target,
// method) (Config.Target). Its OnStateChange, if any, is kept; like a
// hook's, a panic in it is recovered and logged (see Hooks). Ignored when
// WithBreakers is also given.
func WithBreaker(c breaker.Config) ClientOption {
	return clientOptionFunc(func(o *clientOptions) { o.breakerCfg = c; o.noBreaker = false })
}

// WithBreakers uses r for the breakers: the breaker of a method of a
// target is r.For(BreakerName(target, method)), asked for up to MaxRoutes
// of them. A nil r is ignored.
func WithBreakers(r *breaker.Registry) ClientOption {
	return clientOptionFunc(func(o *clientOptions) {
		if r != nil {
			o.breakers = r
			o.noBreaker = false
		}
	})
}

// WithoutBreaker turns the circuit breaker off.
func WithoutBreaker() ClientOption {
	return clientOptionFunc(func(o *clientOptions) { o.noBreaker = true; o.breakers = nil })
}

// WithBackoff sets the exponential backoff between attempts: the n-th retry
// waits a random time in [d/2, d] with d = min(max, base·2ⁿ⁻¹). Defaults:
// 50ms and 1s. Non-positive values keep the defaults; max below base is
// raised to base. A server's grpc-retry-pushback-ms replaces the backoff.
func WithBackoff(base, max time.Duration) ClientOption {
	return clientOptionFunc(func(o *clientOptions) {
		if base > 0 {
			o.backoffBase = base
		}
		if max > 0 {
			o.backoffMax = max
		}
	})
}

// WithRetryableCodes sets the status codes after which an attempt may be
// retried (default: Unavailable only). A method's proto retryable_codes
// take precedence. OK is ignored. With no codes, nothing is retried.
func WithRetryableCodes(cs ...codes.Code) ClientOption {
	return clientOptionFunc(func(o *clientOptions) {
		o.retryable = idempotency.Codes(cs...)
		if o.retryable == 0 {
			o.retryable = noCodes
		}
	})
}

// noCodes marks an explicitly empty code set (the zero CodeSet means
// "default").
const noCodes idempotency.CodeSet = 1 // bit 0 is OK, never a member

// WithFailureCodes sets the attempt outcomes the circuit breaker counts as
// failures (default: Unavailable, DeadlineExceeded, ResourceExhausted and
// Internal). Cancellation by the caller is never a failure.
func WithFailureCodes(cs ...codes.Code) ClientOption {
	return clientOptionFunc(func(o *clientOptions) {
		o.failures = idempotency.Codes(cs...)
		if o.failures == 0 {
			o.failures = noCodes
		}
	})
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
// (0: the client's max attempts). Delay 0 is adaptive: about the (1 − 0.75 ×
// budget ratio) quantile of the method's observed latency, so that hedges
// use about three quarters of the retry budget. Off by default.
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

// WithReplayLimit bounds, per stream, the client messages kept to replay on
// a retry (default 256 KiB). A stream that sends more commits: it is not
// retried after that.
func WithReplayLimit(bytes int) ClientOption {
	return clientOptionFunc(func(o *clientOptions) {
		if bytes >= 0 {
			o.replayLimit = bytes
		}
	})
}

// WithPerAttemptTimeout sets how long a unary attempt may go unanswered
// before a retry is sent (default: never, attempts may use all the time
// the call has left), for methods whose proto sets no per_attempt_timeout
// (the proto's value takes precedence). The retry is sent beside the slow
// attempt, which is not cancelled: the first answer wins and the other
// attempt is cancelled then (Envoy's hedge_on_per_try_timeout). The retry
// is sent only if one may be (the method may be repeated, attempts are
// left, the breaker, the budget and WithRetryIf allow it); if not, the
// slow attempt runs on, and the span records EventTimeoutKept. A
// cancelled attempt's work, done or queued at the server, would be lost,
// and under overload that loss keeps a service down (storm lab scenario
// 10). A reply that is not a proto message (a custom codec) cannot have
// two attempts in flight: its attempt is cancelled at the timeout, only
// if a retry may follow, and that retry is sent after the backoff.
// Streams ignore it. d ≤ 0 keeps the default.
func WithPerAttemptTimeout(d time.Duration) ClientOption {
	return clientOptionFunc(func(o *clientOptions) {
		if d > 0 {
			o.perAttempt = d
		}
	})
}

// WithTracerProvider sets the tracer provider (default:
// otel.GetTracerProvider()). nil is ignored.
func WithTracerProvider(tp trace.TracerProvider) ClientOption {
	return clientOptionFunc(func(o *clientOptions) {
		if tp != nil {
			o.tracerProvider = tp
		}
	})
}

// WithMeterProvider sets the meter provider (default:
// otel.GetMeterProvider()). nil is ignored.
func WithMeterProvider(mp metric.MeterProvider) ClientOption {
	return clientOptionFunc(func(o *clientOptions) {
		if mp != nil {
			o.meterProvider = mp
		}
	})
}

// WithPropagators sets the propagators used to inject the trace context of
// each attempt into its outgoing metadata (default: none, leaving that to
// otelgrpc or the server's own instrumentation). nil is ignored.
func WithPropagators(p propagation.TextMapPropagator) ClientOption {
	return clientOptionFunc(func(o *clientOptions) {
		if p != nil {
			o.propagators = p
		}
	})
}

// WithClock sets the clock used for budgets, breakers (the Client passes
// its times to their At forms, also to WithBreakers' breakers), deadlines
// and latency (default time.Now); for tests, together with WithTimer. A
// deadline.ClientConfig's DefaultTimeout is measured on the real clock, as
// context deadlines are. nil is ignored.
func WithClock(now func() time.Time) ClientOption {
	return clientOptionFunc(func(o *clientOptions) {
		if now != nil {
			o.now = now
		}
	})
}

// Timer is a stoppable one-shot timer, like *time.Timer: C returns the
// channel it sends on when it fires, and Stop reports whether it stopped
// it before it fired.
type Timer interface {
	C() <-chan time.Time
	Stop() bool
}

// WithTimer sets how the Client waits: newTimer(d) must return a Timer
// that fires once d has passed on the WithClock clock. It serves the
// backoff between attempts and the hedging delay (default: real timers).
// For tests, with a fake clock, so that they advance time instead of
// sleeping. nil is ignored.
func WithTimer(newTimer func(d time.Duration) Timer) ClientOption {
	return clientOptionFunc(func(o *clientOptions) {
		if newTimer != nil {
			o.newTimer = func(d time.Duration) clock.Timer { return newTimer(d) }
		}
	})
}

// WithInstrumentedAttempts says that another instrumentation records each
// attempt as a CLIENT span: otelgrpc's stats handler
// (otelgrpc.NewClientHandler) or grpc-go's stats/opentelemetry. The
// suite's call span then becomes an INTERNAL span named
// "Sent.pkg.Svc/Method" (gRFC A72), so that a call has exactly one CLIENT
// span per attempt, each below the suite's "Attempt.pkg.Svc/Method" span
// that says why it was sent. See the README section "With otelgrpc".
func WithInstrumentedAttempts() ClientOption {
	return clientOptionFunc(func(o *clientOptions) { o.instrumented = true })
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

// WithRetryIf narrows what is retried: after a failed attempt that the
// suite would retry, f is asked, and a false refuses the retry (reason
// retry_if). f is never asked about a method that may not be repeated, nor
// about a code that is not retryable: it can narrow, never widen. It is
// called on the call's goroutine and must be safe for concurrent use. nil
// is ignored.
func WithRetryIf(f func(ctx context.Context, fullMethod string, err error) bool) ClientOption {
	return clientOptionFunc(func(o *clientOptions) {
		if f != nil {
			o.retryIf = f
		}
	})
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

// WithTargetName names the dependency behind each ClientConn's target:
// name(target) keys the budget, the breaker and the endpoint table, and is
// the target that metrics (server.address, grpc.target), errors ("circuit
// breaker open for etcd"), hooks, logs and Targets show. ClientConns whose
// targets get the same name share one budget and one breaker.
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
// " [stormguard: retry refused: budget]", so that RefusedBy can tell why
// even through a client that keeps only a status's code and message (etcd's
// clientv3 does). A client that maps known messages to errors of its own
// (clientv3's rpctypes, for "etcdserver: no leader") does not recognise a
// marked message and returns the status itself; this option keeps the
// mapping, and RefusedBy then reads only the status details.
func WithoutRefusalMarker() ClientOption {
	return clientOptionFunc(func(o *clientOptions) { o.noMarker = true })
}

// WithLogger sets the logger of the Client's rare warnings (default
// slog.Default()). nil is ignored.
func WithLogger(l *slog.Logger) ClientOption {
	return clientOptionFunc(func(o *clientOptions) {
		if l != nil {
			o.logger = l
		}
	})
}

func clampAttempts(n int) int { return min(max(n, 1), limits.MaxAttempts) }

// Per-call options.

// MaxAttempts limits the attempts of one call, the first included
// (1 disables retries and hedging for the call). It can raise the client's
// limit up to 10, but never makes a method that may not be repeated retry.
func MaxAttempts(n int) grpc.CallOption { return maxAttemptsOption{n: clampAttempts(n)} }

// NoHedging turns hedging off for one call; failed attempts may still be
// retried.
func NoHedging() grpc.CallOption { return noHedgingOption{} }

type maxAttemptsOption struct {
	grpc.EmptyCallOption
	n int
}

type noHedgingOption struct{ grpc.EmptyCallOption }

// A ServerOption configures a Server.
type ServerOption interface{ applyServer(*serverOptions) }

type serverOptionFunc func(*serverOptions)

func (f serverOptionFunc) applyServer(o *serverOptions) { f(o) }

type serverOptions struct {
	deadlineCfg deadline.ServerConfig
	dedupe      *dedupe.Server
	noDedupe    bool
	noPushback  bool
	overload    overloadOptions  // server_overload.go
	budgets     *budget.Registry // the retry budgets per method; nil: the default
	noBudget    bool
}

// WithServerBudget sets the server's retry budget: per method, the retries
// and hedges the server serves are paid for by the first attempts it
// serves (the first attempts of every client, so it bounds a fleet whose
// clients it does not control). While the method fails more than the
// budget's ratio of its recent calls, a retry or hedge the method's budget
// cannot pay for is refused at once (Unavailable, ErrorReasonRetryBudget,
// grpc-retry-pushback-ms: -1), before the handler runs. The default is
// budget.NewRegistry(budget.Config{}): 10%. nil turns it off.
//
// Whether an attempt is a retry is the caller's word (its
// grpc-previous-rpc-attempts metadata): a client that hides it is served
// as a first attempt, and pays for others' retries. The suite's clients
// also say that their own budgets bound their retries (BudgetedKey):
// those are counted, and served even when the server's budget is spent,
// so that the two budgets do not both charge them; the retries of other
// clients get what is left. A client that lies about either gets no more
// than it would from a server without the budget.
func WithServerBudget(r *budget.Registry) ServerOption {
	return serverOptionFunc(func(o *serverOptions) { o.budgets, o.noBudget = r, r == nil })
}

// WithServerDeadline configures how the server applies propagated deadlines.
func WithServerDeadline(c deadline.ServerConfig) ServerOption {
	return serverOptionFunc(func(o *serverOptions) { o.deadlineCfg = c })
}

// WithDedupe sets the idempotency-key deduplication (default: a
// dedupe.NewServer with an in-memory store). nil is ignored.
func WithDedupe(s *dedupe.Server) ServerOption {
	return serverOptionFunc(func(o *serverOptions) {
		if s != nil {
			o.dedupe = s
			o.noDedupe = false
		}
	})
}

// WithoutDedupe turns idempotency-key deduplication off.
func WithoutDedupe() ServerOption {
	return serverOptionFunc(func(o *serverOptions) { o.noDedupe = true; o.dedupe = nil })
}

// WithoutPushback stops the server from telling callers not to retry when
// its own outgoing retries were refused.
func WithoutPushback() ServerOption {
	return serverOptionFunc(func(o *serverOptions) { o.noPushback = true })
}
