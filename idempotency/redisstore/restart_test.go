package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/redisstore"
	"github.com/stormguard/stormguard/idempotency/redisstore/internal/redistest"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// gatedCharges is an origin whose first Charge blocks until open is
// closed, and says when it started on arrived.
func gatedCharges() (o *origin.Origin, arrived, open chan struct{}) {
	arrived, open = make(chan struct{}), make(chan struct{})
	o = origin.New(func(c origin.Call) origin.Reply {
		if c.Method == chargeMethod && c.Attempt == 1 {
			close(arrived)
			<-open
		}
		return origin.Reply{}
	})
	return o, arrived, open
}

// eventually polls cond every 10 ms for up to 20 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting until %s", what)
}

// TestRedisRestartDoesNotRunAClaimTwice: the contract promises the owner
// of a claim its key until its deadline. Replica A runs a Charge (its
// handler blocked); Redis crashes and restarts empty (no persistence), so
// the claim is gone from Redis. A duplicate sent to replica B right away
// must not run the handler while A's still runs: B's store finds Redis
// emptied and fences new claims until A's heartbeat has taken its claim
// back. A duplicate sent after that waits for A's execution and gets its
// response; the account is charged once.
func TestRedisRestartDoesNotRunAClaimTwice(t *testing.T) {
	srv := redistest.Start(t)
	o, arrived, open := gatedCharges()
	p := prefix(t)
	f := startFleet(t, o, 2, func(int) redisstore.Config {
		return redisstore.Config{Client: client(t, srv.Addr), Prefix: p,
			Fence: 2 * time.Second, Heartbeat: 300 * time.Millisecond, PollInterval: 50 * time.Millisecond}
	}, nil)
	a := f.replicas[0]
	f.nextOn(t, "A")
	req := &echov1.ChargeRequest{RequestId: "order-9", Account: "acct-9", AmountCents: 700}

	type result struct {
		resp *echov1.ChargeResponse
		err  error
	}
	first := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(as(context.Background(), "alice"), 60*time.Second)
		defer cancel()
		resp, err := f.client.Charge(ctx, req, idempotency.CallKey("order-9"))
		first <- result{resp, err}
	}()
	<-arrived // A's handler runs, under A's claim

	srv.Kill()
	srv.Restart(t)

	// At once, a duplicate: round_robin sends it to B first.
	ctx, cancel := context.WithTimeout(as(t.Context(), "alice"), 3*time.Second)
	_, err := f.client.Charge(ctx, req, idempotency.CallKey("order-9"))
	cancel()
	assert.Error(t, err, "the duplicate cannot succeed while the first runs")
	assert.Equal(t, 1, o.Count(chargeMethod), "the handler did not run a second time while the first runs")
	if t.Failed() {
		close(open)
		<-first
		return
	}

	// A's heartbeat took its claim back.
	eventually(t, "A takes its claim back", func() bool {
		st, err := a.store.Stats(t.Context())
		return err == nil && st.Retaken >= 1
	})
	st, err := a.store.Stats(t.Context())
	require.NoError(t, err)
	assert.Positive(t, st.Fenced, "the duplicate's claim was fenced")
	waitsBefore := f.replicas[0].dedupe.Stats().Waits + f.replicas[1].dedupe.Stats().Waits
	second := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(as(context.Background(), "alice"), 60*time.Second)
		defer cancel()
		resp, err := f.client.Charge(ctx, req, idempotency.CallKey("order-9"))
		second <- result{resp, err}
	}()
	eventually(t, "the second duplicate waits", func() bool {
		return f.replicas[0].dedupe.Stats().Waits+f.replicas[1].dedupe.Stats().Waits > waitsBefore
	})
	close(open)
	r1, r2 := <-first, <-second
	require.NoError(t, r1.err)
	require.NoError(t, r2.err)
	assert.True(t, proto.Equal(r1.resp, r2.resp), "the duplicate gets the first execution's response: %v, %v", r2.resp, r1.resp)
	assert.Equal(t, 1, o.Count(chargeMethod), "the handler ran once")
	_, charges := o.Balance("acct-9")
	assert.Equal(t, 1, charges)
}

// TestRedisRestartWithPersistenceKeepsRecords: with Redis's append-only
// file (fsync always), a completed record survives a crash, and a retry
// after the restart replays it without a fence.
func TestRedisRestartWithPersistenceKeepsRecords(t *testing.T) {
	srv := redistest.Start(t, "--appendonly", "yes", "--appendfsync", "always")
	o := origin.New(nil)
	p := prefix(t)
	f := startFleet(t, o, 2, func(int) redisstore.Config {
		return redisstore.Config{Client: client(t, srv.Addr), Prefix: p}
	}, nil)
	req := &echov1.ChargeRequest{RequestId: "order-3", Account: "acct-3", AmountCents: 300}
	ctx, cancel := context.WithTimeout(as(t.Context(), "alice"), 10*time.Second)
	defer cancel()
	want, err := f.client.Charge(ctx, req, idempotency.CallKey("order-3"))
	require.NoError(t, err)
	before, err := f.replicas[0].store.Stats(ctx)
	require.NoError(t, err)

	srv.Kill()
	srv.Restart(t)

	for i := range 2 { // on both replicas
		got, err := f.client.Charge(ctx, req, idempotency.CallKey("order-3"))
		require.NoError(t, err, "retry %d", i)
		assert.True(t, proto.Equal(want, got), "retry %d replays the record: %v, want %v", i, got, want)
	}
	_, charges := o.Balance("acct-3")
	assert.Equal(t, 1, charges)
	st, err := f.replicas[0].store.Stats(ctx)
	require.NoError(t, err)
	assert.Equal(t, before.Fenced, st.Fenced, "no data was lost: no fence")
	assert.Zero(t, st.Retaken)
}
