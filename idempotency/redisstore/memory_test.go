package redisstore_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/dedupe"
	"github.com/stormguard/stormguard/idempotency/redisstore"
	"github.com/stormguard/stormguard/idempotency/redisstore/internal/redistest"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// usedMemory returns INFO memory's used_memory.
func usedMemory(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	info, err := c.Info(t.Context(), "memory").Result()
	require.NoError(t, err)
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			require.NoError(t, err)
			return n
		}
	}
	t.Fatal("no used_memory in INFO memory")
	return 0
}

// flood claims and completes n unique keys, numbered from from, spread over ids identities from
// workers goroutines, with records like a small Charge response (one
// header, one trailer); it returns how many were refused with
// ResourceExhausted.
func flood(t *testing.T, s *redisstore.Store, from, n, ids, workers int) int64 {
	t.Helper()
	var next, refused atomic.Int64
	next.Store(int64(from))
	n += from
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				sc := dedupe.Scope{Identity: fmt.Sprintf("identity-%02d-%040d", i%int64(ids), 0), Key: fmt.Sprintf("order-%08d", i)}
				f := fp(sc.Key)
				c, err := s.Claim(context.Background(), sc, f)
				if status.Code(err) == codes.ResourceExhausted {
					refused.Add(1)
					continue
				}
				if !assert.NoError(t, err) || !assert.Equal(t, dedupe.Owned, c.State) {
					return
				}
				rec := &dedupe.Record{Fingerprint: f, Response: make([]byte, 120),
					Header: metadata.Pairs("x-session", "session-"+sc.Key), Trailer: metadata.Pairs("x-receipt", "r-"+sc.Key)}
				if !assert.NoError(t, s.Complete(context.Background(), c, rec)) {
					return
				}
			}
		})
	}
	wg.Wait()
	return refused.Load()
}

// TestMemoryBoundedUnderAFlood floods a store bounded to 4 MiB on a Redis
// with maxmemory 64 MiB (noeviction) with 17,000 unique keys of 16
// identities: the store evicts its oldest records (the retry horizon is
// off here), Redis's memory stays within the bound, and the bytes the
// store counts are within 15% of what INFO memory says the entries hold.
func TestMemoryBoundedUnderAFlood(t *testing.T) {
	srv := redistest.Start(t, "--maxmemory", "64mb", "--maxmemory-policy", "noeviction")
	rc := client(t, srv.Addr)
	const maxBytes = 4 << 20
	s := primed(t, redisstore.Config{Client: rc, Prefix: prefix(t), MaxBytes: maxBytes, RetryHorizon: -1})
	// What Redis sets up for the store's first operations (its script
	// cache, the first claim's) is not what the entries hold.
	require.NoError(t, redisstore.LoadScripts(t.Context(), rc))
	wc, err := s.Claim(t.Context(), dedupe.Scope{Identity: "warm-up", Key: "k"}, fp("warm-up"))
	require.NoError(t, err)
	require.NoError(t, s.Release(t.Context(), wc))
	base := usedMemory(t, rc)

	// Below the bound: what the store counts against what Redis holds.
	refused := flood(t, s, 0, 2000, 16, 8)
	require.Zero(t, refused)
	st, err := s.Stats(t.Context())
	require.NoError(t, err)
	used := usedMemory(t, rc) - base
	t.Logf("%d entries: counted %d B (%d B/entry), Redis holds %d B more (%d B/entry)",
		st.Entries, st.Bytes, st.Bytes/int64(st.Entries), used, used/int64(st.Entries))
	assert.InEpsilon(t, float64(used), float64(st.Bytes), 0.15, "counted %d B, Redis holds %d B", st.Bytes, used)

	// Past it.
	refused = flood(t, s, 2000, 15000, 16, 8)
	st, err = s.Stats(t.Context())
	require.NoError(t, err)
	used = usedMemory(t, rc) - base
	t.Logf("after 17,000 keys: %d entries, counted %d B, Redis holds %d B more; %d evictions, %d refused",
		st.Entries, st.Bytes, used, st.Evictions, refused)
	assert.LessOrEqual(t, st.Bytes, int64(maxBytes))
	assert.Positive(t, st.Evictions)
	assert.Less(t, used, int64(maxBytes)*23/20, "Redis holds about what the store counts, at most MaxBytes")
	info, err := rc.Info(t.Context(), "stats").Result()
	require.NoError(t, err)
	assert.Contains(t, info, "evicted_keys:0", "Redis itself evicted nothing: the store did")
}

