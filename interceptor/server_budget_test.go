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

	"github.com/stormguard/stormguard/semconv"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/idempotency/dedupe"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// fleetRetryConfig is grpc-go's own retry policy for the demo service: 3
// attempts on UNAVAILABLE, as the clients of a server that does not
// control them might have.
const fleetRetryConfig = `{"methodConfig": [{"name": [{"service": "echo.v1.EchoService"}],
  "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.1s",
    "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]}`

// serveFleet runs, in a synctest bubble, n ClientConns made with dialOpts
// against one origin behind the suite's server (serverOpts), each at rate
// calls a second for dur, every attempt failing with probability p at the
// handler. It returns the calls, the attempts that reached the handler
// (in total and from 5 s on, with the calls from 5 s on), and the calls
// that succeeded.
func serveFleet(t *testing.T, n int, rate, p float64, dur time.Duration, dialOpts func() ([]grpc.DialOption, func()), serverOpts ...interceptor.ServerOption) (calls, handled, callsAfter, handledAfter, ok int64) {
	t.Helper()
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		var after atomic.Int64
		o := origin.New(func(c origin.Call) origin.Reply {
			if time.Since(start) >= 5*time.Second {
				after.Add(1)
			}
			if drawFails(c.RequestID, c.Attempt, p) {
				return origin.Reply{Code: codes.Unavailable, Message: "fails"}
			}
			return origin.Reply{}
		})
		s := interceptor.NewServer(serverOpts...)
		l := origin.Bufconn()
		srv := origin.Serve(l, o, grpc.ChainUnaryInterceptor(s.Unary()))
		defer srv.Stop()
		var nCalls, nAfter, nOK atomic.Int64
		period := time.Duration(float64(time.Second) / rate)
		var wg sync.WaitGroup
		for c := range n {
			opts, closeClient := dialOpts()
			cc, err := grpc.NewClient(l.Target, l.ConnectOptions(opts...)...)
			require.NoError(t, err)
			echo := echov1.NewEchoServiceClient(cc)
			wg.Go(func() {
				defer closeClient()
				defer cc.Close()
				time.Sleep(time.Duration(c) * period / time.Duration(n))
				var inflight sync.WaitGroup
				for i := 0; time.Since(start) < dur; i++ {
					late := time.Since(start) >= 5*time.Second
					inflight.Go(func() {
						_, err := echo.Put(context.Background(), &echov1.PutRequest{RequestId: fmt.Sprint(c, "-", i)})
						nCalls.Add(1)
						if late {
							nAfter.Add(1)
						}
						if err == nil {
							nOK.Add(1)
						}
					})
					time.Sleep(period)
				}
				inflight.Wait()
			})
		}
		wg.Wait()
		calls, handled, callsAfter, handledAfter, ok = nCalls.Load(), int64(o.Total()), nAfter.Load(), after.Load(), nOK.Load()
	})
	return calls, handled, callsAfter, handledAfter, ok
}

func grpcRetryClients() ([]grpc.DialOption, func()) {
	return []grpc.DialOption{grpc.WithDefaultServiceConfig(fleetRetryConfig)}, func() {}
}

