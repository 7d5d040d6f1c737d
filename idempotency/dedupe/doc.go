// Package dedupe runs each keyed write once: server interceptors that
// deduplicate requests on their idempotency key
// ([github.com/stormguard/stormguard/idempotency.MetadataKey]) and answer
// retries with the stored outcome, and the [Store] that keeps outcomes
// ([MemoryStore] in one process).
//
// For a unary request that carries a key, [Server.Unary]:
//
//   - refuses an invalid key (empty, longer than MaxKeyLen, not printable
//     ASCII without spaces, or several values) with codes.InvalidArgument;
//   - binds the key to the method and a SHA-256 of the request, its
//     [Fingerprint];
//   - on first sight, runs the handler and stores its outcome (response,
//     status with details, header and trailer metadata), unless its code
//     is in Config.NotStored, the handler panicked, or the response is not
//     a protobuf message: then the next attempt runs the handler again;
//   - while the first execution runs, makes duplicates wait for its
//     outcome, within their own deadline;
//   - after completion, replays the stored outcome without running the
//     handler;
//   - refuses the key reused with another method or request with
//     codes.InvalidArgument, never answering with another request's outcome.
//
// Requests without a key pass straight through. [Server.Stream] does the
// same for the server-streaming methods Config.Streams lists, recording
// every response message; other streams pass through untouched.
//
// The README in this directory explains the design: what is recorded and
// replayed, the limits of header replay, why client-streaming and
// bidirectional methods are not deduplicated, and how stored outcomes are
// bounded.
package dedupe