// TestRecordsExpire: records expire at their TTL by the store's clock
// (the test's, in place of Redis's, and moved; nothing sleeps), and leave
// nothing in Redis; every
// entry also carries a Redis TTL, so that Redis drops what no claim comes
// to expire; an entry Redis dropped on its own is accounted for at its
// TTL.
func TestRecordsExpire(t *testing.T) {
	rc := client(t, sharedAddr(t))
	p := prefix(t)
	clock := &skewClock{base: time.Now}
	const ttl = time.Hour
	s := primed(t, redisstore.WithRedisClock(redisstore.Config{Client: rc, Prefix: p, TTL: ttl}, clock.Now))
	ctx := t.Context()
	for i := range 10 {
		sc := dedupe.Scope{Identity: "alice", Key: fmt.Sprint("k", i)}
		c, err := s.Claim(ctx, sc, fp("r"))
		require.NoError(t, err)
		if i == 0 {
			pttl, err := rc.PTTL(ctx, entryKey(p, sc)).Result()
			require.NoError(t, err)
			assert.Greater(t, pttl, redisstore.DefaultLease, "an entry in flight lives in Redis past its lease")
			assert.LessOrEqual(t, pttl, redisstore.DefaultLease+time.Minute)
		}
		require.NoError(t, s.Complete(ctx, c, &dedupe.Record{Fingerprint: fp("r"), Response: []byte("ok")}))
		pttl, err := rc.PTTL(ctx, entryKey(p, sc)).Result()
		require.NoError(t, err)
		assert.Greater(t, pttl, ttl, "a record lives in Redis past its TTL")
		assert.LessOrEqual(t, pttl, ttl+time.Minute)
	}
	st, err := s.Stats(ctx)
	require.NoError(t, err)
	assert.Equal(t, 10, st.Entries)

	// Redis drops one entry on its own (as its TTL would).
	dropped := dedupe.Scope{Identity: "alice", Key: "k3"}
	require.NoError(t, rc.Del(ctx, entryKey(p, dropped)).Err())
	c, err := s.Claim(ctx, dropped, fp("r"))
	require.NoError(t, err)
	require.Equal(t, dedupe.Owned, c.State, "gone from Redis: gone")
	require.NoError(t, s.Release(ctx, c))

	clock.off.Store(int64(ttl - time.Second))
	c, err = s.Claim(ctx, dedupe.Scope{Identity: "alice", Key: "k4"}, fp("r"))
	require.NoError(t, err)
	require.Equal(t, dedupe.Done, c.State, "a second before its TTL")

	clock.off.Store(int64(ttl))
	c, err = s.Claim(ctx, dedupe.Scope{Identity: "alice", Key: "k4"}, fp("r"))
	require.NoError(t, err)
	require.Equal(t, dedupe.Owned, c.State, "at its TTL")
	require.NoError(t, s.Release(ctx, c))
	st, err = s.Stats(ctx)
	require.NoError(t, err)
	assert.Equal(t, 0, st.Entries)
	assert.Equal(t, 0, st.Identities)
	assert.Equal(t, int64(0), st.Bytes)
	assert.Equal(t, uint64(10), st.Expirations)
	keys, err := rc.Keys(ctx, p+"*").Result()
	require.NoError(t, err)
	assert.Equal(t, []string{p + "g"}, keys, "nothing left but the store's counters")
}

// entryKey is the store's key of sc's entry (see scripts.go).
func entryKey(p string, sc dedupe.Scope) string {
	return p + "e:" + strconv.Itoa(len(sc.Identity)) + ":" + sc.Identity + sc.Key
}

