package interceptor_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/test/bufconn"

	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
	"github.com/stormguard/stormguard/semconv"
)

// backends serves one origin per script on 127.0.0.1 and returns them and a
// round_robin ClientConn over all of them (the user's own load balancing),
// through opts.
func backends(t *testing.T, scripts []origin.Script, opts ...grpc.DialOption) ([]*origin.Origin, *grpc.ClientConn) {
	t.Helper()
	r := manual.NewBuilderWithScheme("sg")
	var addrs []resolver.Address
	var origins []*origin.Origin
	for _, s := range scripts {
		o := origin.New(s)
		l, err := origin.TCP()
		require.NoError(t, err)
		srv := origin.Serve(l, o)
		t.Cleanup(srv.Stop)
		origins = append(origins, o)
		addrs = append(addrs, resolver.Address{Addr: l.Target})
	}
	r.InitialState(resolver.State{Addresses: addrs})
	cc, err := grpc.NewClient(r.Scheme()+":///backends", append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithResolvers(r),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`),
	}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { cc.Close() })
	return origins, cc
}

// workload makes calls Puts from workers goroutines, each with a 2 s
// deadline, and returns how many succeeded.
func workload(t *testing.T, c echov1.EchoServiceClient, calls, workers int) int {
	var next, ok atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(calls) {
					return
				}
				ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
				_, err := c.Put(ctx, &echov1.PutRequest{RequestId: fmt.Sprint(i)})
				cancel()
				if err == nil {
					ok.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return int(ok.Load())
}

// One of two (and one of three) backends behind the user's round_robin answers
// UNAVAILABLE to everything. With no retries, 50% (67%) of calls succeed; the
// per-target breaker of the old defaults took that to 0.7%. With the
// interceptors alone, a retry after a failure on the bad endpoint fails over:
// it goes to another endpoint (picks of the bad one are refused before
// anything is sent) and is not charged to the budget. At least 97% succeed,
// and the bad backend gets at most 1.10x the requests it gets without retries.
func TestOneBackendDeadInterceptorsAlone(t *testing.T) {
	for _, n := range []int{2, 3} {
		t.Run(fmt.Sprintf("1 of %d", n), func(t *testing.T) {
			const calls, workers = 1000, 8
			scripts := []origin.Script{origin.Always(codes.Unavailable)}
			for range n - 1 {
				scripts = append(scripts, origin.Succeed())
			}
			// Without retries: the dead backend's share of the first attempts.
			bare, cc := backends(t, scripts)
			okBare := workload(t, echov1.NewEchoServiceClient(cc), calls, workers)
			deadBare := bare[0].Total()

			reg := budget.NewRegistry(budget.Config{})
			guard := interceptor.NewClient(append(noopProviders(), fast, interceptor.WithBudget(reg))...)
			suite, cc := backends(t, scripts, guard.DialOptions()...)
			ok := workload(t, echov1.NewEchoServiceClient(cc), calls, workers)
			dead := suite[0].Total()
			total, marked := 0, 0
			for _, o := range suite {
				total += o.Total()
				for _, c := range o.Calls() {
					if len(c.Metadata.Get(semconv.BudgetedKey)) > 0 {
						marked++
					}
				}
			}
			var granted uint64
			reg.Range(func(_ string, b *budget.Budget) bool { granted += b.Stats().Granted; return true })
			t.Logf("no retries: %d/%d ok, dead backend %d; suite: %d/%d ok, dead backend %d (%.2fx), load %.2fx; %d retries marked paid, %d paid",
				okBare, calls, deadBare, ok, calls, dead, float64(dead)/float64(deadBare), float64(total)/calls, marked, granted)
			assert.GreaterOrEqual(t, ok, calls*97/100)
			assert.LessOrEqual(t, float64(dead), 1.10*float64(deadBare))
			assert.LessOrEqual(t, uint64(marked), granted, "a fail-over the budget did not pay for is not marked paid")
		})
	}
}

// With failures spread evenly over the endpoints, no endpoint stands out,
// and the budget pays for the retries. It grants its ratio of the calls
// and what it is owed at the end, at most max(Burst, Ratio × the last
// second's calls): a client at about 1,000 calls a second may borrow more
// than Burst (see budget's doc). A few retries may still be fail-overs,
// while the outcomes so far happen to make one endpoint look worse than
// the other (0 to 7 of 1,000 calls in the runs measured): at most 1% of
// calls.
func TestEvenFailuresAreNotFailedOver(t *testing.T) {
	half := func(c origin.Call) origin.Reply {
		var n int
		fmt.Sscan(c.RequestID, &n)
		if (n*7+c.Attempt*13)%2 == 0 {
			return origin.Reply{Code: codes.Unavailable}
		}
		return origin.Reply{}
	}
	const calls = 1000
	reg := budget.NewRegistry(budget.Config{})
	guard := interceptor.NewClient(append(noopProviders(), fast, interceptor.WithBudget(reg))...)
	suite, cc := backends(t, []origin.Script{half, half}, guard.DialOptions()...)
	workload(t, echov1.NewEchoServiceClient(cc), calls, 8)
	total := suite[0].Total() + suite[1].Total()
	var st budget.Stats
	reg.Range(func(_ string, b *budget.Budget) bool { st = b.Stats(); return false })
	retries, owed := total-calls, max(0, -st.Credit)
	t.Logf("load %.3fx; budget %+v", float64(total)/calls, st)
	require.EqualValues(t, calls, st.Requests)
	failovers := max(0, int64(retries)-int64(st.Granted))
	assert.LessOrEqual(t, failovers, int64(calls/100), "retries not paid for: fail-overs")
	assert.LessOrEqual(t, float64(st.Granted), 0.1*calls+owed+1e-9, "the budget's ratio, and what it lent")
	assert.LessOrEqual(t, owed, max(budget.DefaultBurst, 0.1*calls), "within its loan limit")
	assert.Greater(t, retries, calls/20, "retries were sent")
}

// WithoutFailover turns fail-over off: a retry after a failure on the dead
// endpoint is paid by the budget, which then bounds the rescue.
func TestWithoutFailover(t *testing.T) {
	const calls = 400
	scripts := []origin.Script{origin.Always(codes.Unavailable), origin.Succeed()}
	guard := interceptor.NewClient(append(noopProviders(), fast, interceptor.WithoutFailover())...)
	_, cc := backends(t, scripts, guard.DialOptions()...)
	ok := workload(t, echov1.NewEchoServiceClient(cc), calls, 8)
	assert.Less(t, ok, calls*70/100, "without fail-over the budget bounds the rescue")
}

// bufconnBackends serves one origin per script over bufconn, so that they
// can run in a synctest bubble, and returns them, their addresses for a
// resolver, and the dial option that reaches those addresses. Each
// backend's connections report their address as the peer's, as TCP
// connections to different backends would (bufconn's are all "bufconn"):
// the Client tells endpoints apart by it.
func bufconnBackends(t *testing.T, scripts []origin.Script) ([]*origin.Origin, []resolver.Address, grpc.DialOption) {
	t.Helper()
	var origins []*origin.Origin
	var addrs []resolver.Address
	listeners := map[string]*bufconn.Listener{}
	for i, s := range scripts {
		o := origin.New(s)
		l := origin.Bufconn()
		srv := origin.Serve(l, o)
		t.Cleanup(srv.Stop)
		addr := fmt.Sprint("backend-", i)
		listeners[addr] = l.Listener.(*bufconn.Listener)
		origins = append(origins, o)
		addrs = append(addrs, resolver.Address{Addr: addr})
	}
	return origins, addrs, grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		c, err := listeners[addr].DialContext(ctx)
		if err != nil {
			return nil, err
		}
		return peerConn{c, backendAddr(addr)}, nil
	})
}

// peerConn is a connection whose remote address is peer.
type peerConn struct {
	net.Conn
	peer net.Addr
}

func (c peerConn) RemoteAddr() net.Addr { return c.peer }

// backendAddr is the address of one of bufconnBackends' backends.
type backendAddr string

func (a backendAddr) Network() string { return "bufconn" }
func (a backendAddr) String() string  { return string(a) }

// An open breaker refuses only the calls it would send to an endpoint that
// served nothing. Here the dead backend is the only one the resolver knows
// at first (as when its connection is ready before the others'): twenty
// calls fail and the breaker opens; the bubble's clock moves only when
// every goroutine waits, so the test stays within its open period. Then
// the healthy backends appear: the next calls reach them (no retries would
// have sent them there), while picks of the dead backend are refused
// before anything is sent.
func TestOpenBreakerRefusesOnlyWhatGoesToADeadEndpoint(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		origins, addrs, dialer := bufconnBackends(t, []origin.Script{origin.Always(codes.Unavailable), origin.Succeed(), origin.Succeed()})
		r := manual.NewBuilderWithScheme("sg")
		r.InitialState(resolver.State{Addresses: addrs[:1]})
		guard := interceptor.NewClient(noopProviders()...)
		cc, err := grpc.NewClient(r.Scheme()+":///backends", append(guard.DialOptions(),
			grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithResolvers(r), dialer,
			grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`))...)
		require.NoError(t, err)
		defer cc.Close()
		echo := echov1.NewEchoServiceClient(cc)
		for i := range 25 {
			_, _ = echo.Put(t.Context(), &echov1.PutRequest{RequestId: fmt.Sprint("a", i)}, interceptor.MaxAttempts(1))
		}
		require.Equal(t, "open", guard.Targets()[0].Breakers[0].State)
		deadBefore := origins[0].Total()
		_, err = echo.Put(t.Context(), &echov1.PutRequest{RequestId: "refused"})
		assert.Equal(t, interceptor.ReasonBreaker, interceptor.RefusedBy(err), "only the dead backend: refused")
		assert.Equal(t, deadBefore, origins[0].Total(), "before anything was sent")

		r.UpdateState(resolver.State{Addresses: addrs})
		ok := 0
		for i := 0; ok < 50; i++ {
			require.Less(t, i, 10_000, "the healthy backends never got a call (%d ok)", ok)
			if _, err := echo.Put(t.Context(), &echov1.PutRequest{RequestId: fmt.Sprint("b", i)}); err == nil {
				ok++
			}
		}
		assert.Equal(t, deadBefore, origins[0].Total(), "the dead backend got nothing more")
		assert.Equal(t, "open", guard.Targets()[0].Breakers[0].State, "still within its open period")
	})
}

