// Package idempotency decides which RPC methods may be sent more than once,
// and (on the server) makes retried writes safe by deduplicating them on an
// idempotency key.
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
// hold.
//
// # Deduplication on the server
//
// [Server]'s unary interceptor runs each keyed request once: the first
// sight runs the handler and stores its outcome in a [Store] (the bounded
// [MemoryStore] by default); a duplicate that arrives while the first is
// running waits for it; later duplicates get the stored outcome; a key
// reused with another method or request is refused with InvalidArgument.
// Server-streaming methods listed in [ServerConfig].Streams are
// deduplicated the same way; other streams pass through untouched.
package idempotency
