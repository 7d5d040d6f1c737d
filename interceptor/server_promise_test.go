package interceptor_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
	"github.com/stormguard/stormguard/semconv"
)

// sentCounter counts the attempts that reach a server, before its
// interceptors decide anything: what the clients send, by request id.
type sentCounter struct {
	mu   sync.Mutex
	sent map[string]int
}

func (c *sentCounter) unary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if r, ok := req.(interface{ GetRequestId() string }); ok {
		c.mu.Lock()
		c.sent[r.GetRequestId()]++
		c.mu.Unlock()
	}
	return h(ctx, req)
}

func (c *sentCounter) of(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sent[id]
}

// promiseServer serves script behind the suite's server with its
// defaults, counting what is sent to it, and returns a ClientConn maker.
func promiseServer(t *testing.T, script origin.Script) (*sentCounter, func(opts ...grpc.DialOption) echov1.EchoServiceClient) {
	t.Helper()
	c := &sentCounter{sent: map[string]int{}}
	s := interceptor.NewServer()
	l := origin.Bufconn()
	srv := origin.Serve(l, origin.New(script), grpc.ChainUnaryInterceptor(c.unary, s.Unary()))
	t.Cleanup(srv.Stop)
	return c, func(opts ...grpc.DialOption) echov1.EchoServiceClient {
		cc, err := grpc.NewClient(l.Target, l.ConnectOptions(opts...)...)
		require.NoError(t, err)
		t.Cleanup(func() { cc.Close() })
		return echov1.NewEchoServiceClient(cc)
	}
}

// When the method fails and its retry budget cannot pay for a retry, the
// suite's server says so on the failed attempt (stormguard-budget-dry),
// and the suite's client sends no retry to that endpoint, nor to any that
// failed lately: here the target's only endpoint, so no retry at all, from
// a client with nothing banked (no loan starts) as from one whose calls
// banked credit (the server would refuse it: its budget is dry). A retry
// that can go to another endpoint goes (TestDryEndpointFailsOver).
// A plain grpc-go client is not told (its retryPolicy would take the
// marker's only form it reads, "do not retry", for every backend): its
// retry is sent, and refused before the handler. A method not safe to
// repeat is sent once, as ever; a success carries neither trailer.
func TestServerSaysItsBudgetIsDry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sent, dial := promiseServer(t, func(c origin.Call) origin.Reply {
			if strings.HasPrefix(c.RequestID, "ok") {
				return origin.Reply{}
			}
			return origin.Reply{Code: codes.Unavailable, Message: "fails"}
		})
		plain := dial()
		grpcgo := dial(grpc.WithDefaultServiceConfig(fleetRetryConfig))
		// A fleet's failures and retries spend the method's budget: its
		// credit, and the loan it makes one client at the failure's start.
		for i := range 40 {
			_, err := grpcgo.Put(t.Context(), &echov1.PutRequest{RequestId: fmt.Sprint("drain-", i)})
			require.Equal(t, codes.Unavailable, status.Code(err))
		}
		var tr metadata.MD
		_, err := plain.Put(t.Context(), &echov1.PutRequest{RequestId: "plain"}, grpc.Trailer(&tr))
		require.Equal(t, codes.Unavailable, status.Code(err))
		require.Equal(t, []string{"1"}, tr.Get(semconv.BudgetDryKey), "a failure the budget cannot pay a retry of says so")
		assert.Empty(t, tr.Get(semconv.PushbackKey), "and does not say do not retry")

		guard := interceptor.NewClient(append(noopProviders(), fast)...)
		defer guard.Close()
		suite := dial(guard.DialOptions()...)
		_, err = suite.Put(t.Context(), &echov1.PutRequest{RequestId: "suite"})
		assert.Equal(t, codes.Unavailable, status.Code(err))
		assert.Equal(t, 1, sent.of("suite"), "the suite's client started a loan for a retry the server's budget could not pay for")
		assert.Equal(t, interceptor.ReasonBudget, interceptor.RefusedBy(err))

		banked := interceptor.NewClient(append(noopProviders(), fast)...)
		defer banked.Close()
		rich := dial(banked.DialOptions()...)
		for i := range 20 { // 20 calls bank 2 retries of credit (another method: the server's Put budget stays dry)
			_, err := rich.Get(t.Context(), &echov1.GetRequest{RequestId: fmt.Sprint("ok-", i)})
			require.NoError(t, err)
		}
		_, err = rich.Put(t.Context(), &echov1.PutRequest{RequestId: "banked"})
		assert.Equal(t, codes.Unavailable, status.Code(err))
		assert.Equal(t, 1, sent.of("banked"), "a retry to the endpoint that said it is dry, paid from banked credit")
		assert.Equal(t, interceptor.ReasonBudget, interceptor.RefusedBy(err))

		_, err = grpcgo.Put(t.Context(), &echov1.PutRequest{RequestId: "grpc-go"})
		assert.Equal(t, codes.Unavailable, status.Code(err))
		assert.Equal(t, 2, sent.of("grpc-go"), "grpc-go's retryPolicy: a failure, and a retry the server refuses with do not retry")

		_, err = suite.Notify(t.Context(), &echov1.NotifyRequest{RequestId: "notify"})
		assert.Equal(t, codes.Unavailable, status.Code(err))
		assert.Equal(t, 1, sent.of("notify"), "a method not safe to repeat is sent once")

		_, err = plain.Put(t.Context(), &echov1.PutRequest{RequestId: "ok"}, grpc.Trailer(&tr))
		require.NoError(t, err)
		assert.Empty(t, tr.Get(semconv.BudgetDryKey), "a success is not marked")
		assert.Empty(t, tr.Get(semconv.PushbackKey), "a success carries no pushback")
	})
}

