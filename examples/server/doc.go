// Command server serves the demo EchoService (internal/proto/echo/v1)
// behind stormguard's server interceptors, on 127.0.0.1.
//
//	go run ./examples/server -addr 127.0.0.1:50051 -flaky 2
//
// The server interceptors (interceptor.NewServer) apply the deadline the
// caller propagated, refuse work whose deadline has already passed,
// deduplicate requests that carry an idempotency key (Charge; the demo's
// plaintext callers share one anonymous key space, by explicit choice),
// and tell callers not to retry when a handler failed because its own
// retries were refused. With -flaky N the server fails the first attempt of every N-th
// unary request with UNAVAILABLE, so that a client shows its retries.
//
// It prints one line per request (method, request id, attempt, the
// deadline it was given, the idempotency key) and stops gracefully on
// SIGINT or SIGTERM, or after -for.
package main
