package redisstore

import (
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/idempotency/dedupe"
)

// Defaults of Config.
const (
	// DefaultPrefix names the store's keys. The braces are a Redis Cluster
	// hash tag: every key of one store lives in one slot, as the store's
	// scripts need.
	DefaultPrefix = "{stormguard:dedupe}:"
	// DefaultLease is how long a claim made without a deadline is held
	// for its owner: well above the slowest handler.
	DefaultLease = 5 * time.Minute
	// DefaultLeaseMargin is how long past its request's deadline a claim
	// is held: time for a handler that ends at its deadline to store its
	// outcome, even through a short stall of Redis.
	DefaultLeaseMargin = 5 * time.Second
	// DefaultFence is how long the store refuses new claims after Redis
	// lost its data (and on first use): time for the owners of claims lost
	// with it to take them back.
	DefaultFence = 5 * time.Second
	// DefaultHeartbeat is how often a store with claims in flight checks
	// that Redis still holds them.
	DefaultHeartbeat = time.Second
	// DefaultPollInterval is how often a waiter checks its execution when
	// no notification came.
	DefaultPollInterval = 200 * time.Millisecond
	// DefaultBreakerConsecutiveFailures is Breaker.ConsecutiveFailures by
	// default: the breaker also opens after 10 failed operations in a row.
	DefaultBreakerConsecutiveFailures = 10
	// DefaultOpTimeout bounds each Redis operation.
	DefaultOpTimeout = 500 * time.Millisecond
)

// Config configures a Store. Client is required; every other zero field
// takes its default. The bounds, TTL and retry horizon mean what the
// fields of the same names in dedupe.MemoryConfig mean, with sizes
// counted as Redis holds them (see the README).
//
// Every lease end, completion time, TTL, retry horizon and fence is
// measured by Redis's clock (TIME), so replicas' clocks may disagree. A
// replica's own clock (time.Now) measures only the time left before a
// request's deadline (the claim's lease is that plus LeaseMargin), and how
// long the replica keeps trying to record an outcome.
type Config struct {
	// Client is the Redis connection: a *redis.Client (standalone, or
	// Sentinel's failover client) or a *redis.ClusterClient. It must have
	// ContextTimeoutEnabled set, so that OpTimeout and callers' deadlines
	// bound each command; New refuses one without it. The Store does not
	// close it.
	Client redis.UniversalClient
	// Prefix starts the name of every key the store uses; "":
	// DefaultPrefix. Stores with different prefixes share nothing. On a
	// Redis Cluster it must hold a hash tag ("{...}"), as the default
	// does, so that all the store's keys live in one slot.
	Prefix string

	// MaxEntries bounds the entries held, in flight and completed;
	// 0 (or less): dedupe.DefaultMaxEntries.
	MaxEntries int
	// MaxBytes bounds the bytes the store's entries and identities hold in
	// Redis, as the store counts them; 0 (or less): dedupe.DefaultMaxBytes.
	// Set Redis's maxmemory above it (see the README).
	MaxBytes int64
	// MaxEntriesPerIdentity bounds one identity's entries; 0 (or less): a
	// quarter of MaxEntries, at least 1. At most MaxEntries.
	MaxEntriesPerIdentity int
	// MaxBytesPerIdentity bounds one identity's bytes; 0 (or less): a
	// quarter of MaxBytes. At most MaxBytes.
	MaxBytesPerIdentity int64
	// TTL is how long a completed record is kept; 0 (or less):
	// dedupe.DefaultTTL.
	TTL time.Duration
	// RetryHorizon is how long after completion a record may not be
	// evicted for room. 0: dedupe.DefaultRetryHorizon; negative: no
	// protection.
	RetryHorizon time.Duration

	// Lease is how long a claim made without a deadline is held for its
	// owner; 0 (or less): DefaultLease. A claim with a deadline is held
	// until the deadline plus LeaseMargin.
	Lease time.Duration
	// LeaseMargin is how long past its deadline a claim is held; 0 (or
	// less): DefaultLeaseMargin.
	LeaseMargin time.Duration
	// Fence is how long new claims are refused (codes.Unavailable) after
	// the store finds its state gone from Redis; 0: DefaultFence; negative:
	// no fence (a claim lost with Redis's data may then run again while
	// its first execution runs). Keep it well above Heartbeat.
	Fence time.Duration
	// Heartbeat is how often a Store with claims in flight checks that
	// Redis still holds them, and takes back those it lost; 0 (or less):
	// DefaultHeartbeat.
	Heartbeat time.Duration
	// PollInterval is how often Wait checks the execution it waits for
	// when no notification came (they are lost while the notification
	// connection reconnects); 0 (or less): DefaultPollInterval.
	PollInterval time.Duration
	// OpTimeout bounds each Redis operation (and the caller's deadline
	// bounds it further); 0 (or less): DefaultOpTimeout.
	OpTimeout time.Duration
	// Breaker configures the circuit breaker in front of Claim and Wait:
	// once Redis has failed every operation of a window, those calls are
	// refused at once, without a Redis round trip, until a probe succeeds.
	// The zero value takes the breaker package's defaults, except
	// ConsecutiveFailures: 0 means DefaultBreakerConsecutiveFailures
	// (negative: off). Complete and Release are never refused by it: their
	// handler already ran.
	Breaker breaker.Config

	// now, set by tests only, replaces this replica's clock; nil:
	// time.Now. redisNow, set by tests only, replaces Redis's clock; nil:
	// TIME.
	now, redisNow func() time.Time
}

// withDefaults returns c with every zero (or, where the field says so,
// negative) field set to its default, and the per-identity bounds capped
// by the totals.
func (c Config) withDefaults() Config {
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if c.MaxEntries <= 0 {
		c.MaxEntries = dedupe.DefaultMaxEntries
	}
	if c.MaxBytes <= 0 {
		c.MaxBytes = dedupe.DefaultMaxBytes
	}
	if c.MaxEntriesPerIdentity <= 0 {
		c.MaxEntriesPerIdentity = max(c.MaxEntries/4, 1)
	}
	c.MaxEntriesPerIdentity = min(c.MaxEntriesPerIdentity, c.MaxEntries)
	if c.MaxBytesPerIdentity <= 0 {
		c.MaxBytesPerIdentity = c.MaxBytes / 4
	}
	c.MaxBytesPerIdentity = min(c.MaxBytesPerIdentity, c.MaxBytes)
	if c.TTL <= 0 {
		c.TTL = dedupe.DefaultTTL
	}
	if c.RetryHorizon == 0 {
		c.RetryHorizon = dedupe.DefaultRetryHorizon
	}
	if c.Lease <= 0 {
		c.Lease = DefaultLease
	}
	if c.LeaseMargin <= 0 {
		c.LeaseMargin = DefaultLeaseMargin
	}
	if c.Fence == 0 {
		c.Fence = DefaultFence
	}
	if c.Heartbeat <= 0 {
		c.Heartbeat = DefaultHeartbeat
	}
	if c.PollInterval <= 0 {
		c.PollInterval = DefaultPollInterval
	}
	if c.OpTimeout <= 0 {
		c.OpTimeout = DefaultOpTimeout
	}
	if c.now == nil {
		c.now = time.Now
	}
	if c.Breaker.ConsecutiveFailures == 0 {
		c.Breaker.ConsecutiveFailures = DefaultBreakerConsecutiveFailures
	}
	return c
}
