// Package semconv names what stormguard writes and reads: the span events,
// attribute keys and metrics of its telemetry, the gRPC metadata keys of
// its protocol, and the ErrorInfo reasons of the statuses it answers with.
// Where gRFC A6, A66, A91 or A96 name a thing, the name is theirs. The
// values are stable: dashboards, alerts and other clients depend on them.
package semconv

import "go.opentelemetry.io/otel/attribute"

// ScopeName is the instrumentation scope of the interceptor package's
// tracer and meter: its import path.
const ScopeName = "github.com/stormguard/stormguard/interceptor"

// OutlierScopeName is the instrumentation scope of the outlier package's
// meter: its import path.
const OutlierScopeName = "github.com/stormguard/stormguard/outlier"

// Span event names: one event on the call span per decision.
const (
	EventRetryScheduled  = "stormguard.retry.scheduled"
	EventRetryRefused    = "stormguard.retry.refused"
	EventHedgeSent       = "stormguard.hedge.sent"
	EventHedgeRefused    = "stormguard.hedge.refused"
	EventBreakerRejected = "stormguard.breaker.rejected"
	EventDeadlineFast    = "stormguard.deadline.fail_fast"
	// EventTimeoutKept is recorded when an attempt's per-attempt timeout
	// expires and no retry could follow it (the reason says why): the
	// attempt is not cut short, and runs on to the call's deadline.
	EventTimeoutKept = "stormguard.attempt.timeout_kept"
	// EventWouldRefuse is recorded in shadow mode (interceptor.WithShadowMode) where
	// the budget or the breaker would have refused; the attempt is sent.
	EventWouldRefuse = "stormguard.would_refuse"
	// EventOuterProbe is recorded when a try that a retry loop outside
	// the suite sent again (AttrOuterRetry) is sent although the budget or
	// the breaker refused it (AttrReason says which), as a probe of a
	// target that has served nothing lately: one every half a second per
	// method and target at most, paid by no budget, so that the suite
	// learns when the target serves again.
	EventOuterProbe = "stormguard.outer.probe"
	// EventServerRefused is recorded on the server's span of a call (the
	// span in the handler's context, if any: otelgrpc's server span, say)
	// that the Server refused before its handler ran, with AttrReason one
	// of the ServerReason values.
	EventServerRefused = "stormguard.server.refused"
)

// Attribute keys of stormguard's spans, events and metrics.
const (
	// AttrReason says why a retry, hedge or call was refused: one of the
	// interceptor.Reason values.
	AttrReason = attribute.Key("stormguard.reason")
	// AttrAttemptKind is first, retry or hedge.
	AttrAttemptKind = attribute.Key("stormguard.attempt.kind")
	// AttrPreviousAttempts is the number of attempts sent before this one
	// (gRFC A6 / A72 "previous-rpc-attempts").
	AttrPreviousAttempts = attribute.Key("previous-rpc-attempts")
	// AttrTransparentRetry is always false on stormguard's attempt spans
	// (gRFC A72); grpc's own transparent retries happen below them.
	AttrTransparentRetry = attribute.Key("transparent-retry")
	// AttrDelay is the wait before a retry, in seconds.
	AttrDelay = attribute.Key("stormguard.delay_s")
	// AttrCause is the status code that caused a retry.
	AttrCause = attribute.Key("stormguard.cause")
	// AttrHedge is true on attempt spans of hedges.
	AttrHedge = attribute.Key("stormguard.hedge")
	// AttrPushback is the server's grpc-retry-pushback-ms, when it sent one.
	AttrPushback = attribute.Key("stormguard.pushback_ms")
	// AttrBreakerState is closed, open or half-open.
	AttrBreakerState = attribute.Key("stormguard.breaker.state")
	// AttrFailover is true on a retry scheduled as a fail-over: the failed
	// attempt's endpoint fails while the target's other endpoints serve.
	AttrFailover = attribute.Key("stormguard.failover")
	// AttrSent is false on the span of an attempt that an open breaker
	// refused at its pick (it picked an endpoint that served nothing).
	AttrSent = attribute.Key("stormguard.sent")
	// AttrPeer is the endpoint an attempt was sent to, when known.
	AttrPeer = attribute.Key("stormguard.peer")
	// AttrGRPCRetryPolicy is true on call spans of methods that grpc-go's
	// own service-config retryPolicy covers: the suite then sends one
	// attempt and leaves the retries to grpc-go (see interceptor.Client.DialOptions).
	AttrGRPCRetryPolicy = attribute.Key("stormguard.grpc_retry_policy")
	// AttrServiceConfig says, on call spans of methods that the service
	// config gives a retryPolicy or hedgingPolicy, what the suite did with
	// it: "applied" (the policy drove the call's retries or hedges), or
	// "ignored:send_once" / "ignored:no_key" (the proto marks the method
	// send_once, or retry_with_key and the call has no idempotency key: the
	// proto wins, and the call is not repeated).
	AttrServiceConfig = attribute.Key("stormguard.service_config")
	// AttrOuterRetry is true on call spans of a try that a retry loop
	// outside the suite (a client library's own, such as etcd's
	// clientv3) sent again after it failed: the try deposits nothing into
	// the budget, and its first attempt is a retry.
	AttrOuterRetry = attribute.Key("stormguard.outer_retry")
	// AttrPriority is on call spans of calls that carry a priority (see
	// package priority): sheddable, default or critical.
	AttrPriority = attribute.Key("stormguard.priority")
	// AttrGRPCTarget is gRFC A66's grpc.target: the channel's target, on
	// the grpc.client.call.* histograms and the outlier policy's metrics.
	AttrGRPCTarget = attribute.Key("grpc.target")
	// AttrOutlierDetectionMethod is gRFC A91's
	// grpc.lb.outlier_detection.detection_method: how an outlier was
	// detected. The outlier policy's is OutlierFailurePercentage.
	AttrOutlierDetectionMethod = attribute.Key("grpc.lb.outlier_detection.detection_method")
	// AttrOutlierUnenforcedReason is gRFC A91's
	// grpc.lb.outlier_detection.unenforced_reason: why a detected outlier
	// was not ejected. The outlier policy's is OutlierMaxEjectionOverflow.
	AttrOutlierUnenforcedReason = attribute.Key("grpc.lb.outlier_detection.unenforced_reason")
)

