// Package redisstore is a [dedupe.Store] on Redis, so that every replica
// of a service deduplicates keyed writes in the same place: a retried
// Charge that lands on another replica replays the first replica's
// outcome instead of charging again.
//
// It is its own module, so that the stormguard library does not depend on
// a Redis client. Build a [Store] with [New] on a go-redis client (with
// ContextTimeoutEnabled), pass it as dedupe.Config.Store, and Close it
// when the server stops.
//
// The Store has dedupe.MemoryStore's semantics, as the Store contract in
// idempotency/dedupe/README.md states them, and passes the same
// conformance suite:
//
//   - Claim, Complete, Release and Wait are each one Lua script, so each
//     is atomic in Redis; keys are scoped by identity, and one identity's
//     entries never evict another's within its share.
//   - Completed records are kept for TTL, and evicted for room oldest
//     first, never younger than RetryHorizon; a record that does not fit
//     is kept as a tombstone. Each identity's records are a sorted set by
//     completion time.
//   - A claim is leased: held until its request's deadline plus
//     LeaseMargin (5 s), or for Lease (5 min) without a deadline. A claim
//     whose owner died ends then, and a duplicate runs.
//   - A waiter is woken by Redis pub/sub, and polls every PollInterval in
//     case a notification was lost.
//   - When Redis does not answer within OpTimeout, or the breaker in
//     front of it is open, Claim and Wait fail, and the dedupe server
//     refuses the request with codes.Unavailable and
//     grpc-retry-pushback-ms: the handler never runs unguarded. Complete,
//     whose handler ran, keeps trying while the claim's lease lasts, so
//     that a stall of Redis shorter than the lease never runs it again.
//   - When Redis has lost the store's data (a restart without
//     persistence, a failover to an empty replica, a flush), new claims
//     are refused for Fence (5 s, also on first use) while the owners of
//     lost claims take them back, so that no handler runs twice at once.
//
// The README in this directory explains the design, how to configure
// Redis (maxmemory, noeviction, persistence), and the measured cost.
package redisstore
