package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stormguard/stormguard/idempotency/dedupe"
	"github.com/stormguard/stormguard/idempotency/redisstore"
)

// TestLeaseEndsWhenTheOwnerDies: replica A claims a scope for a request
// with a 30 s deadline and dies without finishing. Until the deadline plus
// LeaseMargin, replica B finds the scope in flight; then B's waiter is
// told the lease ended (nil, nil), B's claim owns the scope, and A's late
// Complete fails. The test moves the clock, the replicas' and Redis's.
func TestLeaseEndsWhenTheOwnerDies(t *testing.T) {
	p := prefix(t)
	t0 := time.Now()
	clock := &skewClock{base: func() time.Time { return t0 }} // moves only when the test moves it
	cfg := redisstore.WithRedisClock(redisstore.WithClock(redisstore.Config{Client: client(t, sharedAddr(t)), Prefix: p,
		PollInterval: 10 * time.Millisecond}, clock.Now), clock.Now)
	a, b := primed(t, cfg), primed(t, cfg)
	sc := dedupe.Scope{Identity: "alice", Key: "order-1"}
	deadline := clock.Now().Add(30 * time.Second)
	ctx, cancel := context.WithDeadline(t.Context(), time.Now().Add(time.Minute))
	defer cancel()
	owner, err := a.Claim(&fixedDeadline{Context: ctx, d: deadline}, sc, fp("req"))
	require.NoError(t, err)
	require.Equal(t, dedupe.Owned, owner.State)
	require.NoError(t, a.Close()) // A dies: no Complete, no Release

	clock.off.Store(int64(30*time.Second + redisstore.DefaultLeaseMargin - time.Millisecond))
	dup, err := b.Claim(ctx, sc, fp("req"))
	require.NoError(t, err)
	require.Equal(t, dedupe.InFlight, dup.State, "a millisecond before the deadline plus the margin: still A's")
	waited := make(chan error, 1)
	go func() {
		rec, err := b.Wait(ctx, dup)
		if err == nil && rec != nil {
			t.Errorf("Wait returned a record of an execution that never completed: %+v", rec)
		}
		waited <- err
	}()

	clock.off.Store(int64(30*time.Second + redisstore.DefaultLeaseMargin))
	require.NoError(t, <-waited, "the waiter is told the lease ended, and claims again")
	c, err := b.Claim(ctx, sc, fp("req"))
	require.NoError(t, err)
	assert.Equal(t, dedupe.Owned, c.State, "the lease ended: B runs it")
	assert.Error(t, a.Complete(ctx, owner, &dedupe.Record{Fingerprint: fp("req")}), "A's late Complete fails")
	require.NoError(t, b.Complete(ctx, c, &dedupe.Record{Fingerprint: fp("req"), Response: []byte("B's")}))
	st, err := b.Stats(ctx)
	require.NoError(t, err)
	assert.Equal(t, uint64(1), st.LeaseEnds)
}

// fixedDeadline is a context whose Deadline is d (on the stores' clock),
// whatever its real one.
type fixedDeadline struct {
	context.Context
	d time.Time
}

func (c *fixedDeadline) Deadline() (time.Time, bool) { return c.d, true }

// TestWaitIsWokenAcrossStores: a waiter on replica B, which would not poll
// for an hour, is woken by Redis's notification when replica A completes.
func TestWaitIsWokenAcrossStores(t *testing.T) {
	p := prefix(t)
	a := primed(t, redisstore.Config{Client: client(t, sharedAddr(t)), Prefix: p})
	b := primed(t, redisstore.Config{Client: client(t, sharedAddr(t)), Prefix: p, PollInterval: time.Hour})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	sc := dedupe.Scope{Identity: "alice", Key: "order-1"}
	owner, err := a.Claim(ctx, sc, fp("req"))
	require.NoError(t, err)
	dup, err := b.Claim(ctx, sc, fp("req"))
	require.NoError(t, err)
	require.Equal(t, dedupe.InFlight, dup.State)
	got := make(chan *dedupe.Record, 1)
	go func() {
		rec, err := b.Wait(ctx, dup)
		assert.NoError(t, err)
		got <- rec
	}()
	// Complete once B has flagged the entry (the notification goes only
	// to entries with waiters); B's first check does that.
	rc := client(t, sharedAddr(t))
	eventually(t, "B waits", func() bool {
		v, err := rc.HGet(ctx, entryKey(p, sc), "w").Result()
		return err == nil && v == "1"
	})
	require.NoError(t, a.Complete(ctx, owner, &dedupe.Record{Fingerprint: fp("req"), Response: []byte("A's")}))
	rec := <-got
	require.NotNil(t, rec, "woken before its context ended")
	assert.Equal(t, "A's", string(rec.Response))
}
