package dedupe_test

import (
	"testing"

	"github.com/stormguard/stormguard/idempotency/dedupe"
	"github.com/stormguard/stormguard/internal/storetest"
)

func TestMemoryStoreConformance(t *testing.T) {
	storetest.Run(t, func(_ *testing.T, c storetest.Config) dedupe.Store {
		return dedupe.NewMemoryStore(dedupe.MemoryConfig{
			MaxEntries: c.MaxEntries, MaxEntriesPerIdentity: c.MaxEntriesPerIdentity,
			MaxBytes: c.MaxBytes, MaxBytesPerIdentity: c.MaxBytesPerIdentity,
			TTL: c.TTL, RetryHorizon: c.RetryHorizon,
		})
	})
}