// Values of the outlier policy's gRFC A91 attributes.
const (
	// OutlierFailurePercentage is the detection method of the outlier
	// policy's every ejection: the endpoint's share of failed requests is
	// at least the configured ratio, and clearly above the other
	// endpoints' (of A91's two methods, gRFC A50's failure percentage
	// ejection is the closest; the policy has no success-rate method).
	OutlierFailurePercentage = "failure_percentage"
	// OutlierMaxEjectionOverflow is the unenforced reason of an outlier
	// the policy did not eject because as many endpoints as
	// MaxEjectionPercent allows were ejected already, or because it is the
	// last connected endpoint. (A91's other reason, enforcement_percentage,
	// has no counterpart: the policy enforces every ejection it may.)
	OutlierMaxEjectionOverflow = "max_ejection_overflow"
)

// Reasons of the Server's refusals (AttrReason on MetricServerRefusals and
// EventServerRefused): each is a call answered before its handler ran.
const (
	// ServerReasonShed: shed by the overload protection at its concurrency
	// limit (Unavailable, ErrorReasonOverloaded).
	ServerReasonShed = "shed"
	// ServerReasonDoomed: its deadline had passed on arrival, or was
	// shorter than the server's minimum (interceptor.WithServerDeadline) or
	// than what the method needs now, on arrival or when, having waited for
	// a place under the method's limit, it was given one (DeadlineExceeded,
	// ErrorReasonDeadlineTooShort for the last two), or its caller had
	// already left (Canceled). A call whose caller leaves while it waits
	// for a place is not a refusal.
	ServerReasonDoomed = "doomed"
	// ServerReasonDedupeBusy: a keyed request the idempotency store had no
	// room for, its room held by requests in flight and recent records
	// (ResourceExhausted, with a pushback; see dedupe.Busy).
	ServerReasonDedupeBusy = "dedupe_busy"
	// ServerReasonRetryBudget: a retry or hedge over its method's server
	// retry budget, the fleet's ratio of retries to first attempts
	// (Unavailable, ErrorReasonRetryBudget).
	ServerReasonRetryBudget = "retry_budget"
)

// Metric names. The grpc.client.call.* histograms are the per-call metrics
// of gRFC A66 and A96, with their attributes (grpc.method, grpc.target,
// grpc.status); the grpc.lb.outlier_detection.* counters are gRFC A91's,
// recorded by the outlier policy; the stormguard.* instruments carry the
// OpenTelemetry RPC semantic-convention attributes. None is a name that
// otelgrpc's per-attempt instrumentation (rpc.client.*) reports.
const (
	MetricCalls         = "stormguard.client.calls"
	MetricAttempts      = "stormguard.client.attempts"
	MetricRefusals      = "stormguard.client.refusals"
	MetricWouldRefuse   = "stormguard.client.would_refuse"
	MetricCallDuration  = "grpc.client.call.duration"
	MetricCallRetries   = "grpc.client.call.retries"
	MetricCallHedges    = "grpc.client.call.hedges"
	MetricBreakerState  = "stormguard.breaker.state"
	MetricBudgetBalance = "stormguard.budget.balance"
	// MetricCallRetryDelay is gRFC A96's histogram of the time, in
	// seconds, a call had no attempt in flight between its attempts
	// (backoffs and pushbacks), once per call that retried or hedged.
	MetricCallRetryDelay = "grpc.client.call.retry_delay"
	// MetricServerRefusals counts the calls the Server refused before
	// their handler ran, by reason (AttrReason: a ServerReason value) and
	// method (rpc.method, as on the client's stormguard.* metrics).
	MetricServerRefusals = "stormguard.server.refusals"
	// MetricOutlierEjectionsEnforced and MetricOutlierEjectionsUnenforced
	// are gRFC A91's counters of the outlier policy's ejections, and of
	// the outliers it detected but did not eject, with AttrGRPCTarget,
	// AttrOutlierDetectionMethod and (unenforced) AttrOutlierUnenforcedReason.
	MetricOutlierEjectionsEnforced   = "grpc.lb.outlier_detection.ejections_enforced"
	MetricOutlierEjectionsUnenforced = "grpc.lb.outlier_detection.ejections_unenforced"
)

