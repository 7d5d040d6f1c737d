// Command tracing shows how to read stormguard's retry spans.
//
// It starts the demo echo service on 127.0.0.1 (an in-process origin whose
// answers are scripted per request), calls it through the suite's client
// interceptor in five scenarios, and prints the spans the suite recorded as a
// tree: one line per span, its children indented under it, and the decision
// events of each call in time order among its attempts.
//
//  1. retried-twice: Put fails twice with UNAVAILABLE, then succeeds.
//  2. budget-refused: Put fails; the retry budget (no start-up burst) refuses the retry.
//  3. hedged: Put's first attempt stalls; a hedge sent after 50ms wins.
//  4. breaker-open: three failures in a row open the target's breaker; the
//     next call is refused without being sent.
//  5. unmarked: Notify (no idempotency option in the proto) fails and is not
//     retried.
//
// Each scenario is one trace whose root span is named
// "tracing-example/<scenario>"; the suite's call spans are its children.
//
// When OTEL_EXPORTER_OTLP_ENDPOINT is set (e.g. http://127.0.0.1:4317), the
// spans are also exported over OTLP/gRPC with service.name
// "stormguard-example", so they can be read in a tracing backend such as
// Jaeger (see scripts/jaeger.sh and this directory's README).
//
// Try it:
//
//	go -C examples/tracing run .
package main