// A fail-over that can only reach the endpoint that failed is not free.
// Of two endpoints, one is gone (its server stopped: grpc can pick only
// the other) and the other answers UNAVAILABLE (a cluster that lost its
// quorum). The gone endpoint's recent successes make the other look like
// the odd one out, but no other endpoint can take a retry: every retry is
// paid from the budget, so that no more requests reach the failing
// endpoint than the calls and the budget's grants.
func TestFailoverWithNowhereToGoIsPaid(t *testing.T) {
	var down atomic.Bool
	scripts := []origin.Script{origin.Succeed(), switchable(&down)}
	r := manual.NewBuilderWithScheme("sg")
	var addrs []resolver.Address
	var origins []*origin.Origin
	var servers []*origin.Server
	for _, s := range scripts {
		o := origin.New(s)
		l, err := origin.TCP()
		require.NoError(t, err)
		srv := origin.Serve(l, o)
		t.Cleanup(srv.Stop)
		origins, servers = append(origins, o), append(servers, srv)
		addrs = append(addrs, resolver.Address{Addr: l.Target})
	}
	r.InitialState(resolver.State{Addresses: addrs})
	budgets := budget.NewRegistry(budgetNoBurst())
	guard := interceptor.NewClient(append(noopProviders(), fast, interceptor.WithBudget(budgets))...)
	cc, err := grpc.NewClient(r.Scheme()+":///quorum", append(guard.DialOptions(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithResolvers(r),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`))...)
	require.NoError(t, err)
	t.Cleanup(func() { cc.Close() })
	c := echov1.NewEchoServiceClient(cc)
	gone, last := origins[0], origins[1]

	// Both serve; then the first one's server stops, and calls go to the
	// other alone once grpc has seen its connection close.
	require.Equal(t, 60, workload(t, c, 60, 4))
	require.Positive(t, gone.Total())
	servers[0].Stop()
	for i, still := 0, 0; still < 20; i++ {
		n := gone.Total()
		_, err := c.Put(t.Context(), &echov1.PutRequest{RequestId: fmt.Sprint("after-", i)})
		require.NoError(t, err)
		if gone.Total() == n {
			still++
		} else {
			still = 0
		}
	}

	// The last one loses its quorum.
	down.Store(true)
	granted := func() (n uint64) {
		budgets.Range(func(_ string, b *budget.Budget) bool { n += b.Stats().Granted; return true })
		return n
	}
	before, grantedBefore := last.Total(), granted()
	const calls = 300
	ok := workload(t, c, calls, 4)
	sent, paid := last.Total()-before, granted()-grantedBefore
	t.Logf("%d calls, %d ok: %d requests reached the failing endpoint (%.2fx), the budget granted %d retries", calls, ok, sent, float64(sent)/calls, paid)
	assert.Zero(t, ok)
	assert.LessOrEqual(t, uint64(sent), calls+paid, "every retry was paid")
	marked := 0
	for _, c := range last.Calls()[before:] {
		if len(c.Metadata.Get(semconv.BudgetedKey)) > 0 {
			marked++
		}
	}
	assert.Equal(t, sent-calls, marked, "every retry says it was paid for (those paid at their pick too)")

	// The gone endpoint comes back (at its address, as a restarted
	// member): once grpc has reconnected and it serves, a retry after a
	// failure on the other one fails over to it again, free.
	l, err := net.Listen("tcp", addrs[0].Addr)
	if err != nil {
		t.Skipf("the gone endpoint's address cannot be reused: %v", err)
	}
	back := origin.New(origin.Succeed())
	srv := origin.Serve(&origin.Listener{Listener: l, Target: addrs[0].Addr}, back)
	t.Cleanup(srv.Stop)
	for i := 0; back.Total() == 0; i++ {
		require.Less(t, i, 10_000, "grpc did not reconnect to the endpoint that came back")
		_, _ = c.Put(t.Context(), &echov1.PutRequest{RequestId: fmt.Sprint("reconnect-", i)})
	}
	ok = workload(t, c, calls, 4)
	t.Logf("back: %d/%d ok", ok, calls)
	assert.GreaterOrEqual(t, ok, calls*97/100)
}

// A target that dies after serving well: its endpoints' window forgets the
// successes within 4 s, and from then on its callers get no retries, though
// the breaker (whose window is 10 s) is still closed.
func TestServedNothingAfterHealthyTraffic(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var down atomic.Bool
		e := newEnv(t, func(origin.Call) origin.Reply {
			if down.Load() {
				return origin.Reply{Code: codes.Unavailable}
			}
			return origin.Reply{}
		}, interceptor.WithBudget(nil))
		for i := range 20 {
			_, err := e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: fmt.Sprint("ok", i)})
			require.NoError(t, err)
		}
		down.Store(true)
		// Still served lately: the failed call is retried.
		_, err := e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: "early"})
		require.Error(t, err)
		assert.Equal(t, 3, e.origin.CountID(put, "early"))
		time.Sleep(5 * time.Second)
		for i := range 3 {
			_, _ = e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: fmt.Sprint("down", i)}, interceptor.MaxAttempts(1))
		}
		_, err = e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: "late"})
		assert.Equal(t, interceptor.ReasonBreaker, interceptor.RefusedBy(err))
		assert.Equal(t, 1, e.origin.CountID(put, "late"), "served nothing lately: no retry")
		assert.Equal(t, "closed", e.guard.Targets()[0].Breakers[0].State)
	})
}