// Metadata keys the client reads and writes (gRFC A6).
const (
	// PreviousAttemptsKey is sent on every retry and hedge: the number of
	// attempts of the same call sent before it.
	PreviousAttemptsKey = "grpc-previous-rpc-attempts"
	// PushbackKey is read from response trailers: a value from 0 to the
	// interceptor's MaxPushback (one minute) is the delay in milliseconds
	// before the next attempt (replacing the backoff); a negative, larger
	// or malformed value, or several values, mean "do not retry".
	PushbackKey = "grpc-retry-pushback-ms"
	// BudgetedKey is sent, with the value "1", on a retry or hedge of the
	// suite's client that an enforcing budget paid for (not without a
	// budget, not in shadow mode, not on a fail-over the budget did not pay
	// for). It is the client's word: a stormguard server charges the retry
	// to its own retry budget all the same, unless the caller is one it
	// trusts by an identity the caller cannot forge
	// (interceptor.WithTrustedBudgets); then it serves it even when its
	// budget is spent, so that the two budgets do not both charge it.
	BudgetedKey = "stormguard-budgeted"
	// BudgetDryKey is set, with the value "1", in the trailers of a failed
	// attempt by a stormguard server whose retry budget for the method
	// could not pay for a retry of it now (the method fails more than the
	// budget's ratio of its calls, and the fleet's retries are spent). It
	// speaks for the endpoint that answered: the suite's client sends the
	// retry neither there nor to an endpoint that failed lately, and pays
	// one that goes elsewhere only from its budget's credit, never from a
	// loan. It is the server's word: it can only make its callers retry it
	// less.
	BudgetDryKey = "stormguard-budget-dry"
	// PriorityKey carries a call's priority (package priority), on every
	// attempt of a call whose priority is not the default: "sheddable" or
	// "critical" ("default" is accepted). A server takes a request without
	// it, or with anything but one such value, as default.
	PriorityKey = "stormguard-priority"
)

// ErrorInfo reasons and domain of the details stormguard adds to statuses.
const (
	// ErrorDomain is the ErrorInfo domain of stormguard's details.
	ErrorDomain = "stormguard"
	// ErrorReasonCircuitOpen: the call was not sent because the breaker
	// of its method on its target is open (code Unavailable, with a
	// RetryInfo saying how long it stays open; the metadata keys "target"
	// and "method" name the breaker, and "seal" is the refusing process's:
	// see interceptor.RefusedBy).
	ErrorReasonCircuitOpen = "CIRCUIT_OPEN"
	// ErrorReasonRetryRefused: the status is the last attempt's code and
	// message (the message ending with the refusal marker, see
	// interceptor.RefusedBy); a retry was refused, and the metadata key
	// "refused_by" says why (budget, breaker, deadline, pushback or
	// throttle). The key "seal" is the refusing process's; a server
	// forwarding the status up the chain drops it (a refusal made down the
	// chain: interceptor.RefusedDownstream).
	ErrorReasonRetryRefused = "RETRY_REFUSED"
)

// ErrorInfo reasons of the statuses the Server's overload protection
// answers with (domain ErrorDomain).
const (
	// ErrorReasonDeadlineTooShort: refused on arrival (DeadlineExceeded,
	// handler not run) because the deadline left was shorter than what the
	// method needs now; grpc-retry-pushback-ms is -1.
	ErrorReasonDeadlineTooShort = "DEADLINE_TOO_SHORT"
	// ErrorReasonOverloaded: shed at a concurrency limit (Unavailable,
	// handler not run). The metadata key "attempt" says "retry" (a retry or
	// hedge; grpc-retry-pushback-ms is -1) or "first" (the pushback says
	// when the caller may retry).
	ErrorReasonOverloaded = "OVERLOADED"
)

// ErrorReasonRetryBudget is the ErrorInfo reason (domain ErrorDomain) of a
// retry or hedge the Server refused because its method's retry budget was
// spent (Unavailable, handler not run, grpc-retry-pushback-ms: -1).
const ErrorReasonRetryBudget = "RETRY_BUDGET"
