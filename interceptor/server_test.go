package interceptor_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
	"github.com/stormguard/stormguard/semconv"
)

// midTier is a service B whose handlers call a dead origin C through the
// suite's client (with no start-up burst in its budget, so B's retry is refused).
// Callers reach B with plain grpc clients built from dialOpts.
func midTier(t *testing.T, serverOpts ...interceptor.ServerOption) (dial func(grpcRetries bool, opts ...grpc.DialOption) echov1.EchoServiceClient, handled func() int, dead *origin.Origin) {
	t.Helper()
	dead = origin.New(origin.Always(codes.Unavailable))
	dl := origin.Bufconn()
	ds := origin.Serve(dl, dead)
	t.Cleanup(ds.Stop)
	guard := interceptor.NewClient(fast, interceptor.WithBudget(budget.NewRegistry(budgetNoBurst())))
	cc, err := dl.Dial(grpc.WithChainUnaryInterceptor(guard.Unary()))
	require.NoError(t, err)
	t.Cleanup(func() { cc.Close() })

	count := 0
	counter := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		count++
		return h(ctx, req)
	}
	bl := origin.Bufconn()
	bs := origin.Serve(bl, &origin.Hop{Next: echov1.NewEchoServiceClient(cc)},
		grpc.ChainUnaryInterceptor(counter, interceptor.NewServer(serverOpts...).Unary()))
	t.Cleanup(bs.Stop)
	dial = func(grpcRetries bool, opts ...grpc.DialOption) echov1.EchoServiceClient {
		var c *grpc.ClientConn
		var err error
		if grpcRetries {
			c, err = grpc.NewClient(bl.Target, bl.ConnectOptions(opts...)...)
		} else {
			c, err = bl.Dial(opts...)
		}
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return echov1.NewEchoServiceClient(c)
	}
	return dial, func() int { return count }, dead
}

func TestServerSaysDontRetryWhenItsRetriesWereRefused(t *testing.T) {
	dial, _, dead := midTier(t)
	var tr metadata.MD
	_, err := dial(false).Put(t.Context(), &echov1.PutRequest{RequestId: "p"}, grpc.Trailer(&tr))
	assert.Equal(t, codes.Unavailable, status.Code(err))
	assert.Equal(t, []string{"-1"}, tr.Get(semconv.PushbackKey))
	assert.Equal(t, 1, dead.Total(), "B's own retry was refused by its budget")
}

func TestServerWithoutPushback(t *testing.T) {
	dial, _, _ := midTier(t, interceptor.WithoutPushback())
	var tr metadata.MD
	_, err := dial(false).Put(t.Context(), &echov1.PutRequest{RequestId: "p"}, grpc.Trailer(&tr))
	assert.Equal(t, codes.Unavailable, status.Code(err))
	assert.Empty(t, tr.Get(semconv.PushbackKey))
}

// grpc-go's own retry (service config retryPolicy) honours the pushback
// too: a caller that does not use stormguard does not retry either.
func TestGrpcRetryPolicyHonoursThePushback(t *testing.T) {
	const serviceConfig = `{"methodConfig": [{
	  "name": [{"service": "echo.v1.EchoService"}],
	  "retryPolicy": {"maxAttempts": 4, "initialBackoff": "0.001s", "maxBackoff": "0.01s",
	                  "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]}`
	for _, tt := range []struct {
		name  string
		opts  []interceptor.ServerOption
		wantB int
	}{
		{"with pushback", nil, 1},
		{"without pushback (control)", []interceptor.ServerOption{interceptor.WithoutPushback()}, 4},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dial, handled, _ := midTier(t, tt.opts...)
			c := dial(true, grpc.WithDefaultServiceConfig(serviceConfig))
			_, err := c.Put(t.Context(), &echov1.PutRequest{RequestId: "p"})
			assert.Equal(t, codes.Unavailable, status.Code(err))
			assert.Equal(t, tt.wantB, handled())
		})
	}
}

func TestServerPushbackForPropagatedRefusal(t *testing.T) {
	// A handler that returns a downstream error carrying stormguard's
	// ErrorInfo also gets the pushback, even if it made the call some
	// other way.
	o := origin.New(nil)
	srv := interceptor.NewServer()
	l := origin.Bufconn()
	s := origin.Serve(l, o, grpc.ChainUnaryInterceptor(srv.Unary(),
		func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			guard := interceptor.NewClient(interceptor.WithBudget(budget.NewRegistry(budgetNoBurst())), fast)
			// A call refused by the budget, made from inside the handler.
			inner := origin.New(origin.Always(codes.Unavailable))
			il := origin.Bufconn()
			is := origin.Serve(il, inner)
			defer is.Stop()
			cc, err := il.Dial(grpc.WithChainUnaryInterceptor(guard.Unary()))
			if err != nil {
				return nil, err
			}
			defer cc.Close()
			_, err = echov1.NewEchoServiceClient(cc).Put(context.Background(), &echov1.PutRequest{})
			return nil, err
		}))
	t.Cleanup(s.Stop)
	cc, err := l.Dial()
	require.NoError(t, err)
	defer cc.Close()
	var tr metadata.MD
	_, err = echov1.NewEchoServiceClient(cc).Get(t.Context(), &echov1.GetRequest{}, grpc.Trailer(&tr))
	assert.Equal(t, codes.Unavailable, status.Code(err))
	assert.Equal(t, interceptor.Reason(""), interceptor.RefusedBy(err), "not a refusal of the caller's")
	assert.Equal(t, interceptor.ReasonBudget, interceptor.RefusedDownstream(err), "the detail crosses the wire, as the server's word")
	assert.Equal(t, []string{"-1"}, tr.Get(semconv.PushbackKey))
}

