package idempotency_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	echov1 "github.com/stormguard/stormguard/examples/proto/echo/v1"
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/internal/origin"
)

// retryWithSameKey is a stand-in caller for the double-charge test, until
// stormguard's client interceptor exists: for a retry_with_key method (or
// when the caller gave a key with CallKey or WithKey) it sends one
// idempotency key — the caller's, or a new one per logical call — on every
// attempt, and retries Unavailable up to retries times. Other methods get
// exactly one attempt and no key. No backoff, no budget: it only plays the
// part of a client that retries a write whose response was lost.
func retryWithSameKey(retries int) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		key, ok := idempotency.KeyFromCallOptions(opts)
		if !ok {
			key, ok = idempotency.KeyFromContext(ctx)
		}
		if !ok {
			if idempotency.Lookup(method).Level != idempotency.RetryWithKey {
				return invoker(ctx, method, req, reply, cc, opts...)
			}
			key = idempotency.NewKey() // once per logical call, never per attempt
		}
		ctx = metadata.AppendToOutgoingContext(ctx, idempotency.MetadataKey, key)
		err := invoker(ctx, method, req, reply, cc, opts...)
		for range retries {
			if status.Code(err) != codes.Unavailable {
				break
			}
			err = invoker(ctx, method, req, reply, cc, opts...)
		}
		return err
	}
}

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
		dedupe      bool
		wantCharges int
	}{
		{"with dedupe charges once", true, 1},
		{"without dedupe charges twice", false, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := origin.New(nil)
			lost := &loseFirstResponse{method: chargeMethod}
			chain := []grpc.UnaryServerInterceptor{lost.intercept}
			dedupe := idempotency.NewServer(idempotency.ServerConfig{})
			if tc.dedupe {
				chain = append(chain, dedupe.Unary())
			}
			// The client side: swap retryWithSameKey for stormguard's
			// client interceptor (interceptor.NewClient().Unary()) once it
			// exists; the assertions stay.
			payments := startEcho(t, o, []grpc.ServerOption{grpc.ChainUnaryInterceptor(chain...)},
				grpc.WithChainUnaryInterceptor(retryWithSameKey(3)))

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
			if tc.dedupe {
				assert.True(t, proto.Equal(lost.dropped, resp), "the caller gets the original success: got %v, lost %v", resp, lost.dropped)
				assert.Equal(t, idempotency.Stats{Hits: 1, Misses: 1}, dedupe.Stats())
			} else {
				assert.False(t, proto.Equal(lost.dropped, resp), "a second, different charge")
			}
		})
	}
}

// TestRetryWithSameKeyStandIn checks the stand-in caller itself: the
// caller's own key wins, a CallKey over a WithKey, and unmarked methods get
// neither a key nor a retry.
func TestRetryWithSameKeyStandIn(t *testing.T) {
	o := origin.New(origin.FailFirst(1, codes.Unavailable))
	c := startEcho(t, o, nil, grpc.WithChainUnaryInterceptor(retryWithSameKey(3)))
	ctx := idempotency.WithKey(context.Background(), "from-ctx")

	_, err := c.Charge(ctx, &echov1.ChargeRequest{RequestId: "a"})
	require.NoError(t, err)
	_, err = c.Charge(ctx, &echov1.ChargeRequest{RequestId: "b"}, idempotency.CallKey("from-option"))
	require.NoError(t, err)
	_, err = c.Notify(context.Background(), &echov1.NotifyRequest{RequestId: "n"})
	assert.Equal(t, codes.Unavailable, status.Code(err), "unmarked: one attempt")

	keys := map[string][]string{}
	for _, call := range o.Calls() {
		keys[call.RequestID] = append(keys[call.RequestID], call.Metadata.Get(idempotency.MetadataKey)...)
	}
	assert.Equal(t, []string{"from-ctx", "from-ctx"}, keys["a"])
	assert.Equal(t, []string{"from-option", "from-option"}, keys["b"])
	assert.Empty(t, keys["n"])
	assert.Equal(t, 1, o.CountID(echov1.EchoService_Notify_FullMethodName, "n"))
}