// TestRedisOutOfMemoryRefusesClaims: a store whose MaxBytes is above what
// Redis may hold (maxmemory 4 MiB, noeviction) is refused new claims with
// ResourceExhausted once Redis is full, before any handler runs, while
// the claims already made still complete.
func TestRedisOutOfMemoryRefusesClaims(t *testing.T) {
	srv := redistest.Start(t, "--maxmemory", "4mb", "--maxmemory-policy", "noeviction")
	rc := client(t, srv.Addr)
	s := primed(t, redisstore.Config{Client: rc, Prefix: prefix(t), MaxBytes: 64 << 20, RetryHorizon: -1})
	refused := flood(t, s, 0, 8000, 16, 4)
	assert.Positive(t, refused, "claims refused once Redis was full")
	_, err := s.Claim(t.Context(), dedupe.Scope{Identity: "alice", Key: "one-more"}, fp("one-more"))
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	assert.Contains(t, err.Error(), "out of memory")
	st, err := s.Stats(t.Context())
	require.NoError(t, err)
	assert.Zero(t, st.InFlight, "every claim that was made completed")
	t.Logf("%d claims refused; %d entries held; used_memory %d", refused, st.Entries, usedMemory(t, rc))
}

// TestStatsCountRefusalsOnly: Busy and OverQuota count claims the store
// refused, and nothing else, as dedupe.MemoryStats says. Three callers
// make 60 keyed Charges whose 60 KiB receipts soon fill each caller's
// share (100 KiB) and the store (180 KiB) with records younger than the
// retry horizon: every call is answered OK (a claim always finds room; a
// record that does not fit is kept as a tombstone), so nothing was
// refused, and only Oversized counts the tombstones.
func TestStatsCountRefusalsOnly(t *testing.T) {
	receipt := strings.Repeat("r", 60<<10)
	o := origin.New(func(origin.Call) origin.Reply { return origin.Reply{Trailer: metadata.Pairs("x-receipt", receipt)} })
	p := prefix(t)
	f := startFleet(t, o, 1, func(int) redisstore.Config {
		return redisstore.Config{Client: client(t, sharedAddr(t)), Prefix: p, MaxBytes: 180 << 10, MaxBytesPerIdentity: 100 << 10}
	}, nil)
	for i := range 60 {
		ctx, cancel := context.WithTimeout(as(t.Context(), "caller-"+strconv.Itoa(i%3)), 10*time.Second)
		key := "order-" + strconv.Itoa(i)
		_, err := f.client.Charge(ctx, &echov1.ChargeRequest{RequestId: key, Account: "acct", AmountCents: 1}, idempotency.CallKey(key))
		cancel()
		require.NoError(t, err, "call %d", i)
	}
	st, err := f.replicas[0].store.Stats(t.Context())
	require.NoError(t, err)
	t.Logf("%+v", st)
	require.Equal(t, uint64(60), f.replicas[0].dedupe.Stats().Misses, "every call ran once")
	require.Positive(t, st.Oversized, "records were kept as tombstones")
	assert.Equal(t, 60, st.Entries, "every key kept")
	assert.Zero(t, st.Busy, "no claim was refused for the store's bounds")
	assert.Zero(t, st.OverQuota, "no claim was refused for a caller's share")

	// A claim refused counts: another caller's claims in flight fill
	// what room is left.
	store := f.replicas[0].store
	refused := 0
	for i := 0; refused == 0 && i < 1000; i++ {
		_, err := store.Claim(t.Context(), dedupe.Scope{Identity: "dave", Key: strconv.Itoa(i)}, fp("r"))
		if err != nil {
			require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
			refused++
		}
	}
	require.Equal(t, 1, refused, "the store filled up")
	st, err = store.Stats(t.Context())
	require.NoError(t, err)
	assert.Equal(t, uint64(1), st.Busy, "the refused claim")
	assert.Zero(t, st.OverQuota)
}
