// Package idempotency decides which RPC methods may be sent more than once,
// and carries the idempotency keys that make a retried write safe.
//
// # Method policy
//
// [Lookup] resolves a full method name ("/pkg.Service/Method") to a [Policy]
// through the global protobuf registry: the standard method option
// idempotency_level (NO_SIDE_EFFECTS or IDEMPOTENT) makes a method
// repeatable, and the (stormguard.v1.method) option tunes retries and
// hedging, or marks a method with side effects that the server deduplicates
// (retry_with_key). A method the registry does not know, or a malformed
// name, resolves to an unmarked Policy: exactly one attempt. For protos you
// cannot annotate, a [Resolver] with overrides marks methods or whole
// services idempotent.
//
// Policies are cached per method after the first lookup; a cached lookup
// takes no lock and allocates nothing.
//
// # Idempotency keys
//
// A retry_with_key method may be retried because every attempt of one
// logical call carries the same idempotency-key metadata ([MetadataKey]):
// the caller's own ([WithKey], [CallKey]) or one the client interceptor
// generates per logical call ([NewKey]). [ValidateKey] says what a key may
// hold, and [KeyFromIncoming] reads one on the server.
//
// The server side, which runs each keyed write once and replays its
// outcome to retries, is package [github.com/stormguard/stormguard/idempotency/dedupe].
package idempotency
