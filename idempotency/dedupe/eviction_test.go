package dedupe_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/stormguard/stormguard/idempotency/dedupe"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// TestEvictionDoesNotReExecuteAWrite: a store of 500 entries; caller Y's
// charge completes; caller X then sends 500 keyed calls; Y's retry of her
// charge must be answered from the store, not run again (a store that
// evicted the least recently used record of anyone charged her twice).
func TestEvictionDoesNotReExecuteAWrite(t *testing.T) {
	for name, flood := range map[string]func(c echov1.EchoServiceClient, ctx context.Context, i int, opts ...grpc.CallOption) error{
		"500 keyed reads": func(c echov1.EchoServiceClient, ctx context.Context, i int, opts ...grpc.CallOption) error {
			_, err := c.Get(ctx, &echov1.GetRequest{RequestId: "x-" + strconv.Itoa(i), Key: "k"}, opts...)
			return err
		},
		"500 keyed writes": func(c echov1.EchoServiceClient, ctx context.Context, i int, opts ...grpc.CallOption) error {
			_, err := c.Charge(ctx, &echov1.ChargeRequest{RequestId: "x-" + strconv.Itoa(i), Account: "x", AmountCents: 1}, opts...)
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			o := origin.New(nil)
			store := dedupe.NewMemoryStore(dedupe.MemoryConfig{MaxEntries: 500})
			s := dedupe.NewServer(dedupe.Config{Store: store})
			c := startEcho(t, o, dedupeOpts(s))

			yReq := &echov1.ChargeRequest{RequestId: "y-charge", Account: "y", AmountCents: 4999}
			first, err := c.Charge(asCaller("caller-y", "y-order-1"), yReq)
			require.NoError(t, err)

			refused := 0
			for i := range 500 {
				var tr metadata.MD
				err := flood(c, asCaller("caller-x", "x-key-"+strconv.Itoa(i)), i, grpc.Trailer(&tr))
				switch status.Code(err) {
				case codes.OK:
				case codes.ResourceExhausted:
					// X may be refused once it holds its share of the
					// store: before its handler runs, and told when to
					// come back.
					refused++
					assert.Len(t, tr.Get("grpc-retry-pushback-ms"), 1, "call %d", i)
				default:
					t.Fatalf("call %d: %v", i, err)
				}
			}
			t.Logf("refused %d of X's 500 calls; store %+v", refused, store.Stats())

			again, err := c.Charge(asCaller("caller-y", "y-order-1"), yReq)
			require.NoError(t, err)
			assert.True(t, proto.Equal(first, again), "Y gets her stored charge back")
			assert.Equal(t, 1, o.CountID(chargeMethod, "y-charge"), "Y's charge ran once")
			_, charges := o.Balance("y")
			assert.Equal(t, 1, charges, "Y charged once")
			ran := o.Count(echov1.EchoService_Get_FullMethodName) + o.Count(chargeMethod) - 1
			assert.Equal(t, 500-refused, ran, "no refused call of X ran")
		})
	}
}

// TestKeysOnOtherMethodsPassThrough: keys on methods that do not need
// deduplication (reads, idempotent and unmarked methods) are not stored: every call runs, and
// nothing takes room in the store.
func TestKeysOnOtherMethodsPassThrough(t *testing.T) {
	o := origin.New(nil)
	store := dedupe.NewMemoryStore(dedupe.MemoryConfig{})
	s := dedupe.NewServer(dedupe.Config{Store: store})
	c := startEcho(t, o, dedupeOpts(s))
	ctx := asCaller("caller", "one-key")
	for range 2 {
		_, err := c.Get(ctx, &echov1.GetRequest{RequestId: "g", Key: "k"})
		require.NoError(t, err)
		_, err = c.Put(ctx, &echov1.PutRequest{RequestId: "p"})
		require.NoError(t, err)
		_, err = c.Notify(ctx, &echov1.NotifyRequest{RequestId: "n"})
		require.NoError(t, err)
	}
	assert.Equal(t, 2, o.CountID(echov1.EchoService_Get_FullMethodName, "g"))
	assert.Equal(t, 2, o.CountID(echov1.EchoService_Put_FullMethodName, "p"))
	assert.Equal(t, 2, o.CountID(echov1.EchoService_Notify_FullMethodName, "n"))
	assert.Equal(t, dedupe.Stats{}, s.Stats())
	assert.Zero(t, store.Stats().Entries)
}
