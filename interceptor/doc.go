// Package interceptor composes stormguard's gRPC interceptors: a client
// side (unary and stream) that retries and hedges only what may be
// repeated, within a per-target retry budget and behind a per-target circuit
// breaker, and a server side that applies propagated deadlines,
// deduplicates idempotency keys and tells callers when not to retry.
//
//	guard := interceptor.NewClient()
//	conn, err := grpc.NewClient(addr,
//		grpc.WithTransportCredentials(insecure.NewCredentials()),
//		grpc.WithDisableRetry(), // the suite retries; grpc's own must not stack
//		grpc.WithChainUnaryInterceptor(guard.Unary()),
//		grpc.WithChainStreamInterceptor(guard.Stream()),
//	)
//
// # One logical call
//
// The client resolves the method's policy once (see idempotency.Lookup) and
// deposits into the target's budget (target = cc.Target()). Each attempt
// asks the target's breaker, gets the time actually left
// (stormguard-deadline-ms) and, from the second on, grpc-previous-rpc-attempts.
// After a failed attempt it retries only if all of these hold:
//
//   - the method may be repeated: idempotency_level NO_SIDE_EFFECTS or
//     IDEMPOTENT (or WithIdempotent), or retry_with_key with a key;
//   - the code is retryable (default: Unavailable only);
//   - fewer than max attempts (default 3, the first included) were sent;
//   - the server did not push back (grpc-retry-pushback-ms < 0 or malformed);
//   - the breaker is not open, and the budget grants a token;
//   - the backoff (exponential, capped, jittered; or the server's pushback
//     delay) ends before the deadline.
//
// Otherwise it returns the last attempt's status unchanged; when a retry was
// refused by the budget, the breaker, the deadline or a pushback, the status
// carries an ErrorInfo (domain "stormguard", reason RETRY_REFUSED) saying
// which; see RefusedBy. A call refused by an open breaker fails at once with
// Unavailable, ErrorInfo CIRCUIT_OPEN and a RetryInfo, and is never retried.
// A method that may not be repeated is sent exactly once, whatever the
// options say.
//
// # Hedging
//
// Methods with a hedging policy (proto hedging_delay, or WithHedging) send
// another attempt when no answer has come after the delay, budget and
// breaker permitting; the first OK or non-retryable answer wins and the
// others are cancelled before the call returns. A zero delay is adaptive:
// the (1 − 0.75 × budget ratio) quantile of the route's recent attempt
// latencies, so that hedges use about three quarters of the budget.
// Header, Trailer and Peer call options are filled from the winner.
//
// # Streams
//
// Streams retry like unary calls until they commit: when the caller has
// received a response header or message, or has sent more than the replay
// limit (256 KiB by default). Until then client messages are kept and
// replayed in order on each new attempt. Streams are not hedged.
//
// # Telemetry
//
// Each logical call is one CLIENT span named after the method
// ("pkg.Svc/Method") with semconv v1.43 attributes, and each attempt a child
// span ("Attempt.pkg.Svc/Method") with previous-rpc-attempts and its kind
// (first, retry or hedge). Decisions are events on the call span (see the
// Event constants), with their reasons. Metrics: stormguard.client.calls,
// stormguard.client.attempts (by kind: attempts / calls is the
// amplification), stormguard.client.refusals (by reason),
// grpc.client.call.retries and grpc.client.call.hedges (gRFC A96),
// rpc.client.call.duration, and the gauges stormguard.breaker.state and
// stormguard.budget.balance per target. Instruments are created once per
// Client; providers default to the OpenTelemetry globals.
//
// # Server
//
// The Server applies the tighter of the propagated and the grpc deadline,
// refuses work whose deadline has already passed, deduplicates requests on
// their idempotency-key, and, when a handler fails after a call it made
// through a stormguard Client had a retry refused (budget, breaker,
// pushback, attempts exhausted), answers with grpc-retry-pushback-ms: -1 so
// that callers above do not retry: only the layer next to the failure
// retries. grpc-go's own retry policy honours that trailer too.
package interceptor
