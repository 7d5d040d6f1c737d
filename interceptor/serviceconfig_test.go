package interceptor_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
	"github.com/stormguard/stormguard/semconv"
)

// serviceConfigOf returns a service config giving each method of the
// demo service the policy (a JSON fragment: "retryPolicy": {...} or
// "hedgingPolicy": {...}) in methods.
func serviceConfigOf(throttling string, methods map[string]string) string {
	js := `{"methodConfig": [`
	first := true
	for m, policy := range methods {
		if !first {
			js += ","
		}
		first = false
		js += `{"name": [{"service": "echo.v1.EchoService", "method": "` + m + `"}], ` + policy + `}`
	}
	js += `]`
	if throttling != "" {
		js += `, "retryThrottling": ` + throttling
	}
	return js + `}`
}

func retryPolicyJSON(maxAttempts int, initial, maxBackoff string, mult float64, codes ...string) string {
	cs := ""
	for i, c := range codes {
		if i > 0 {
			cs += ","
		}
		cs += `"` + c + `"`
	}
	return fmt.Sprintf(`"retryPolicy": {"maxAttempts": %d, "initialBackoff": %q, "maxBackoff": %q, "backoffMultiplier": %v, "retryableStatusCodes": [%s]}`,
		maxAttempts, initial, maxBackoff, mult, cs)
}

// callSpans returns the call spans the recorder ended, by request... by
// name ("pkg.Svc/Method").
func callSpanAttr(t *testing.T, rec *tracetest.SpanRecorder, name string) []string {
	t.Helper()
	var out []string
	for _, s := range rec.Ended() {
		if s.Name() != name {
			continue
		}
		v := ""
		for _, a := range s.Attributes() {
			if a.Key == semconv.AttrServiceConfig {
				v = a.Value.AsString()
			}
		}
		out = append(out, v)
	}
	return out
}

// TestServiceConfigRetryPolicy: a default service config given to the
// Client (WithDefaultServiceConfig, passed on to grpc by DialOptions) drives
// the suite's retries, method by method, against a real gRPC server: the
// retryPolicy marks an unmarked method as one that may be repeated, with
// more attempts than grpc-go's cap of 5, its backoff (initialBackoff ×
// backoffMultiplier^n, capped, jittered in [d/2, d]) and its codes; it
// lowers a marked method's attempts; and a send_once method is sent once
// whatever it says, the call span saying so.
func TestServiceConfigRetryPolicy(t *testing.T) {
	cfg := serviceConfigOf("", map[string]string{
		"Notify":   retryPolicyJSON(7, "0.1s", "1s", 3, "UNAVAILABLE", "INTERNAL"),
		"Transfer": retryPolicyJSON(7, "0.1s", "1s", 3, "UNAVAILABLE"),
		"Put":      retryPolicyJSON(2, "0.01s", "0.01s", 1, "UNAVAILABLE"),
	})
	synctest.Test(t, func(t *testing.T) {
		o := origin.New(scriptedFailures)
		l := origin.Bufconn()
		defer origin.Serve(l, o).Stop()
		rec := tracetest.NewSpanRecorder()
		guard := interceptor.NewClient(interceptor.WithDefaultServiceConfig(cfg), interceptor.WithBudget(nil),
			interceptor.WithTelemetry(interceptor.Telemetry{TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))}))
		cc, err := grpc.NewClient(l.Target, l.ConnectOptions(guard.DialOptions()...)...)
		require.NoError(t, err)
		defer cc.Close()
		echo := echov1.NewEchoServiceClient(cc)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()

		// The target serves (a target that has served nothing lately gets
		// no retries at all).
		for i := range 3 {
			_, err = echo.Get(ctx, &echov1.GetRequest{RequestId: fmt.Sprint("0-u-warm", i)})
			require.NoError(t, err)
		}
		// Unmarked in the proto: 7 attempts, the 7th succeeds.
		_, err = echo.Notify(ctx, &echov1.NotifyRequest{RequestId: "6-u-a"})
		require.NoError(t, err)
		require.Equal(t, 7, o.CountID(notify, "6-u-a"))
		var arrived []time.Time
		for _, c := range o.Calls() {
			if c.RequestID == "6-u-a" {
				arrived = append(arrived, c.Arrived)
			}
		}
		for n := 1; n < len(arrived); n++ {
			d := min(100*time.Millisecond*time.Duration(pow3(n-1)), time.Second)
			gap := arrived[n].Sub(arrived[n-1])
			assert.True(t, gap >= d/2 && gap <= d, "retry %d waited %v, want in [%v, %v]", n, gap, d/2, d)
		}
		// Its retryable codes.
		_, err = echo.Notify(ctx, &echov1.NotifyRequest{RequestId: "1-i-b"})
		require.NoError(t, err)
		assert.Equal(t, 2, o.CountID(notify, "1-i-b"))
		// send_once: one attempt, whatever the service config says.
		_, err = echo.Transfer(ctx, &echov1.TransferRequest{RequestId: "1-u-c"})
		assert.Equal(t, codes.Unavailable, status.Code(err))
		assert.Equal(t, 1, o.CountID(transfer, "1-u-c"))
		// A marked method: the service config's 2 attempts, not the
		// Client's 3.
		_, err = echo.Put(ctx, &echov1.PutRequest{RequestId: "3-u-d"})
		assert.Equal(t, codes.Unavailable, status.Code(err))
		assert.Equal(t, 2, o.CountID(put, "3-u-d"))

		assert.Equal(t, []string{"applied", "applied"}, callSpanAttr(t, rec, "echo.v1.EchoService/Notify"))
		assert.Equal(t, []string{"ignored:send_once"}, callSpanAttr(t, rec, "echo.v1.EchoService/Transfer"))
		assert.Equal(t, []string{"applied"}, callSpanAttr(t, rec, "echo.v1.EchoService/Put"))
	})
}

