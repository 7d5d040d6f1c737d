package redisstore_test

import (
	"testing"
	"time"

	"github.com/stormguard/stormguard/idempotency/dedupe"
	"github.com/stormguard/stormguard/idempotency/redisstore"
	"github.com/stormguard/stormguard/internal/storetest"
)

// TestConformance runs the dedupe.Store conformance suite against a Store
// on a real redis-server (a network: not in a synctest bubble), with the
// suite's clock as the replica's and in place of Redis's.
func TestConformance(t *testing.T) {
	storetest.RunOnClock(t, func(t *testing.T, c storetest.Config, now func() time.Time) dedupe.Store {
		return primed(t, redisstore.WithRedisClock(redisstore.WithClock(redisstore.Config{
			Client: client(t, sharedAddr(t)), Prefix: prefix(t),
			MaxEntries: c.MaxEntries, MaxEntriesPerIdentity: c.MaxEntriesPerIdentity,
			MaxBytes: c.MaxBytes, MaxBytesPerIdentity: c.MaxBytesPerIdentity,
			TTL: c.TTL, RetryHorizon: c.RetryHorizon,
		}, now), now))
	})
}