// When the method fails and its retry budget can pay for a retry, the
// failed attempt carries no "do not retry": the retry is promised, sent,
// admitted and served, from the suite's client and from grpc-go's
// retryPolicy alike.
func TestServerPromisesTheRetryItCanPayFor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sent, dial := promiseServer(t, func(c origin.Call) origin.Reply {
			if strings.HasPrefix(c.RequestID, "rescued") && c.Attempt > 1 {
				return origin.Reply{}
			}
			return origin.Reply{Code: codes.Unavailable, Message: "fails"}
		})
		plain := dial()
		for i := range 10 { // the method fails: 10 outcomes, all failures
			_, _ = plain.Put(t.Context(), &echov1.PutRequest{RequestId: fmt.Sprint("fail-", i)})
		}
		guard := interceptor.NewClient(append(noopProviders(), fast)...)
		defer guard.Close()
		suite := dial(guard.DialOptions()...)
		_, err := suite.Put(t.Context(), &echov1.PutRequest{RequestId: "rescued-suite"})
		require.NoError(t, err)
		assert.Equal(t, 2, sent.of("rescued-suite"), "the suite's client: a failure and its retry")

		grpcgo := dial(grpc.WithDefaultServiceConfig(fleetRetryConfig))
		_, err = grpcgo.Put(t.Context(), &echov1.PutRequest{RequestId: "rescued-grpc-go"})
		require.NoError(t, err)
		assert.Equal(t, 2, sent.of("rescued-grpc-go"), "grpc-go's retryPolicy: a failure and its retry")
	})
}

// The dry trailer speaks for the endpoint that sent it. Of two backends
// behind the suite's servers, one fails every Put and its budget is dry;
// the other serves. A suite client that banked credit calls Put over both,
// round robin: a call whose first attempt meets the dry backend retries,
// from the client's credit, on the other, which serves it; none is sent to
// the dry backend twice.
func TestDryEndpointFailsOver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fails := func(c origin.Call) origin.Reply {
			if strings.HasPrefix(c.RequestID, "ok") {
				return origin.Reply{}
			}
			return origin.Reply{Code: codes.Unavailable, Message: "fails"}
		}
		scripts := []origin.Script{fails, origin.Succeed()}
		counters := make([]*sentCounter, len(scripts))
		listeners := map[string]*origin.Listener{}
		var addrs []resolver.Address
		for i, script := range scripts {
			counters[i] = &sentCounter{sent: map[string]int{}}
			l := origin.Bufconn()
			srv := origin.Serve(l, origin.New(script), grpc.ChainUnaryInterceptor(counters[i].unary, interceptor.NewServer().Unary()))
			t.Cleanup(srv.Stop)
			addr := fmt.Sprint("backend-", i)
			listeners[addr] = l
			addrs = append(addrs, resolver.Address{Addr: addr})
		}
		dialer := grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			c, err := listeners[addr].Listener.(*bufconn.Listener).DialContext(ctx)
			if err != nil {
				return nil, err
			}
			return peerConn{c, backendAddr(addr)}, nil
		})
		// A fleet's failures and retries dry the failing backend's budget.
		direct, err := grpc.NewClient(listeners["backend-0"].Target, listeners["backend-0"].ConnectOptions(grpc.WithDefaultServiceConfig(fleetRetryConfig))...)
		require.NoError(t, err)
		defer direct.Close()
		for i := range 40 {
			_, err := echov1.NewEchoServiceClient(direct).Put(t.Context(), &echov1.PutRequest{RequestId: fmt.Sprint("drain-", i)})
			require.Equal(t, codes.Unavailable, status.Code(err))
		}

		r := manual.NewBuilderWithScheme("sg")
		r.InitialState(resolver.State{Addresses: addrs})
		guard := interceptor.NewClient(append(noopProviders(), fast)...)
		defer guard.Close()
		// The resolver goes to DialOptions, which reads the endpoints it
		// gives: a channel whose first calls all went to one backend (the
		// other's connection not yet ready) still knows the other is there.
		cc, err := grpc.NewClient(r.Scheme()+":///backends", append(guard.DialOptions(r),
			grpc.WithTransportCredentials(insecure.NewCredentials()), dialer,
			grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`))...)
		require.NoError(t, err)
		defer cc.Close()
		// Both connections ready before the first call: round robin then
		// alternates, and some Put's first attempt meets the dry backend
		// (a Put that does not moves the next one's pick on by one).
		cc.Connect()
		synctest.Wait()
		echo := echov1.NewEchoServiceClient(cc)
		failedOver := 0
		for i := range 4 {
			for j := range 20 { // 20 calls bank a full credit, 2 retries (Gets: the dry backend's Put budget stays dry)
				_, err := echo.Get(t.Context(), &echov1.GetRequest{RequestId: fmt.Sprint("ok-", i, "-", j)})
				require.NoError(t, err)
			}
			id := fmt.Sprint("fo-", i)
			var tr metadata.MD
			_, err := echo.Put(t.Context(), &echov1.PutRequest{RequestId: id}, grpc.Trailer(&tr))
			require.NoError(t, err, "call %s", id)
			dry, ok := counters[0].of(id), counters[1].of(id)
			assert.LessOrEqual(t, dry, 1, "call %s: sent to the dry backend again", id)
			assert.Equal(t, 1, ok, "call %s: served once by the backend that serves", id)
			failedOver += dry
		}
		assert.Positive(t, failedOver, "round robin sent some first attempts to the dry backend")
	})
}