func pow3(n int) int {
	p := 1
	for range n {
		p *= 3
	}
	return p
}

// TestServiceConfigWithoutKey: a retry_with_key method that a service
// config gives a retryPolicy is repeated only with an idempotency key: the
// proto's condition wins.
func TestServiceConfigWithoutKey(t *testing.T) {
	cfg := serviceConfigOf("", map[string]string{"Charge": retryPolicyJSON(4, "0.01s", "0.01s", 1, "UNAVAILABLE")})
	synctest.Test(t, func(t *testing.T) {
		o := origin.New(scriptedFailures)
		l := origin.Bufconn()
		defer origin.Serve(l, o).Stop()
		for _, tc := range []struct {
			id       string
			opts     []interceptor.ClientOption
			attempts int
		}{
			{"2-u-made-key", nil, 3},
			{"2-u-no-key", []interceptor.ClientOption{interceptor.WithoutIdempotencyKeys()}, 1},
		} {
			guard := interceptor.NewClient(append(tc.opts, interceptor.WithDefaultServiceConfig(cfg), interceptor.WithBudget(nil))...)
			cc, err := grpc.NewClient(l.Target, l.ConnectOptions(guard.DialOptions()...)...)
			require.NoError(t, err)
			_, _ = echov1.NewEchoServiceClient(cc).Charge(context.Background(), &echov1.ChargeRequest{RequestId: tc.id, Account: "a", AmountCents: 1})
			assert.Equal(t, tc.attempts, o.CountID(charge, tc.id), tc.id)
			cc.Close()
		}
	})
}

// pushConfig gives the ClientConn of manual resolver r the service
// config js, with l's address.
func pushConfig(t *testing.T, r *manual.Resolver, l *origin.Listener, js string) {
	t.Helper()
	s := resolver.State{Addresses: []resolver.Address{{Addr: l.Addr().String()}}}
	if js != "" {
		s.ServiceConfig = r.CC().ParseServiceConfig(js)
	}
	require.NoError(t, r.CC().UpdateState(s))
}

