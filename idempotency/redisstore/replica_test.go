package redisstore_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/dedupe"
	"github.com/stormguard/stormguard/idempotency/redisstore"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

const chargeMethod = echov1.EchoService_Charge_FullMethodName

// replica is one server process of a service: its own grpc.Server, its
// own Store and Redis connection, sharing Redis and the ledger (the
// origin) with the other replicas.
type replica struct {
	name   string
	store  *redisstore.Store
	dedupe *dedupe.Server
	addr   string
	// charges counts the Charge attempts that reached it.
	charges atomic.Int64
}

// fleet is replicas behind one round_robin client.
type fleet struct {
	o        *origin.Origin
	replicas []*replica
	client   echov1.EchoServiceClient
	// served is the name of the replica that served the last call.
	served atomic.Value
}

// startFleet starts n replicas of o on 127.0.0.1, each with a Store built
// by storeConfig, the suite's server interceptors, and outer[i] (if any)
// outermost on replica i; and one client with the suite's interceptors
// over a round_robin ClientConn on all of them.
func startFleet(t *testing.T, o *origin.Origin, n int, storeConfig func(i int) redisstore.Config, outer map[int]grpc.UnaryServerInterceptor) *fleet {
	t.Helper()
	f := &fleet{o: o}
	r := manual.NewBuilderWithScheme("replicas")
	var addrs []resolver.Address
	for i := range n {
		rp := &replica{name: string(rune('A' + i))}
		rp.store = primed(t, storeConfig(i))
		rp.dedupe = dedupe.NewServer(dedupe.Config{Store: rp.store})
		count := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			f.served.Store(rp.name)
			if info.FullMethod == chargeMethod {
				rp.charges.Add(1)
			}
			return h(ctx, req)
		}
		chain := []grpc.UnaryServerInterceptor{count}
		if in, ok := outer[i]; ok {
			chain = append(chain, in)
		}
		guard := interceptor.NewServer(interceptor.WithDedupe(rp.dedupe))
		chain = append(chain, guard.Unary())
		l, err := origin.TCP()
		require.NoError(t, err)
		srv := origin.Serve(l, o, grpc.ChainUnaryInterceptor(chain...))
		t.Cleanup(srv.Stop)
		rp.addr = l.Target
		addrs = append(addrs, resolver.Address{Addr: l.Target})
		f.replicas = append(f.replicas, rp)
	}
	r.InitialState(resolver.State{Addresses: addrs})
	guard := interceptor.NewClient(interceptor.WithBudget(nil), interceptor.WithRetryPolicy(interceptor.RetryPolicy{BackoffBase: time.Millisecond, BackoffMax: 5 * time.Millisecond}))
	cc, err := grpc.NewClient(r.Scheme()+":///payments",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithResolvers(r),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`),
		grpc.WithChainUnaryInterceptor(guard.Unary()),
		grpc.WithDisableRetry())
	require.NoError(t, err)
	t.Cleanup(func() { _ = cc.Close() })
	f.client = echov1.NewEchoServiceClient(cc)
	return f
}

// nextOn makes reads until every replica has served one and the last was
// served by the replica before name, so that round_robin sends the next
// call to name.
func (f *fleet) nextOn(t *testing.T, name string) {
	t.Helper()
	before := f.replicas[len(f.replicas)-1].name
	for i, rp := range f.replicas {
		if rp.name == name && i > 0 {
			before = f.replicas[i-1].name
		}
	}
	seen := map[string]bool{}
	for range 100 {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		_, err := f.client.Get(ctx, &echov1.GetRequest{RequestId: "warm-up"})
		cancel()
		require.NoError(t, err)
		last := f.served.Load().(string)
		seen[last] = true
		if len(seen) == len(f.replicas) && last == before {
			return
		}
	}
	t.Fatalf("round_robin did not reach every replica in 100 calls: %v", seen)
}

// as returns ctx with the caller's credentials: the identity keys are
// scoped by.
func as(ctx context.Context, who string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer token-of-"+who)
}

// loseFirstCharge plays a network that loses the first Charge response on
// its way back, after the handler ran (and the dedupe interceptor stored
// its outcome): installed outermost on a replica, it answers UNAVAILABLE
// instead of the success, as a connection reset after the handler would.
type loseFirstCharge struct {
	mu      sync.Mutex
	lost    proto.Message
	charges int
}

func (l *loseFirstCharge) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	resp, err := h(ctx, req)
	if info.FullMethod != chargeMethod {
		return resp, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.charges++
	if l.charges == 1 && err == nil {
		l.lost = resp.(proto.Message)
		return nil, status.Error(codes.Unavailable, "test: the response was lost on its way back")
	}
	return resp, err
}

func sharedConfig(t *testing.T) func(int) redisstore.Config {
	p := prefix(t)
	return func(int) redisstore.Config {
		return redisstore.Config{Client: client(t, sharedAddr(t)), Prefix: p}
	}
}

// TestReplicaLostResponseRetriedOnOtherReplicaRunsOnce: a Charge runs on
// replica A, its response is lost, and the client's retry goes to replica
// B (round_robin). B finds A's record in Redis: the account is charged
// once, and the caller gets A's response.
func TestReplicaLostResponseRetriedOnOtherReplicaRunsOnce(t *testing.T) {
	o := origin.New(nil)
	lost := &loseFirstCharge{}
	f := startFleet(t, o, 2, sharedConfig(t), map[int]grpc.UnaryServerInterceptor{0: lost.intercept})
	a, b := f.replicas[0], f.replicas[1]
	f.nextOn(t, "A")

	ctx, cancel := context.WithTimeout(as(t.Context(), "alice"), 10*time.Second)
	defer cancel()
	resp, err := f.client.Charge(ctx, &echov1.ChargeRequest{RequestId: "order-1", Account: "acct-1", AmountCents: 4999})
	require.NoError(t, err, "the retry on B succeeds")

	cents, charges := o.Balance("acct-1")
	assert.Equal(t, 1, charges, "charged once across both replicas")
	assert.Equal(t, int64(4999), cents)
	assert.Equal(t, int64(1), a.charges.Load(), "the first attempt reached A")
	assert.Equal(t, int64(1), b.charges.Load(), "the retry reached B")
	lost.mu.Lock()
	defer lost.mu.Unlock()
	require.NotNil(t, lost.lost, "A's response was lost")
	assert.True(t, proto.Equal(lost.lost, resp), "the caller gets A's response: got %v, A's was %v", resp, lost.lost)
	assert.Equal(t, dedupe.Stats{Misses: 1}, a.dedupe.Stats(), "A ran the handler")
	assert.Equal(t, dedupe.Stats{Hits: 1}, b.dedupe.Stats(), "B replayed A's outcome")
}

// TestReplicasRunConcurrentDuplicatesOnce: 100 concurrent duplicates of
// one Charge spread over two replicas run the handler once (the others
// wait for it across processes and get its response); the key reused with
// another payload is refused with InvalidArgument on both replicas; the
// same key from another caller is that caller's own call.
func TestReplicasRunConcurrentDuplicatesOnce(t *testing.T) {
	o := origin.New(func(c origin.Call) origin.Reply {
		if c.Method == chargeMethod {
			return origin.Reply{Delay: 200 * time.Millisecond} // the duplicates arrive while it runs
		}
		return origin.Reply{}
	})
	f := startFleet(t, o, 2, sharedConfig(t), nil)
	f.nextOn(t, "A")
	req := &echov1.ChargeRequest{RequestId: "order-7", Account: "acct-7", AmountCents: 1250}
	const n = 100
	resps := make([]*echov1.ChargeResponse, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(as(t.Context(), "alice"), 20*time.Second)
			defer cancel()
			resps[i], errs[i] = f.client.Charge(ctx, req, idempotency.CallKey("order-7"))
		})
	}
	wg.Wait()
	for i := range n {
		require.NoError(t, errs[i], "call %d", i)
		assert.True(t, proto.Equal(resps[0], resps[i]), "call %d got %v, call 0 got %v", i, resps[i], resps[0])
	}
	cents, charges := o.Balance("acct-7")
	assert.Equal(t, 1, charges, "100 duplicates over two replicas charge once")
	assert.Equal(t, int64(1250), cents)
	for _, rp := range f.replicas {
		assert.Positive(t, rp.charges.Load(), "replica %s served some of the duplicates", rp.name)
	}
	var misses, hits, waits uint64
	for _, rp := range f.replicas {
		st := rp.dedupe.Stats()
		misses, hits, waits = misses+st.Misses, hits+st.Hits, waits+st.Waits
	}
	assert.Equal(t, uint64(1), misses)
	assert.Equal(t, uint64(n-1), hits)
	assert.Positive(t, waits, "duplicates waited for the first execution")

	// The key reused with another payload, on each replica in turn.
	other := &echov1.ChargeRequest{RequestId: "order-7", Account: "acct-7", AmountCents: 99999}
	for i := range 2 {
		ctx, cancel := context.WithTimeout(as(t.Context(), "alice"), 5*time.Second)
		_, err := f.client.Charge(ctx, other, idempotency.CallKey("order-7"))
		cancel()
		assert.Equal(t, codes.InvalidArgument, status.Code(err), "reuse %d: %v", i, err)
	}

	// Another caller's same key and request: its own call.
	ctx, cancel := context.WithTimeout(as(t.Context(), "bob"), 5*time.Second)
	defer cancel()
	bobs, err := f.client.Charge(ctx, req, idempotency.CallKey("order-7"))
	require.NoError(t, err)
	assert.NotEqual(t, resps[0].GetChargeId(), bobs.GetChargeId(), "bob gets his own charge, not alice's")
	cents, charges = o.Balance("acct-7")
	assert.Equal(t, 2, charges, "alice's charge and bob's")
	assert.Equal(t, int64(2500), cents)
}

// TestReplicaClocksDecideNothing: replicas' clocks disagree; the store's
// decisions between them (the fence, lease ends) do not. Without a fence
// (Fence: -1), replica B, whose clock is 50 ms behind A's, owns the
// scopes it claims after A made the store's state; replica C, whose clock
// is 10 s ahead, finds A's claim of a request with a 1 s deadline in
// flight (its lease is the deadline plus LeaseMargin), rather than ended.
func TestReplicaClocksDecideNothing(t *testing.T) {
	p := prefix(t)
	at := func(skew time.Duration) *redisstore.Store {
		return newStore(t, redisstore.WithClock(redisstore.Config{Client: client(t, sharedAddr(t)), Prefix: p, Fence: -1},
			func() time.Time { return time.Now().Add(skew) }))
	}
	a, b, c := at(0), at(-50*time.Millisecond), at(10*time.Second)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()

	first, err := a.Claim(ctx, dedupe.Scope{Identity: "alice", Key: "order-a"}, fp("a"))
	require.NoError(t, err, "A makes the store's state, without a fence")
	require.Equal(t, dedupe.Owned, first.State)
	for i := range 3 {
		key := fmt.Sprint("order-b", i)
		cl, err := b.Claim(ctx, dedupe.Scope{Identity: "alice", Key: key}, fp(key))
		require.NoError(t, err, "B's claim %d, its clock 50 ms behind A's", i)
		assert.Equal(t, dedupe.Owned, cl.State)
		require.NoError(t, b.Release(ctx, cl))
	}

	short, cancelShort := context.WithTimeout(ctx, time.Second)
	defer cancelShort()
	owner, err := a.Claim(short, dedupe.Scope{Identity: "alice", Key: "order-c"}, fp("c"))
	require.NoError(t, err)
	require.Equal(t, dedupe.Owned, owner.State)
	dup, err := c.Claim(ctx, dedupe.Scope{Identity: "alice", Key: "order-c"}, fp("c"))
	require.NoError(t, err)
	assert.Equal(t, dedupe.InFlight, dup.State, "C, its clock 10 s ahead, finds A's claim in flight: its lease has not ended")
	require.NoError(t, a.Complete(ctx, owner, &dedupe.Record{Fingerprint: fp("c"), Response: []byte("A's")}))
	require.NoError(t, a.Complete(ctx, first, &dedupe.Record{Fingerprint: fp("a")}))
}
