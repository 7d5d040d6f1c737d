package dedupe_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/dedupe"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// busyWatch is a server interceptor in front of a dedupe Server's: it
// records, per request id, what Busy says of the error the dedupe
// interceptor returned.
type busyWatch struct {
	mu   sync.Mutex
	busy map[string]bool
	code map[string]codes.Code
}

func (w *busyWatch) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	resp, err := handler(ctx, req)
	w.mu.Lock()
	defer w.mu.Unlock()
	id := req.(interface{ GetRequestId() string }).GetRequestId()
	w.busy[id], w.code[id] = dedupe.Busy(err), status.Code(err)
	return resp, err
}

func (w *busyWatch) get(id string) (bool, codes.Code) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.busy[id], w.code[id]
}

func watchBusy(t *testing.T, o *origin.Origin, s *dedupe.Server) (echov1.EchoServiceClient, *busyWatch) {
	w := &busyWatch{busy: map[string]bool{}, code: map[string]codes.Code{}}
	return startEcho(t, o, []grpc.ServerOption{grpc.ChainUnaryInterceptor(w.unary, s.Unary())}), w
}

// TestBusySaysWhichRefusalsWereForRoom: Busy is true for the refusal of a
// keyed request the store had no room for (its room held by a request in
// flight, or a store that answers ResourceExhausted), and false for a
// store that failed, for the handler's own ResourceExhausted and its
// replay, and for success.
func TestBusySaysWhichRefusalsWereForRoom(t *testing.T) {
	t.Run("room held by a request in flight", func(t *testing.T) {
		g := newGate(t)
		o := origin.New(func(c origin.Call) origin.Reply {
			if c.RequestID == "slow" {
				g.block()
			}
			return origin.Reply{}
		})
		s := dedupe.NewServer(dedupe.Config{AllowAnonymous: true, Store: dedupe.NewMemoryStore(dedupe.MemoryConfig{MaxEntries: 1})})
		c, w := watchBusy(t, o, s)
		first := make(chan error, 1)
		go func() {
			_, err := c.Charge(keyed(context.Background(), "a"), &echov1.ChargeRequest{RequestId: "slow"})
			first <- err
		}()
		eventually(t, "first in flight", func() bool { return s.Stats().Misses == 1 })
		_, err := c.Charge(keyed(context.Background(), "b"), &echov1.ChargeRequest{RequestId: "refused"})
		require.Equal(t, codes.ResourceExhausted, status.Code(err))
		busy, _ := w.get("refused")
		assert.True(t, busy)
		g.open()
		require.NoError(t, <-first)
		busy, code := w.get("slow")
		assert.False(t, busy)
		assert.Equal(t, codes.OK, code)
	})
	for _, tc := range []struct {
		err  error
		busy bool
	}{
		{status.Error(codes.ResourceExhausted, "full"), true},
		{errors.New("redis: connection refused"), false},
	} {
		t.Run("a store that answers "+tc.err.Error(), func(t *testing.T) {
			s := dedupe.NewServer(dedupe.Config{AllowAnonymous: true, Store: failingStore{tc.err}})
			c, w := watchBusy(t, origin.New(nil), s)
			_, err := c.Charge(keyed(context.Background(), "k"), &echov1.ChargeRequest{RequestId: "p"})
			require.Error(t, err)
			busy, _ := w.get("p")
			assert.Equal(t, tc.busy, busy)
		})
	}
	t.Run("the handler's ResourceExhausted, stored and replayed", func(t *testing.T) {
		o := origin.New(origin.Always(codes.ResourceExhausted))
		s := dedupe.NewServer(dedupe.Config{AllowAnonymous: true, NotStored: idempotency.Codes(codes.Unavailable)})
		c, w := watchBusy(t, o, s)
		for range 2 {
			_, err := c.Charge(keyed(context.Background(), "k"), &echov1.ChargeRequest{RequestId: "rx"})
			require.Equal(t, codes.ResourceExhausted, status.Code(err))
			busy, _ := w.get("rx")
			assert.False(t, busy)
		}
		assert.Equal(t, 1, o.Total(), "the second was a replay")
		assert.Equal(t, uint64(1), s.Stats().Hits)
	})
}