// TestServiceConfigFollowsTheResolverUnderLoad: while 8 callers keep
// calling, the resolver gives the ClientConn new service configs: every
// call that starts after an update sends the attempts the new config says
// (2, then 5, then none: the method is unmarked, so once), without a new
// Client or ClientConn.
func TestServiceConfigFollowsTheResolverUnderLoad(t *testing.T) {
	r := manual.NewBuilderWithScheme("sgtest-follow")
	synctest.Test(t, func(t *testing.T) {
		o := origin.New(origin.Always(codes.Unavailable))
		l := origin.Bufconn()
		defer origin.Serve(l, o).Stop()
		guard := interceptor.NewClient(interceptor.WithBudget(nil), interceptor.WithBreaker(nil))
		phases := []struct {
			config   string
			attempts int
		}{
			{serviceConfigOf("", map[string]string{"Notify": retryPolicyJSON(2, "0.01s", "0.01s", 1, "UNAVAILABLE")}), 2},
			{serviceConfigOf("", map[string]string{"Notify": retryPolicyJSON(5, "0.01s", "0.01s", 1, "UNAVAILABLE")}), 5},
			{`{}`, 1},
		}
		r.InitialState(resolver.State{Addresses: []resolver.Address{{Addr: l.Addr().String()}}, ServiceConfig: nil})
		cc, err := grpc.NewClient("sgtest-follow:///echo", l.ConnectOptions(guard.DialOptions(r)...)...)
		require.NoError(t, err)
		defer cc.Close()
		cc.Connect()
		synctest.Wait() // the resolver is built
		echo := echov1.NewEchoServiceClient(cc)

		var phase atomic.Int32
		phase.Store(-1) // no config yet
		type result struct {
			id         string
			startPhase int32
			endPhase   int32
		}
		var mu sync.Mutex
		var results []result
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Go(func() {
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					id := fmt.Sprintf("g%d-%d", g, i)
					p := phase.Load()
					_, _ = echo.Notify(context.Background(), &echov1.NotifyRequest{RequestId: id})
					mu.Lock()
					results = append(results, result{id, p, phase.Load()})
					mu.Unlock()
					time.Sleep(3 * time.Millisecond)
				}
			})
		}
		for i, ph := range phases {
			pushConfig(t, r, l, ph.config)
			phase.Store(int32(i))
			time.Sleep(time.Second) // the callers call under this config
		}
		close(stop)
		wg.Wait()

		perPhase := make([]int, len(phases))
		for _, res := range results {
			got := o.CountID(notify, res.id)
			if res.startPhase >= 0 && res.startPhase == res.endPhase { // started and ended under one config
				perPhase[res.startPhase]++
				assert.Equal(t, phases[res.startPhase].attempts, got, "call %s under config %d", res.id, res.startPhase)
			}
		}
		t.Logf("calls per config: %v", perPhase)
		for i, n := range perPhase {
			assert.Greater(t, n, 50, "config %d had too few calls to judge", i)
		}
	})
}

// TestServiceConfigRetryThrottling: the service config's retryThrottling
// bounds the ClientConn's retries besides the budget, as gRFC A6 says: each
// failed attempt costs a token, each success earns tokenRatio, and no
// retry goes while the tokens are at or below half of maxTokens.
func TestServiceConfigRetryThrottling(t *testing.T) {
	r := manual.NewBuilderWithScheme("sgtest-throttle")
	synctest.Test(t, func(t *testing.T) {
		var healthy atomic.Bool
		o := origin.New(func(c origin.Call) origin.Reply {
			if healthy.Load() && c.Attempt > 1 || healthy.Load() && c.RequestID[0] == 'o' {
				return origin.Reply{}
			}
			return origin.Reply{Code: codes.Unavailable, Message: "down"}
		})
		l := origin.Bufconn()
		defer origin.Serve(l, o).Stop()
		guard := interceptor.NewClient(interceptor.WithBudget(nil), interceptor.WithBreaker(nil))
		r.InitialState(resolver.State{Addresses: []resolver.Address{{Addr: l.Addr().String()}}})
		cc, err := grpc.NewClient("sgtest-throttle:///echo", l.ConnectOptions(guard.DialOptions(r)...)...)
		require.NoError(t, err)
		defer cc.Close()
		cc.Connect()
		synctest.Wait()
		pushConfig(t, r, l, serviceConfigOf(`{"maxTokens": 4, "tokenRatio": 1}`,
			map[string]string{"Notify": retryPolicyJSON(3, "0.01s", "0.01s", 1, "UNAVAILABLE")}))
		echo := echov1.NewEchoServiceClient(cc)
		call := func(id string) (int, interceptor.Reason) {
			_, err := echo.Notify(context.Background(), &echov1.NotifyRequest{RequestId: id})
			return o.CountID(notify, id), interceptor.RefusedBy(err)
		}
		// Tokens 4 → 3 (a retry goes) → 2: throttled.
		n, why := call("a")
		assert.Equal(t, 2, n)
		assert.Equal(t, interceptor.ReasonThrottle, why)
		// 2 → 1: throttled at once.
		n, why = call("b")
		assert.Equal(t, 1, n)
		assert.Equal(t, interceptor.ReasonThrottle, why)
		// Two successes: 1 → 2 → 3; a failure: 2, throttled.
		healthy.Store(true)
		call("ok-1")
		call("ok-2")
		n, why = call("c")
		assert.Equal(t, 1, n)
		assert.Equal(t, interceptor.ReasonThrottle, why)
		// Two more: 2 → 3 → 4; a failure: 3, retried, and the retry
		// succeeds.
		call("ok-3")
		call("ok-4")
		n, why = call("d")
		assert.Equal(t, 2, n)
		assert.Equal(t, interceptor.Reason(""), why)
	})
}