func TestServerNoPushbackForOrdinaryFailures(t *testing.T) {
	o := origin.New(origin.Always(codes.Unavailable))
	l := origin.Bufconn()
	s := origin.Serve(l, o, grpc.ChainUnaryInterceptor(interceptor.NewServer().Unary()))
	t.Cleanup(s.Stop)
	cc, err := l.Dial()
	require.NoError(t, err)
	defer cc.Close()
	var tr metadata.MD
	_, err = echov1.NewEchoServiceClient(cc).Get(t.Context(), &echov1.GetRequest{}, grpc.Trailer(&tr))
	assert.Equal(t, codes.Unavailable, status.Code(err))
	assert.Empty(t, tr.Get(semconv.PushbackKey))
}

// The server answers don't-retry for the reasons the refusal table says
// propagate (budget, breaker, pushback, max_attempts), and not for a deadline
// refusal: a caller above, with the same deadline, has no time to retry
// either, and its own rules say so.
func TestServerPushbackFollowsTheRefusalTable(t *testing.T) {
	for _, tt := range []struct {
		reason interceptor.Reason
		want   []string
	}{
		{interceptor.ReasonBudget, []string{"-1"}},
		{interceptor.ReasonBreaker, []string{"-1"}},
		{interceptor.ReasonPushback, []string{"-1"}},
		{interceptor.ReasonDeadline, nil},
	} {
		t.Run(string(tt.reason), func(t *testing.T) {
			refused, err := status.New(codes.Unavailable, "downstream").WithDetails(&errdetails.ErrorInfo{
				Reason: semconv.ErrorReasonRetryRefused, Domain: semconv.ErrorDomain,
				Metadata: map[string]string{"refused_by": string(tt.reason)},
			})
			require.NoError(t, err)
			l := origin.Bufconn()
			s := origin.Serve(l, origin.New(nil), grpc.ChainUnaryInterceptor(interceptor.NewServer().Unary(),
				func(context.Context, any, *grpc.UnaryServerInfo, grpc.UnaryHandler) (any, error) {
					return nil, refused.Err()
				}))
			t.Cleanup(s.Stop)
			cc, err := l.Dial()
			require.NoError(t, err)
			defer cc.Close()
			var tr metadata.MD
			_, err = echov1.NewEchoServiceClient(cc).Get(t.Context(), &echov1.GetRequest{}, grpc.Trailer(&tr))
			assert.Equal(t, tt.reason, interceptor.RefusedDownstream(err))
			assert.Equal(t, tt.want, tr.Get(semconv.PushbackKey))
			assert.Equal(t, tt.want != nil, interceptor.Propagates(tt.reason))
		})
	}
}

// startChain serves o behind a chain of hops services, each a server with the
// suite's server interceptors (serverOpts) whose handlers forward to the next
// through the suite's client (clientOpts). It returns a client of the top one,
// through the suite's client too, and a count of the requests the hops
// handled.
func startChain(t *testing.T, o *origin.Origin, hops int, clientOpts []interceptor.ClientOption, serverOpts []interceptor.ServerOption) (echov1.EchoServiceClient, func() int) {
	t.Helper()
	l := origin.Bufconn()
	srv := origin.Serve(l, o)
	t.Cleanup(srv.Stop)
	target := l
	var handled atomic.Int64
	for range hops {
		guard := interceptor.NewClient(append([]interceptor.ClientOption{fast}, clientOpts...)...)
		cc, err := target.Dial(grpc.WithChainUnaryInterceptor(guard.Unary()))
		require.NoError(t, err)
		t.Cleanup(func() { cc.Close() })
		next := interceptor.NewServer(serverOpts...)
		hl := origin.Bufconn()
		hs := origin.Serve(hl, &origin.Hop{Next: echov1.NewEchoServiceClient(cc)},
			grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
				handled.Add(1)
				return h(ctx, req)
			}, next.Unary()))
		t.Cleanup(hs.Stop)
		target = hl
	}
	guard := interceptor.NewClient(append([]interceptor.ClientOption{fast}, clientOpts...)...)
	cc, err := target.Dial(grpc.WithChainUnaryInterceptor(guard.Unary()))
	require.NoError(t, err)
	t.Cleanup(func() { cc.Close() })
	return echov1.NewEchoServiceClient(cc), func() int { return int(handled.Load()) }
}

// A dead origin three services deep (client → A → B → C → origin): with the
// defaults only the hop next to the origin retries, and the hops above are
// told not to (at most 1.2 requests per call reach the origin); with a naive
// three attempts per hop and no pushback, 3⁴ = 81.
func TestDeadOriginBelowAChainOfThree(t *testing.T) {
	for _, tt := range []struct {
		name       string
		clientOpts []interceptor.ClientOption
		serverOpts []interceptor.ServerOption
		max, min   int
	}{
		{"defaults", nil, nil, 12, 10},
		{"naive 3 attempts per hop", naive, []interceptor.ServerOption{interceptor.WithoutPushback(), interceptor.WithServerBudget(nil)}, 810, 810},
	} {
		t.Run(tt.name, func(t *testing.T) {
			o := origin.New(origin.Always(codes.Unavailable))
			top, _ := startChain(t, o, 3, tt.clientOpts, tt.serverOpts)
			ok, _ := concurrently(10, func(i int) error {
				_, err := top.Put(t.Context(), &echov1.PutRequest{RequestId: fmt.Sprint(i)})
				return err
			})
			assert.Equal(t, 0, ok)
			t.Logf("%s: origin saw %d requests for 10 calls", tt.name, o.Total())
			assert.LessOrEqual(t, o.Total(), tt.max)
			assert.GreaterOrEqual(t, o.Total(), tt.min)
		})
	}
}
