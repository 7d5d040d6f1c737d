package dedupe_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/dedupe"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// loseFirstResponse plays a network that loses the first response of
// method after the server applied it. Installed outermost, it lets the
// handler (and every interceptor inside, such as deduplication) run, then
// answers Unavailable instead of the success.
type loseFirstResponse struct {
	method string

	mu       sync.Mutex
	attempts int
	keys     []string      // the idempotency-key of each attempt
	dropped  proto.Message // the response that was lost
}

func (l *loseFirstResponse) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if info.FullMethod != l.method {
		return handler(ctx, req)
	}
	resp, err := handler(ctx, req)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.attempts++
	l.keys = append(l.keys, metadata.ValueFromIncomingContext(ctx, idempotency.MetadataKey)...)
	if l.attempts == 1 && err == nil {
		l.dropped = resp.(proto.Message)
		return nil, status.Error(codes.Unavailable, "test: the response was lost on its way back")
	}
	return resp, err
}

// TestDoubleCharge is the scenario idempotency keys exist for: the server
// applies a charge, the response is lost, the client retries. With the
// server interceptor the account is charged once and the caller gets the
// original success; without it, twice.
func TestDoubleCharge(t *testing.T) {
	for _, tc := range []struct {
		name        string
		withDedupe  bool
		wantCharges int
	}{
		{"with dedupe charges once", true, 1},
		{"without dedupe charges twice", false, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := origin.New(nil)
			lost := &loseFirstResponse{method: chargeMethod}
			chain := []grpc.UnaryServerInterceptor{lost.intercept}
			dd := dedupe.NewServer(dedupe.Config{AllowAnonymous: true})
			if tc.withDedupe {
				chain = append(chain, dd.Unary())
			}
			// The client: stormguard's, which sends one key on every
			// attempt of a retry_with_key method (no budget, so the lone
			// call may retry; a short backoff).
			guard := interceptor.NewClient(interceptor.WithBudget(nil), interceptor.WithRetryPolicy(interceptor.RetryPolicy{BackoffBase: time.Millisecond, BackoffMax: time.Millisecond}))
			payments := startEcho(t, o, []grpc.ServerOption{grpc.ChainUnaryInterceptor(chain...)},
				grpc.WithChainUnaryInterceptor(guard.Unary()))

			resp, err := payments.Charge(context.Background(),
				&echov1.ChargeRequest{RequestId: "order-1", Account: "acct-1", AmountCents: 4999})
			require.NoError(t, err, "the retry succeeds")

			cents, charges := o.Balance("acct-1")
			assert.Equal(t, tc.wantCharges, charges, "charges applied")
			assert.Equal(t, int64(4999*tc.wantCharges), cents)

			lost.mu.Lock()
			defer lost.mu.Unlock()
			require.Equal(t, 2, lost.attempts, "one lost response, one retry")
			require.Len(t, lost.keys, 2)
			assert.Equal(t, lost.keys[0], lost.keys[1], "the same key on every attempt")
			assert.NoError(t, idempotency.ValidateKey(lost.keys[0]))
			require.NotNil(t, lost.dropped)
			if tc.withDedupe {
				assert.True(t, proto.Equal(lost.dropped, resp), "the caller gets the original success: got %v, lost %v", resp, lost.dropped)
				assert.Equal(t, dedupe.Stats{Hits: 1, Misses: 1}, dd.Stats())
			} else {
				assert.False(t, proto.Equal(lost.dropped, resp), "a second, different charge")
			}
		})
	}
}

// TestHedgedChargeRunsOnce: a retry_with_key method may also be hedged,
// because every attempt carries the same key: the hedge that arrives while
// the first attempt is still running waits for its result instead of
// charging again.
func TestHedgedChargeRunsOnce(t *testing.T) {
	o := origin.New(func(c origin.Call) origin.Reply {
		if c.Attempt == 1 {
			return origin.Reply{Delay: 100 * time.Millisecond} // slow, but it completes
		}
		return origin.Reply{}
	})
	dd := dedupe.NewServer(dedupe.Config{AllowAnonymous: true})
	guard := interceptor.NewClient(interceptor.WithBudget(nil), interceptor.WithHedging(5*time.Millisecond, 3))
	payments := startEcho(t, o, []grpc.ServerOption{grpc.ChainUnaryInterceptor(dd.Unary())},
		grpc.WithChainUnaryInterceptor(guard.Unary()))
	resp, err := payments.Charge(context.Background(), &echov1.ChargeRequest{RequestId: "h", Account: "acct", AmountCents: 100})
	require.NoError(t, err)
	cents, charges := o.Balance("acct")
	assert.Equal(t, 1, charges, "charged once")
	assert.Equal(t, int64(100), cents)
	assert.Equal(t, int64(100), resp.GetBalanceCents())
	assert.Equal(t, 1, o.Total(), "the hedges waited for the first attempt instead of running the handler")
	assert.GreaterOrEqual(t, dd.Stats().Waits, uint64(1))
}