// TestServiceConfigHedgingPolicy: a hedgingPolicy from the resolver, which
// grpc-go ignores, hedges the method: after hedgingDelay without an
// answer another attempt goes, and the first answer wins.
func TestServiceConfigHedgingPolicy(t *testing.T) {
	r := manual.NewBuilderWithScheme("sgtest-hedge")
	synctest.Test(t, func(t *testing.T) {
		o := origin.New(func(c origin.Call) origin.Reply {
			if c.Attempt == 1 {
				return origin.Reply{Delay: 10 * time.Second}
			}
			return origin.Reply{}
		})
		l := origin.Bufconn()
		defer origin.Serve(l, o).Stop()
		guard := interceptor.NewClient(interceptor.WithBudget(nil))
		r.InitialState(resolver.State{Addresses: []resolver.Address{{Addr: l.Addr().String()}}})
		cc, err := grpc.NewClient("sgtest-hedge:///echo", l.ConnectOptions(guard.DialOptions(r)...)...)
		require.NoError(t, err)
		defer cc.Close()
		cc.Connect()
		synctest.Wait()
		pushConfig(t, r, l, serviceConfigOf("", map[string]string{
			"Notify": `"hedgingPolicy": {"maxAttempts": 3, "hedgingDelay": "0.05s", "nonFatalStatusCodes": ["UNAVAILABLE"]}`}))
		start := time.Now()
		_, err = echov1.NewEchoServiceClient(cc).Notify(context.Background(), &echov1.NotifyRequest{RequestId: "h"})
		require.NoError(t, err)
		assert.Equal(t, 50*time.Millisecond, time.Since(start), "the hedge answered, 50 ms in")
		assert.Equal(t, 2, o.CountID(notify, "h"))
	})
}

// TestServiceConfigWithinTheBudget: a service config's retryPolicy of 5
// attempts against a dead origin: the budget still holds the retries to
// about a tenth of the calls.
func TestServiceConfigWithinTheBudget(t *testing.T) {
	cfg := serviceConfigOf("", map[string]string{"Notify": retryPolicyJSON(5, "0.001s", "0.001s", 1, "UNAVAILABLE")})
	synctest.Test(t, func(t *testing.T) {
		o := origin.New(origin.Always(codes.Unavailable))
		l := origin.Bufconn()
		defer origin.Serve(l, o).Stop()
		guard := interceptor.NewClient(interceptor.WithDefaultServiceConfig(cfg), interceptor.WithBreaker(nil))
		cc, err := grpc.NewClient(l.Target, l.ConnectOptions(guard.DialOptions()...)...)
		require.NoError(t, err)
		defer cc.Close()
		echo := echov1.NewEchoServiceClient(cc)
		const calls = 300
		for i := range calls {
			_, _ = echo.Notify(context.Background(), &echov1.NotifyRequest{RequestId: fmt.Sprint(i)})
			time.Sleep(10 * time.Millisecond)
		}
		total := o.Count(notify)
		t.Logf("%d attempts for %d calls (%.2f×)", total, calls, float64(total)/calls)
		assert.LessOrEqual(t, total, int(calls*(1+budget.DefaultRatio))+budget.DefaultBurst+budget.MaxCredit)
		assert.Greater(t, total, calls, "some retries were paid for")
	})
}

// A service config's backoff is capped at MaxBackoff, as a server's
// pushback is at MaxPushback: an initialBackoff of two days does not make
// a call without a deadline wait days before its retry.
func TestServiceConfigBackoffIsCapped(t *testing.T) {
	cfg := serviceConfigOf("", map[string]string{
		"Notify": retryPolicyJSON(3, "172800s", "172800s", 2, "UNAVAILABLE"),
	})
	synctest.Test(t, func(t *testing.T) {
		o := origin.New(scriptedFailures)
		l := origin.Bufconn()
		defer origin.Serve(l, o).Stop()
		guard := interceptor.NewClient(append(noopProviders(), interceptor.WithDefaultServiceConfig(cfg), interceptor.WithBudget(nil))...)
		cc, err := grpc.NewClient(l.Target, l.ConnectOptions(guard.DialOptions()...)...)
		require.NoError(t, err)
		defer cc.Close()
		echo := echov1.NewEchoServiceClient(cc)
		for i := range 3 { // the target serves
			_, err = echo.Get(context.Background(), &echov1.GetRequest{RequestId: fmt.Sprint("0-u-warm", i)})
			require.NoError(t, err)
		}
		start := time.Now()
		_, err = echo.Notify(context.Background(), &echov1.NotifyRequest{RequestId: "2-u-a"}) // no deadline
		require.NoError(t, err)
		require.Equal(t, 3, o.CountID(notify, "2-u-a"))
		took := time.Since(start)
		t.Logf("two retries took %v", took)
		assert.LessOrEqual(t, took, 2*interceptor.MaxBackoff)
		assert.GreaterOrEqual(t, took, interceptor.MaxBackoff, "each retry waited in [MaxBackoff/2, MaxBackoff]")
	})
}
