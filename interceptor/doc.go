// Package interceptor composes stormguard's gRPC interceptors: a client
// side (unary and stream) that retries and hedges only what may be
// repeated, within a per-target retry budget and behind a circuit breaker
// per target and method, and a server side that applies propagated deadlines,
// deduplicates idempotency keys and tells callers when not to retry.
//
//	guard := interceptor.NewClient()
//	conn, err := grpc.NewClient(addr, append(guard.DialOptions(),
//		grpc.WithTransportCredentials(insecure.NewCredentials()))...)
//
// DialOptions installs both interceptors and turns grpc-go's own retries
// off, so that the two do not multiply; see Client.DialOptions.
//
// # One logical call
//
// The Client resolves a method's policy once (idempotency.Lookup) and
// deposits into the target's budget. After a failed attempt it retries only
// if the method may be repeated (NO_SIDE_EFFECTS or IDEMPOTENT, WithIdempotent,
// or retry_with_key with a key), the code is retryable (default:
// Unavailable), attempts are left (default 3 in all), the server did not
// push back, RetryPolicy.If agrees, and the backoff ends before the deadline.
// When the retry is due, the breaker and the budget are asked; a token is
// withdrawn only for a retry that is sent. A method that may not be
// repeated is sent exactly once, whatever the options say.
//
// A refused retry returns the last attempt's status code and message;
// refusals by the budget, the breaker, the deadline or a pushback carry an
// ErrorInfo and end the message with a marker, " [stormguard: retry
// refused: budget #<seal>]", that survives clients which keep only the
// message (RefusedBy reads either). A call refused by an open breaker fails
// at once with Unavailable, ErrorInfo CIRCUIT_OPEN and a RetryInfo. The
// seal, drawn at random when the process starts, is what RefusedBy checks:
// it reports only refusals this process made, never one a server claims.
// A Server forwards its handler's refused call without the seal, so that
// the callers above read it with RefusedDownstream.
//
// # Doing no harm
//
// Protection never refuses what no retries would have sent: a first
// attempt is refused only by an open breaker, and the breaker opens only
// when every attempt in its window failed. Breakers are per method: one
// method failing never gets another method of the same target refused. Partial failures are the
// budget's: retries and hedges stay near 10% of the calls. A target that
// has served nothing lately gets no retries or hedges at all. Attempts
// avoid an endpoint that fails while the target's other endpoints serve,
// and a retry after a failure there is a fail-over the budget does not pay
// for, when another endpoint can take it: a retry whose picks all go to
// the failing endpoint (grpc has no other ready) is paid from the budget,
// or not sent; see WithoutFailover.
//
// # Retry loops outside the suite
//
// A client library may retry in an interceptor installed outside the
// suite (etcd's clientv3 does, up to 100 times; others back off up to a
// minute), as may go-grpc-middleware's retry or the caller's own loop:
// each try enters the suite as a call. The Client remembers failed calls
// by their context's Done channel (or the context, when it has none),
// route and request content, until that context is done (at most 10
// minutes after the last try that was sent); a call that matches one is
// the same logical call coming back. It deposits nothing into the budget,
// its first attempt is a retry (a token from the budget, the breaker's
// say), and when that retry is refused it fails at once, before anything
// is sent, with the last try's status, annotated. A refused try extends
// nothing; while a target that has served nothing lately refuses such
// tries, one is sent every half a second as a probe, and the first success
// of any call of the route forgets the failures remembered until then. A
// try of a method that may not be repeated is still sent at most once, and
// only with a token; a retry_with_key method's tries share one key. Tries
// with new request content or a new cancellable context each (a per-try
// timeout) are calls of their own, as are streams. A loop that returns
// only its context's error hides the refusal from RefusedBy:
// RecordRefusals records it on the context. docs/clients.md has the
// details.
//
// # The service config
//
// Through DialOptions, a method's retryPolicy or hedgingPolicy in the
// channel's service config (from the resolver, or WithDefaultServiceConfig)
// drives its calls, within the budget, the breaker and the deadline, and
// the config's retryThrottling bounds them too; a config the resolver gives
// at run time applies on the next call. A send_once method, and a
// retry_with_key method without a key, are not repeated whatever it says.
//
// # Priorities
//
// A call may carry a priority (package priority: sheddable, default,
// critical), set with priority.NewContext; every attempt of a call whose
// priority is not default sends it in the stormguard-priority header. The
// Server reads it (WithPriorityCap bounds what it honours) and puts it in
// the handler's context, so that the calls a handler makes inherit it, as
// they inherit its deadline; its overload protection sheds sheddable work
// first and critical work last.
//
// # Hedging
//
// Methods with a hedging policy (proto hedging_delay, or WithHedging) send
// another attempt when no answer has come after the delay; the first OK or
// non-retryable answer wins and the others are cancelled before the call
// returns. A zero delay is adaptive: the (1 − 0.75 × budget ratio) quantile
// of the route's recent latencies, and at least three times their median, so
// that an attempt only a little slower than most is not hedged.
//
// # Streams
//
// Streams retry like unary calls until they commit: when the caller has
// received a response header or message, or has sent more than the replay
// limit. Until then client messages are kept and replayed in order on each
// new attempt. Streams are not hedged.
//
// # Telemetry
//
// Each call is a span (CLIENT "pkg.Svc/Method", or INTERNAL
// "Sent.pkg.Svc/Method" with Telemetry.InstrumentedAttempts) with a child span
// per attempt, and an event per decision. The names of the spans' events
// and attributes and of the metrics are in package semconv; instruments
// are created once per Client, and providers default to the OpenTelemetry
// globals. Hooks, Targets and StateHandler
// expose the same decisions and state to code.
//
// # Server
//
// The Server applies the tighter of the propagated and the grpc deadline,
// refuses work whose deadline has already passed, deduplicates keyed
// requests of retry_with_key methods (idempotency/dedupe), protects unary
// methods from overload (package overload, WithOverload), and answers
// grpc-retry-pushback-ms: -1 when its handler failed because a call it
// made was refused a retry for a reason that propagates (budget, breaker,
// pushback, throttle, attempts exhausted): only the layer next to the
// failure retries. When a call fails while the method's retry budget
// could not pay for a retry of it, the Server says so in the trailers
// (stormguard-budget-dry: 1). The trailer speaks for the endpoint that
// answered: the suite's Client sends that call's retry neither to it nor
// to any endpoint that failed an attempt in the last 10 s, not at all if
// that leaves none, and otherwise pays it from its budget's credit only,
// starting no loan (other clients are not told: their retries are refused
// before the handler, as ever).
// A unary call meets them in
// that order: a retry of a write that already completed is answered from
// the dedupe store before the overload protection, which neither refuses
// it nor learns from it. Every call the Server refuses before its handler
// runs is counted by reason in stormguard.server.refusals
// (WithServerTelemetry).
//
// # Reading the code
//
// A client call's decisions are made by package internal/engine, which
// speaks no gRPC (its doc says where each is); this package adapts it to
// grpc-go. Each question has a file:
//
//   - what is this call? call.go (its state, options, setup, idempotency
//     key); route.go (what a Client keeps per target and method);
//   - what happens next? engine.go: the loop (run), opening an attempt
//     (open), and the one step after every attempt (step), which the
//     senders unary.go, hedge.go and stream.go (a stream's retry in
//     stream_replay.go) all call; pertry.go is the per-attempt timer;
//   - may an attempt be sent, or paid for, now? gates.go (the engine's
//     admission: deadline, breaker, throttle, budget, endpoints, shadow
//     mode; what its answers become for grpc-go);
//   - should a failure be retried, and when? rules.go (the engine's rules;
//     the server's pushback and RetryInfo read; RetryPolicy.If asked);
//   - what does a decision leave behind? record.go (refusals, events,
//     metrics, hooks, the end of a call); refusal.go (the refusal table and
//     the statuses a caller gets);
//   - what did the pick do? pick.go (the per-attempt credentials that
//     watch grpc-go's pick, with their staged and committed state);
//   - what does the operator's config say? serviceconfig.go and
//     grpcretry.go (grpc-go's own retries);
//   - retry loops outside the suite: outer.go, outer_table.go;
//   - options and what a Client shows: options.go, hooks.go, state.go,
//     telemetry.go; the server side: server*.go.
package interceptor
