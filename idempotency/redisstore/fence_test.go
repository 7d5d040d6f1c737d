package redisstore_test

import (
	"context"
	"crypto/sha256"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/idempotency/dedupe"
	"github.com/stormguard/stormguard/idempotency/redisstore"
	"github.com/stormguard/stormguard/idempotency/redisstore/internal/redistest"
)

func fp(req string) dedupe.Fingerprint {
	return dedupe.Fingerprint{Method: "/test.v1.Payments/Charge", RequestHash: sha256.Sum256([]byte(req))}
}

// TestFenceKeepsALostClaimFromANewOwner drives the stores directly, so
// that the order of events is exact: A owns a scope; Redis crashes and
// comes back empty; B's claims of the scope are refused during the fence
// (without it, B would own the scope while A's handler runs), until A
// takes its claim back; then B finds it in flight, waits, and gets A's
// record.
func TestFenceKeepsALostClaimFromANewOwner(t *testing.T) {
	srv := redistest.Start(t)
	p := prefix(t)
	cfg := func(heartbeat time.Duration) redisstore.Config {
		return redisstore.Config{Client: client(t, srv.Addr), Prefix: p, Fence: 2 * time.Second,
			Heartbeat: heartbeat, PollInterval: 20 * time.Millisecond}
	}
	a := primed(t, cfg(time.Hour)) // A's heartbeat never ticks in this test
	b := primed(t, cfg(time.Hour))
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	sc := dedupe.Scope{Identity: "alice", Key: "order-1"}
	owner, err := a.Claim(ctx, sc, fp("req"))
	require.NoError(t, err)
	require.Equal(t, dedupe.Owned, owner.State)

	srv.Kill()
	srv.Restart(t)

	for i := range 2 {
		_, err := b.Claim(ctx, sc, fp("req"))
		require.Equal(t, codes.Unavailable, status.Code(err), "claim %d during the fence: %v", i, err)
		time.Sleep(50 * time.Millisecond) // the second claim comes after a 1 ms fence would have ended
	}
	// A learns of the loss from any answer of Redis (here a claim of
	// another scope, fenced too), and takes its claim back.
	_, err = a.Claim(ctx, dedupe.Scope{Identity: "alice", Key: "other"}, fp("other"))
	require.Equal(t, codes.Unavailable, status.Code(err))
	eventually(t, "A takes its claim back", func() bool {
		st, err := a.Stats(ctx)
		return err == nil && st.Retaken == 1
	})
	dup, err := b.Claim(ctx, sc, fp("req"))
	require.NoError(t, err)
	require.Equal(t, dedupe.InFlight, dup.State, "the scope is A's again")
	got := make(chan *dedupe.Record, 1)
	go func() {
		rec, err := b.Wait(ctx, dup)
		assert.NoError(t, err)
		got <- rec
	}()
	rec := &dedupe.Record{Fingerprint: fp("req"), Response: []byte("charged")}
	require.NoError(t, a.Complete(ctx, owner, rec))
	r := <-got
	require.NotNil(t, r)
	assert.Equal(t, "charged", string(r.Response))
}

// TestCompleteOfALostClaimKeepsTheRecord: A's claim is lost with Redis's
// data and A completes before its heartbeat took it back: the record is
// stored all the same (the lease had not ended), and a retry replays it.
func TestCompleteOfALostClaimKeepsTheRecord(t *testing.T) {
	srv := redistest.Start(t)
	p := prefix(t)
	a := primed(t, redisstore.Config{Client: client(t, srv.Addr), Prefix: p, Heartbeat: time.Hour})
	b := primed(t, redisstore.Config{Client: client(t, srv.Addr), Prefix: p, Heartbeat: time.Hour})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	sc := dedupe.Scope{Identity: "alice", Key: "order-2"}
	owner, err := a.Claim(ctx, sc, fp("req"))
	require.NoError(t, err)
	require.Equal(t, dedupe.Owned, owner.State)

	srv.Kill()
	srv.Restart(t)

	require.NoError(t, a.Complete(ctx, owner, &dedupe.Record{Fingerprint: fp("req"), Response: []byte("charged")}))
	c, err := b.Claim(ctx, sc, fp("req"))
	require.NoError(t, err, "a scope with a record answers during the fence")
	require.Equal(t, dedupe.Done, c.State)
	assert.Equal(t, "charged", string(c.Record.Response))
}
