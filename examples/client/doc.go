// Command client calls the demo EchoService through stormguard's client
// interceptors (interceptor.NewClient) and prints every span they record:
// one CLIENT span per call, one child span per attempt, and the decisions
// (retry scheduled, retry refused, hedge sent, ...) as events.
//
//	go run ./examples/server -addr 127.0.0.1:50051 -flaky 2 &
//	go -C examples/client run . -addr 127.0.0.1:50051
//
// Spans go to stdout (the OpenTelemetry stdout exporter), or over OTLP/gRPC
// when OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)
// is set; the exporter reads its other OTEL_EXPORTER_OTLP_* variables too.
//
// The client makes one call of each kind the demo proto marks: Get (no
// side effects: retried, and hedged after an adaptive delay), Put
// (idempotent: retried), Charge (retried only with an idempotency key,
// which the client generates), Notify (unmarked: sent once, never
// retried) and a List stream. It prints each call's outcome; a failed call
// is part of the demo (see -flaky on the server), so the exit status is 1
// only when no call succeeded, e.g. when nothing listens at -addr.
package main