// The server's retry budget bounds the retries that reach its handler,
// whoever sends them: a fleet of grpc-go clients with their own retry
// policy (3 attempts, no budget) gets, from 5 s on, at most 1.10× its
// calls at the handler, against about 1.75× (p = 0.5) without the suite's
// server; and the suite's own clients likewise.
func TestServerBudgetBoundsAFleetItDoesNotControl(t *testing.T) {
	n := 40
	if raceEnabled {
		n = 15
	}
	for _, p := range []float64{0.3, 0.5, 0.9} {
		t.Run(fmt.Sprint("grpc-go clients/p=", p), func(t *testing.T) {
			calls, handled, callsAfter, handledAfter, ok := serveFleet(t, n, 5, p, 20*time.Second, grpcRetryClients)
			t.Logf("%d calls, %d at the handler (%.3f×); from 5 s on %d calls, %d at the handler (%.3f×); %d ok",
				calls, handled, float64(handled)/float64(calls), callsAfter, handledAfter, float64(handledAfter)/float64(callsAfter), ok)
			// The server's budget lends at most max(5, a tenth of the last
			// second's first attempts) in the failure's first 3 s, and
			// holds at most 2 retries of credit at 5 s.
			assert.LessOrEqual(t, float64(handledAfter), 1.10*float64(callsAfter)+2)
			assert.LessOrEqual(t, float64(handled), 1.10*float64(calls)+2+max(5, 0.1*float64(n)*5))
		})
	}
	t.Run("grpc-go clients, no suite server", func(t *testing.T) {
		calls, handled, _, _, _ := serveFleet(t, n, 5, 0.5, 10*time.Second, grpcRetryClients, interceptor.WithServerBudget(nil))
		t.Logf("%d calls, %d at the handler (%.3f×)", calls, handled, float64(handled)/float64(calls))
		assert.Greater(t, float64(handled), 1.5*float64(calls), "the case proves something: grpc-go alone retries every failure")
	})
	t.Run("suite clients/p=0.5", func(t *testing.T) {
		calls, handled, callsAfter, handledAfter, _ := serveFleet(t, n, 5, 0.5, 20*time.Second, func() ([]grpc.DialOption, func()) {
			guard := interceptor.NewClient(noopProviders()...)
			return guard.DialOptions(), func() { _ = guard.Close() }
		})
		t.Logf("%d calls, %d at the handler (%.3f×); from 5 s on %.3f×", calls, handled, float64(handled)/float64(calls), float64(handledAfter)/float64(callsAfter))
		assert.LessOrEqual(t, float64(handledAfter), 1.10*float64(callsAfter)+2)
	})
}

// A retry the server's budget refuses is answered at once, before the
// handler, with Unavailable, semconv.ErrorReasonRetryBudget and "do not retry".
func TestServerBudgetRefusalSaysDoNotRetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := origin.New(origin.Always(codes.Unavailable))
		echo, _, _ := guarded(t, o)
		for i := range 20 { // first attempts: the method fails all of them
			_, _ = echo.Put(t.Context(), &echov1.PutRequest{RequestId: fmt.Sprint(i)})
		}
		// Retries, by their header: the budget pays for some (the first
		// attempts' ratio and its start-up burst); the rest are refused.
		var refused int
		var tr metadata.MD
		for i := range 20 {
			ctx := metadata.AppendToOutgoingContext(t.Context(), semconv.PreviousAttemptsKey, "1")
			_, err := echo.Put(ctx, &echov1.PutRequest{RequestId: fmt.Sprint(i)}, grpc.Trailer(&tr))
			require.Equal(t, codes.Unavailable, status.Code(err))
			assert.Empty(t, interceptor.RefusedBy(err), "the server's refusal is not a client's")
			var info *errdetails.ErrorInfo
			for _, d := range status.Convert(err).Details() {
				if ei, ok := d.(*errdetails.ErrorInfo); ok {
					info = ei
				}
			}
			if info.GetReason() == semconv.ErrorReasonRetryBudget {
				refused++
				assert.Equal(t, []string{"-1"}, tr.Get(semconv.PushbackKey), "a refusal says do not retry")
			}
		}
		// 6 paid, within the 7 that the first attempts' credit (2) and the
		// start-up loan (5) could pay; the bubble's clock makes it exact.
		assert.Equal(t, 20-6, refused, "the budget pays for 6 retries and refuses the rest")
		assert.Equal(t, 20+20-refused, o.Total(), "refused retries never reach the handler")
	})
}

// While the method serves, the retries a server gets are fail-overs from
// a peer that failed (or the odd retry of a transient failure): they are
// served, however many there are, so that a healthy backend is not made to
// refuse the work of a dead one.
func TestServerBudgetServesRetriesWhileTheMethodServes(t *testing.T) {
	o := origin.New(origin.Succeed())
	echo, _, _ := guarded(t, o)
	for i := range 200 {
		ctx := t.Context()
		if i%2 == 1 { // half the calls are fail-overs from a dead peer
			ctx = metadata.AppendToOutgoingContext(ctx, semconv.PreviousAttemptsKey, "1")
		}
		_, err := echo.Put(ctx, &echov1.PutRequest{RequestId: fmt.Sprint(i)})
		require.NoError(t, err, "call %d", i)
	}
	assert.Equal(t, 200, o.Total())
}

