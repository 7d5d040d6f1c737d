package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/redisstore"
	"github.com/stormguard/stormguard/idempotency/redisstore/internal/redistest"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// rawClient dials addr without stormguard's interceptors and without
// grpc's retries, so that each call is one attempt whose status and
// trailer the test sees.
func rawClient(t *testing.T, addr string) echov1.EchoServiceClient {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithDisableRetry())
	require.NoError(t, err)
	t.Cleanup(func() { _ = cc.Close() })
	return echov1.NewEchoServiceClient(cc)
}

// keyedCharge makes one keyed Charge as alice and returns its status and
// trailer.
func keyedCharge(t *testing.T, c echov1.EchoServiceClient, key string, timeout time.Duration) (*status.Status, metadata.MD) {
	t.Helper()
	ctx, cancel := context.WithTimeout(as(t.Context(), "alice"), timeout)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, idempotency.MetadataKey, key) // no interceptor to send it
	var tr metadata.MD
	_, err := c.Charge(ctx, &echov1.ChargeRequest{RequestId: key, Account: "acct-" + key, AmountCents: 100}, grpc.Trailer(&tr))
	return status.Convert(err), tr
}

// TestRedisSlowFailsClosedAndTheBreakerOpens: Redis stops answering (the
// process is paused: connections stay open, commands hang). Each keyed
// Charge fails within the store's OpTimeout with Unavailable and
// grpc-retry-pushback-ms, and the handler never runs; after five such
// failures the breaker opens and calls are refused without a round trip
// to Redis; once Redis answers again, a probe closes the breaker and the
// Charge runs. (The paused Redis executes the claims it had received when
// it resumes: their replies were lost, so the store releases them, rather
// than let them hold the key for nobody until their leases end in an
// hour.)
func TestRedisSlowFailsClosedAndTheBreakerOpens(t *testing.T) {
	srv := redistest.Start(t)
	o := origin.New(nil)
	f := startFleet(t, o, 1, func(int) redisstore.Config {
		return redisstore.Config{Client: client(t, srv.Addr), Prefix: prefix(t), OpTimeout: 100 * time.Millisecond,
			Breaker: breaker.Config{ConsecutiveFailures: 5, OpenTimeout: 200 * time.Millisecond}}
	}, nil)
	store := f.replicas[0].store
	c := rawClient(t, f.replicas[0].addr)

	srv.Pause(t)
	for i := range 5 {
		// A long deadline: a claim Redis applied but whose reply was
		// lost would hold the key for as long.
		st, tr := keyedCharge(t, c, "order-slow", time.Hour)
		assert.Equal(t, codes.Unavailable, st.Code(), "call %d: %v", i, st)
		assert.Equal(t, []string{"1000"}, tr.Get("grpc-retry-pushback-ms"), "call %d", i)
		assert.NotContains(t, st.Message(), "circuit", "call %d went to Redis", i)
	}
	assert.Equal(t, breaker.StateOpen, store.BreakerStats().State)
	rejected := store.BreakerStats().Rejected
	st, tr := keyedCharge(t, c, "order-slow", 2*time.Second)
	assert.Equal(t, codes.Unavailable, st.Code())
	assert.Contains(t, st.Message(), "circuit is open", "refused by the breaker, without a round trip")
	assert.Equal(t, []string{"1000"}, tr.Get("grpc-retry-pushback-ms"))
	assert.Greater(t, store.BreakerStats().Rejected, rejected)
	assert.Zero(t, o.Count(chargeMethod), "the handler never ran unguarded")

	srv.Resume(t)
	eventually(t, "the Charge runs once Redis answers", func() bool {
		st, _ := keyedCharge(t, c, "order-slow", 2*time.Second)
		return st.Code() == codes.OK
	})
	assert.Equal(t, breaker.StateClosed, store.BreakerStats().State)
	_, charges := o.Balance("acct-order-slow")
	assert.Equal(t, 1, charges)
}

// TestRedisDownFailsClosed: with Redis gone (connections refused), keyed
// Charges fail with Unavailable and a pushback, and the handler does not
// run; unkeyed calls of other methods still work. When Redis comes back
// (empty), the first-use fence passes and the Charge runs once.
func TestRedisDownFailsClosed(t *testing.T) {
	srv := redistest.Start(t)
	o := origin.New(nil)
	f := startFleet(t, o, 1, func(int) redisstore.Config {
		return redisstore.Config{Client: client(t, srv.Addr), Prefix: prefix(t), OpTimeout: 200 * time.Millisecond,
			Fence: 300 * time.Millisecond}
	}, nil)
	c := rawClient(t, f.replicas[0].addr)
	srv.Kill()
	for i := range 3 {
		st, tr := keyedCharge(t, c, "order-down", 2*time.Second)
		assert.Equal(t, codes.Unavailable, st.Code(), "call %d: %v", i, st)
		assert.Equal(t, []string{"1000"}, tr.Get("grpc-retry-pushback-ms"))
	}
	_, err := c.Get(t.Context(), &echov1.GetRequest{RequestId: "read"})
	assert.NoError(t, err, "requests that are not deduplicated do not need Redis")
	assert.Zero(t, o.Count(chargeMethod), "the handler never ran unguarded")

	srv.Restart(t)
	eventually(t, "the Charge runs once Redis is back", func() bool {
		st, _ := keyedCharge(t, c, "order-down", 2*time.Second)
		return st.Code() == codes.OK
	})
	_, charges := o.Balance("acct-order-down")
	assert.Equal(t, 1, charges)
}
