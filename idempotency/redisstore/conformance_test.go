package redisstore_test

import (
	"testing"

	"github.com/stormguard/stormguard/idempotency/dedupe"
	"github.com/stormguard/stormguard/idempotency/redisstore"
	"github.com/stormguard/stormguard/internal/storetest"
)

// TestConformance runs the dedupe.Store conformance suite against a Store
// on a real redis-server, with the suite's clock as the replica's and in
// place of Redis's.
func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, c storetest.Config) dedupe.Store {
		return primed(t, redisstore.WithRedisClock(redisstore.Config{
			Client: client(t, sharedAddr(t)), Prefix: prefix(t),
			MaxEntries: c.MaxEntries, MaxEntriesPerIdentity: c.MaxEntriesPerIdentity,
			MaxBytes: c.MaxBytes, MaxBytesPerIdentity: c.MaxBytesPerIdentity,
			TTL: c.TTL, RetryHorizon: c.RetryHorizon, Now: c.Now,
		}, c.Now))
	})
}