// A header buys nothing: a retry that says its client's own budget paid
// for it (semconv.BudgetedKey) is charged to the server's budget like any
// other, and refused once the budget is spent, as it would be without the
// header.
func TestServerBudgetChargesMarkedRetries(t *testing.T) {
	run := func(marked bool) (n int) {
		synctest.Test(t, func(t *testing.T) {
			o := origin.New(origin.Always(codes.Unavailable))
			echo, _, _ := guarded(t, o)
			for i := range 20 { // first attempts: the method fails all of them
				_, _ = echo.Put(t.Context(), &echov1.PutRequest{RequestId: fmt.Sprint(i)})
			}
			kv := []string{semconv.PreviousAttemptsKey, "1"}
			if marked {
				kv = append(kv, semconv.BudgetedKey, "1")
			}
			for i := range 20 {
				_, _ = echo.Put(metadata.AppendToOutgoingContext(t.Context(), kv...), &echov1.PutRequest{RequestId: fmt.Sprint(i)})
			}
			n = o.Total() - 20
		})
		return n
	}
	marked, unmarked := run(true), run(false)
	assert.Equal(t, 6, unmarked, "the case proves something: the budget pays for 6 of 20 (see TestServerBudgetRefusalSaysDoNotRetry)")
	assert.Equal(t, unmarked, marked, "the marked retries got what unmarked ones get")
}

// A caller the server trusts (WithTrustedBudgets, by an identity it
// cannot forge: here its bearer token) has the retries its own budget paid
// for served when the server's budget cannot pay for them; they are still
// withdrawn, so that other callers' retries get what is left. The marker
// from anyone else, and a trusted caller's unmarked retries, are charged.
func TestServerBudgetTrustedCallers(t *testing.T) {
	withToken := func(ctx context.Context, token string) context.Context {
		return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	}
	trusted := dedupe.DefaultIdentity(metadata.NewIncomingContext(t.Context(), metadata.Pairs("authorization", "Bearer ops")))
	o := origin.New(origin.Always(codes.Unavailable))
	echo, _, _ := guarded(t, o, interceptor.WithTrustedBudgets(nil, trusted))
	for i := range 20 { // 20 first attempts pay for 2, the budget lends 5
		_, _ = echo.Put(t.Context(), &echov1.PutRequest{RequestId: fmt.Sprint(i)})
	}
	retry := func(ctx context.Context, marked bool) bool {
		kv := []string{semconv.PreviousAttemptsKey, "1"}
		if marked {
			kv = append(kv, semconv.BudgetedKey, "1")
		}
		n := o.Total()
		_, _ = echo.Put(metadata.AppendToOutgoingContext(ctx, kv...), &echov1.PutRequest{RequestId: "r"})
		return o.Total() > n
	}
	served := 0
	for range 20 {
		if retry(withToken(t.Context(), "ops"), true) {
			served++
		}
	}
	assert.Equal(t, 20, served, "the trusted caller's paid retries are all served")
	assert.False(t, retry(t.Context(), false), "they spent the budget: another caller's retry is refused")
	assert.False(t, retry(withToken(t.Context(), "guess"), true), "the marker from a caller not trusted buys nothing")
	assert.False(t, retry(t.Context(), true), "nor from one without identity")
	assert.False(t, retry(withToken(t.Context(), "ops"), false), "the trusted caller's unmarked retry is charged")
}

