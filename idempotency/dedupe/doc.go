// Package dedupe runs each keyed write once: server interceptors that
// deduplicate requests on their idempotency key
// ([github.com/stormguard/stormguard/idempotency.MetadataKey]) and answer
// retries with the stored outcome, and the [Store] that keeps outcomes
// ([MemoryStore] in one process).
//
// Only writes that need it are deduplicated: the methods whose proto marks
// them retry_with_key, and those listed in Config.Methods. Requests to
// other methods pass through, keyed or not, and nothing is stored for
// them.
//
// Keys are scoped by the caller's identity (Config.Identity, by default
// [DefaultIdentity]: the TLS client certificate and the authorization
// metadata): a caller never receives another caller's outcome, a key
// another caller used looks unused, and using a key first blocks nobody
// else. A keyed request from a caller without identity is refused with
// codes.FailedPrecondition, unless Config.AllowAnonymous lets such callers
// share one key space.
//
// For a keyed unary request to a deduplicated method, [Server.Unary]:
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
//     codes.InvalidArgument, never answering with another request's outcome;
//   - when the store has no room, refuses the request with
//     codes.ResourceExhausted and grpc-retry-pushback-ms, before the
//     handler runs.
//
// [Server.Stream] does the same for server-streaming methods, recording
// every response message; client-streaming and bidirectional streams pass
// through untouched.
//
// A store that fails refuses the request with codes.Unavailable and
// grpc-retry-pushback-ms: 1000: the handler never runs unguarded.
//
// The handler of a deduplicated request runs with a wrapped
// grpc.ServerTransportStream in its context, so that its header and
// trailer are recorded: grpc.SetHeader, SendHeader, SetTrailer and Method
// work there; grpc.SetSendCompressor and ClientSupportedCompressors do
// not.
//
// The README in this directory explains the design: identities, what is
// recorded and replayed, the limits of header replay, why client-streaming
// and bidirectional methods are not deduplicated, and how stored outcomes
// are bounded.
package dedupe
