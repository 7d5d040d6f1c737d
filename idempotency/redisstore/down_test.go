package redisstore_test

import (
	"context"
	"sync"
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
	"github.com/stormguard/stormguard/idempotency/dedupe"
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

// TestRedisPausedDuringCompleteRunsOnce: Redis stalls for 1.5 s (the
// process is paused, and loses nothing) just as a Charge's handler
// returns, so the store's first tries to record the outcome time out
// (OpTimeout 200 ms). The stall is far shorter than the claim's lease (the
// call's 5 s deadline plus LeaseMargin): the outcome must be recorded. A
// retry with the same key, sent during the stall and again after each
// pushback as a client would, never runs the Charge a second time: it
// gets the first execution's outcome.
func TestRedisPausedDuringCompleteRunsOnce(t *testing.T) {
	srv := redistest.Start(t)
	stalled := make(chan struct{})
	var once sync.Once
	o := origin.New(func(c origin.Call) origin.Reply {
		if c.Method == chargeMethod {
			once.Do(func() {
				srv.PauseFor(t, 1500*time.Millisecond) // as the handler returns: during Complete
				close(stalled)
			})
		}
		return origin.Reply{}
	})
	f := startFleet(t, o, 1, func(int) redisstore.Config {
		return redisstore.Config{Client: client(t, srv.Addr), Prefix: prefix(t), OpTimeout: 200 * time.Millisecond,
			LeaseMargin: 500 * time.Millisecond}
	}, nil)
	c := rawClient(t, f.replicas[0].addr)

	first := make(chan *status.Status, 1)
	go func() {
		st, _ := keyedCharge(t, c, "order-stall", 5*time.Second)
		first <- st
	}()
	<-stalled
	// The retry, as a client makes it: again while the server answers
	// Unavailable, after the pushback it says.
	var st *status.Status
	for try := 0; ; try++ {
		var tr metadata.MD
		st, tr = keyedCharge(t, c, "order-stall", 20*time.Second)
		if st.Code() != codes.Unavailable || try == 20 {
			break
		}
		require.Equal(t, []string{"1000"}, tr.Get("grpc-retry-pushback-ms"), "refused with a pushback: %v", st)
		time.Sleep(time.Second)
	}
	require.Equal(t, codes.OK, st.Code(), "the retry: %v", st)
	require.Equal(t, codes.OK, (<-first).Code(), "the first call")
	_, charges := o.Balance("acct-order-stall")
	assert.Equal(t, 1, charges, "a completed Charge runs once, whatever Redis's stall shorter than the lease")
	assert.Equal(t, uint64(1), f.replicas[0].dedupe.Stats().Misses)
	stats, err := f.replicas[0].store.Stats(t.Context())
	require.NoError(t, err)
	assert.Zero(t, stats.LostOutcomes, "the outcome was recorded")
}

// TestCompleteGivesUpOnlyWhenTheLeaseEnds: Redis stalls for longer than a
// claim's lease (a 300 ms deadline plus a 200 ms LeaseMargin). Complete
// keeps trying until the lease ends, then says the outcome is lost, and
// Stats counts it. A Complete still trying when its Store is closed stops,
// and says so too.
func TestCompleteGivesUpOnlyWhenTheLeaseEnds(t *testing.T) {
	srv := redistest.Start(t)
	cfg := redisstore.Config{Client: client(t, srv.Addr), Prefix: prefix(t), OpTimeout: 100 * time.Millisecond,
		LeaseMargin: 200 * time.Millisecond}
	s := primed(t, cfg)
	rec := &dedupe.Record{Fingerprint: fp("req"), Response: []byte("charged")}

	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	c, err := s.Claim(ctx, dedupe.Scope{Identity: "alice", Key: "order-1"}, fp("req"))
	require.NoError(t, err)
	srv.Pause(t)
	err = s.Complete(context.Background(), c, rec)
	srv.Resume(t)
	assert.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	assert.Contains(t, err.Error(), "before the claim's lease ended: the outcome is lost")
	st, err := s.Stats(t.Context())
	require.NoError(t, err)
	assert.Equal(t, uint64(1), st.LostOutcomes)

	closing := primed(t, cfg)
	c, err = closing.Claim(t.Context(), dedupe.Scope{Identity: "alice", Key: "order-2"}, fp("req")) // a 5 min lease
	require.NoError(t, err)
	srv.Pause(t)
	done := make(chan error, 1)
	go func() { done <- closing.Complete(context.Background(), c, rec) }()
	require.NoError(t, closing.Close())
	err = <-done
	srv.Resume(t)
	assert.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	assert.Contains(t, err.Error(), "before the store was closed: the outcome is lost")
}