// The server's budget lends a fleet what the fleet's own budgets would
// lend: Burst (5) for each client connection that sent it a first attempt
// lately, at most one retry per first attempt of the last second. Twenty
// clients, each on its own connection, each failing 5 first attempts and
// then retrying each: their 100 retries are served (90 at least: the
// server counts its clients to within a few percent), as their own
// budgets would have paid for them. Through one connection, the same first
// attempts are lent what one client's budget lends itself: its burst and
// 10% of its first attempts.
func TestServerBudgetLendsPerClientConnection(t *testing.T) {
	run := func(conns int) (served, promised int) {
		synctest.Test(t, func(t *testing.T) {
			o := origin.New(origin.Always(codes.Unavailable))
			s := interceptor.NewServer()
			l := origin.Bufconn()
			l.Listener = &addressed{Listener: l.Listener}
			srv := origin.Serve(l, o, grpc.ChainUnaryInterceptor(s.Unary()))
			defer srv.Stop()
			clients := make([]echov1.EchoServiceClient, conns)
			for i := range clients {
				cc, err := l.Dial()
				require.NoError(t, err)
				defer cc.Close()
				clients[i] = echov1.NewEchoServiceClient(cc)
			}
			for i := range 100 {
				var tr metadata.MD
				_, _ = clients[i%conns].Put(t.Context(), &echov1.PutRequest{RequestId: fmt.Sprint(i)}, grpc.Trailer(&tr))
				if len(tr.Get(semconv.PushbackKey)) == 0 {
					promised++
				}
				time.Sleep(time.Millisecond)
			}
			for i := range 100 {
				ctx := metadata.AppendToOutgoingContext(t.Context(), semconv.PreviousAttemptsKey, "1")
				_, _ = clients[i%conns].Put(ctx, &echov1.PutRequest{RequestId: fmt.Sprint(i)})
			}
			served = o.Total() - 100
		})
		return served, promised
	}
	fleet, fleetPromised := run(20)
	one, onePromised := run(1)
	t.Logf("retries served: 20 connections %d of 100 (%d not told not to retry), one connection %d of 100 (%d)", fleet, fleetPromised, one, onePromised)
	// The server counts its clients to within a few percent (two of
	// twenty may share a bit of its sketch).
	assert.GreaterOrEqual(t, fleet, 90, "each connection lent its 5")
	// One connection is lent what one client's budget lends itself. Its
	// retries are charged when their failures are answered (promised, see
	// budget.Method.PromiseAt), as a client retrying each failure would
	// have them charged: the loan is Burst (5) while fewer than 50 first
	// attempts came in the last second, repaid by a tenth of the 90 that
	// failed while the method failed (so 9 at least); at most the credit
	// (2) and the loan on the whole second's first attempts (10).
	assert.Equal(t, 10, one, "one connection: its burst, then 10% of its first attempts (the bubble's clock makes it exact)")
	assert.GreaterOrEqual(t, onePromised, one-1, "the retries served were promised")
}

// addressed gives each connection it accepts a TCP address of its own, as
// the clients of a server over TCP have, so that a bufconn server tells
// its clients apart.
type addressed struct {
	net.Listener
	next atomic.Int32
}

func (l *addressed) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return addressedConn{c, &net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: int(l.next.Add(1))}}, nil
}

type addressedConn struct {
	net.Conn
	remote net.Addr
}

func (c addressedConn) RemoteAddr() net.Addr { return c.remote }

// forgers are grpc-go clients with their own retry policy (3 attempts, no
// budget) that send on every attempt every header a suite server reads
// that could buy a retry something: "my budget paid for it", and the
// highest priority.
func forgers() ([]grpc.DialOption, func()) {
	forge := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		ctx = metadata.AppendToOutgoingContext(ctx, semconv.BudgetedKey, "1", semconv.PriorityKey, "critical")
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	opts, done := grpcRetryClients()
	return append(opts, grpc.WithChainUnaryInterceptor(forge)), done
}

// A fleet of clients that forge every header gets, at the handler, no more
// than a fleet that sends none (TestServerBudgetBoundsAFleetItDoesNotControl):
// from 5 s on at most 1.10× its calls, and over the whole failure at most
// that plus the budget's start-up allowance.
func TestServerBudgetForgedHeadersBuyNothing(t *testing.T) {
	n := 40
	if raceEnabled {
		n = 15
	}
	calls, handled, callsAfter, handledAfter, _ := serveFleet(t, n, 5, 0.5, 20*time.Second, forgers)
	t.Logf("forgers: %d calls, %d at the handler (%.3f×); from 5 s on %.3f×",
		calls, handled, float64(handled)/float64(calls), float64(handledAfter)/float64(callsAfter))
	assert.LessOrEqual(t, float64(handledAfter), 1.10*float64(callsAfter)+2)
	assert.LessOrEqual(t, float64(handled), 1.10*float64(calls)+2+max(5, 0.1*float64(n)*5))
}

