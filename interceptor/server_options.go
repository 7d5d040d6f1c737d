package interceptor

import (
	"context"

	"go.opentelemetry.io/otel/metric"

	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/deadline"
	"github.com/stormguard/stormguard/idempotency/dedupe"
	"github.com/stormguard/stormguard/overload"
	"github.com/stormguard/stormguard/priority"
)

// A ServerOption configures a Server.
type ServerOption interface{ applyServer(*serverOptions) }

type serverOptionFunc func(*serverOptions)

func (f serverOptionFunc) applyServer(o *serverOptions) { f(o) }

type serverOptions struct {
	deadlineCfg deadline.ServerConfig
	dedupe      *dedupe.Server
	dedupeSet   bool // WithDedupe was given (dedupe nil: off)
	noPushback  bool
	overload    *overload.Guard
	overloadSet bool                                    // WithOverload was given (overload nil: off)
	budgets     *budget.Registry                        // the retry budgets per method
	budgetSet   bool                                    // WithServerBudget was given (budgets nil: off)
	priorityCap func(context.Context) priority.Priority // WithPriorityCap
	trust       *budgetTrust                            // WithTrustedBudgets; nil: nobody

	// meterProvider is WithServerTelemetry's; nil: the global one.
	meterProvider metric.MeterProvider
}

// WithServerTelemetry sets where the Server records its metric,
// stormguard.server.refusals: the calls it refused before their handler
// ran, by reason (semconv.ServerReasonShed, ServerReasonDoomed,
// ServerReasonDedupeBusy, ServerReasonRetryBudget) and method. Only
// t.MeterProvider is used (nil keeps the default, otel.GetMeterProvider(),
// or what an earlier WithServerTelemetry set); each refusal is also an
// event (semconv.EventServerRefused) on the span in the call's context,
// when one records (otelgrpc's server span, say).
func WithServerTelemetry(t Telemetry) ServerOption {
	return serverOptionFunc(func(o *serverOptions) {
		if t.MeterProvider != nil {
			o.meterProvider = t.MeterProvider
		}
	})
}

// WithServerBudget sets the server's retry budget: per method, the retries
// and hedges the server serves are paid for by the first attempts it
// serves (the first attempts of every client, so it bounds a fleet whose
// clients it does not control; see budget.Method). While the method fails
// more than the budget's ratio of its recent calls, a retry or hedge the
// method's budget cannot pay for is refused at once (Unavailable,
// semconv.ErrorReasonRetryBudget, grpc-retry-pushback-ms: -1), before the
// handler runs. At the start of a failure it lends what its clients'
// own budgets would lend them: the budget's Burst for each client
// connection that sent a first attempt lately, at most one retry per
// first attempt of the last second, repaid by the first attempts that
// follow. The default is budget.NewRegistry(budget.Config{}): 10%, a
// Burst of 5. nil turns it off.
//
// Every retry and hedge is charged, whoever sends it and whatever its
// headers say: the suite's clients say when their own budget paid for a
// retry (semconv.BudgetedKey), but that buys nothing unless the caller is
// one WithTrustedBudgets names. Whether an attempt is a retry is the
// caller's word (its grpc-previous-rpc-attempts metadata): a client that
// hides it is served as a first attempt, and pays for others' retries; it
// gets no more than it would from a server without the budget.
func WithServerBudget(r *budget.Registry) ServerOption {
	return serverOptionFunc(func(o *serverOptions) { o.budgets, o.budgetSet = r, true })
}

// WithServerDeadline configures how the server applies propagated deadlines.
func WithServerDeadline(c deadline.ServerConfig) ServerOption {
	return serverOptionFunc(func(o *serverOptions) { o.deadlineCfg = c })
}

// WithDedupe sets the idempotency-key deduplication (see the
// idempotency/dedupe package). The default, dedupe.NewServer(dedupe.Config{}),
// keeps records in memory and scopes keys by caller. nil turns it off.
func WithDedupe(s *dedupe.Server) ServerOption {
	return serverOptionFunc(func(o *serverOptions) { o.dedupe, o.dedupeSet = s, true })
}

// WithOverload sets the overload protection of unary calls (see the
// overload package): deadline-aware admission and retry-aware shedding.
// The default is overload.New(overload.Config{}); pass a Guard made with
// overload.New to configure it, share it between Servers, or read its
// Stats. nil turns it off. Streams are not guarded: a stream's lifetime is
// not a service time.
func WithOverload(g *overload.Guard) ServerOption {
	return serverOptionFunc(func(o *serverOptions) { o.overload, o.overloadSet = g, true })
}

// WithoutPushback stops the server from telling callers not to retry when
// its own outgoing retries were refused, and from telling them that the
// method's retry budget could not pay for a retry (stormguard-budget-dry;
// its budget still refuses the retries it cannot pay for).
func WithoutPushback() ServerOption {
	return serverOptionFunc(func(o *serverOptions) { o.noPushback = true })
}