// The suite's clients say a retry was paid for only when an enforcing
// budget paid for it: without a budget, or in shadow mode (the way to roll
// the suite out), their retries are charged to the server's budget, which
// then bounds them as it bounds any client's.
func TestServerBudgetChargesRetriesNobodyPaidFor(t *testing.T) {
	n := 40
	if raceEnabled {
		n = 15
	}
	for name, opt := range map[string]interceptor.ClientOption{
		"no budget":   interceptor.WithBudget(nil),
		"shadow mode": interceptor.WithShadowMode(),
	} {
		t.Run(name, func(t *testing.T) {
			calls, handled, callsAfter, handledAfter, _ := serveFleet(t, n, 5, 0.5, 20*time.Second, func() ([]grpc.DialOption, func()) {
				guard := interceptor.NewClient(append(noopProviders(), opt)...)
				return guard.DialOptions(), func() { _ = guard.Close() }
			})
			t.Logf("%d calls, %d at the handler (%.3f×); from 5 s on %.3f×",
				calls, handled, float64(handled)/float64(calls), float64(handledAfter)/float64(callsAfter))
			assert.LessOrEqual(t, float64(handledAfter), 1.10*float64(callsAfter)+2)
		})
	}
}

// The attempt number is the caller's word: what a client that hides it
// costs. Half the fleet retries with grpc-go's retryPolicy (its attempts
// carry grpc-previous-rpc-attempts), half with a loop of its own that
// sends no attempt header, so that each of its tries reaches the server
// as a first attempt. The hiders are served as first attempts (every try
// reaches the handler: about 1.75× at p = 0.5, as with no server budget),
// and their tries deposit into the budget as first attempts do, so the
// honest clients' retries are held to the budget's ratio of a base the
// hiders inflate: at most a tenth of all the first attempts the server
// saw.
func TestServerBudgetAttemptNumberIsSelfReported(t *testing.T) {
	n := 40
	if raceEnabled {
		n = 16
	}
	var hiderCalls, hiderAttempts, clients atomic.Int64
	hiding := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		hiderCalls.Add(1)
		var err error
		for try := range 3 {
			if try > 0 {
				time.Sleep(10 * time.Millisecond)
			}
			hiderAttempts.Add(1)
			if err = invoker(ctx, method, req, reply, cc, opts...); status.Code(err) != codes.Unavailable {
				return err
			}
		}
		return err
	}
	dial := func() ([]grpc.DialOption, func()) {
		if clients.Add(1)%2 == 0 {
			return []grpc.DialOption{grpc.WithDisableRetry(), grpc.WithChainUnaryInterceptor(hiding)}, func() {}
		}
		return grpcRetryClients()
	}
	calls, handled, _, _, _ := serveFleet(t, n, 5, 0.5, 20*time.Second, dial)
	hCalls, hAttempts := hiderCalls.Load(), hiderAttempts.Load()
	honestCalls, honestHandled := calls-hCalls, handled-hAttempts
	t.Logf("hiders: %d calls, %d at the handler (%.3f×); honest grpc-go clients: %d calls, %d at the handler (%.3f×); all: %.3f×",
		hCalls, hAttempts, float64(hAttempts)/float64(hCalls), honestCalls, honestHandled, float64(honestHandled)/float64(honestCalls),
		float64(handled)/float64(calls))
	assert.Greater(t, float64(hAttempts), 1.5*float64(hCalls), "the hiders' tries are served as first attempts")
	firsts := honestCalls + hAttempts
	assert.LessOrEqual(t, float64(honestHandled), float64(honestCalls)+0.1*float64(firsts)+2+max(5, 0.1*float64(n)*5),
		"the honest clients' retries stay within a tenth of the first attempts the server saw")
}
