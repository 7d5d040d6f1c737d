package dedupe_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// asCaller returns a context for the caller holding token, with key as
// its idempotency key.
func asCaller(token, key string) context.Context {
	return metadata.AppendToOutgoingContext(context.Background(),
		"authorization", "Bearer "+token, "idempotency-key", key)
}

// holdOrigin is a payment service whose handler blocks the requests whose
// request id is "held" until the gate opens.
func holdOrigin(g *gate) *origin.Origin {
	return origin.New(func(c origin.Call) origin.Reply {
		if c.RequestID == "held" {
			g.block()
		}
		return origin.Reply{}
	})
}

// probe is what a caller observes of one call: its code, and whether the
// handler ran for it.
type probe struct {
	code codes.Code
	ran  bool
}

// TestProbingAnotherCallersKeyRevealsNothing: whatever a caller sends with
// a key another caller used (another request, another method, the same
// request while the other's runs), it observes exactly what it observes
// with a key nobody used.
func TestProbingAnotherCallersKeyRevealsNothing(t *testing.T) {
	g := newGate(t)
	o := holdOrigin(g)
	c := dialClient(t, serveDefaults(t, o))

	// Alice's charge completed under "order-7"; another runs under
	// "order-8", held in the handler.
	_, err := c.Charge(asCaller("alice", "order-7"), &echov1.ChargeRequest{RequestId: "a7", Account: "alice", AmountCents: 700})
	require.NoError(t, err)
	held := make(chan error, 1)
	heldReq := &echov1.ChargeRequest{RequestId: "held", Account: "alice", AmountCents: 800}
	go func() {
		_, err := c.Charge(asCaller("alice", "order-8"), heldReq)
		held <- err
	}()
	eventually(t, "alice's charge in flight", func() bool { return o.CountID(chargeMethod, "held") == 1 })

	// ctx bounds each probe; a probe that waits for alice's held charge
	// hits it.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// Each probe is made by a prober of its own, so that probes do not
	// meet each other's keys.
	call := func(prober, key, method, id string) probe {
		before := o.CountID(method, id)
		pctx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+prober, "idempotency-key", key)
		var err error
		switch method {
		case chargeMethod:
			_, err = c.Charge(pctx, &echov1.ChargeRequest{RequestId: id, Account: "mallory", AmountCents: 1})
		case echov1.EchoService_Put_FullMethodName:
			_, err = c.Put(pctx, &echov1.PutRequest{RequestId: id})
		}
		return probe{code: status.Code(err), ran: o.CountID(method, id) > before}
	}
	for name, tc := range map[string]struct {
		used, unused string
		method       string
	}{
		"completed key, another request": {"order-7", "unused-1", chargeMethod},
		"completed key, another method":  {"order-7", "unused-2", echov1.EchoService_Put_FullMethodName},
		"key in flight, another request": {"order-8", "unused-3", chargeMethod},
	} {
		t.Run(name, func(t *testing.T) {
			used := call("mallory-"+name, tc.used, tc.method, "probe-"+tc.used+"-"+name)
			unused := call("mallory-"+name, tc.unused, tc.method, "probe-"+tc.unused)
			assert.Equal(t, unused, used, "a used key must look unused")
			assert.Equal(t, probe{code: codes.OK, ran: true}, used)
		})
	}
	t.Run("key in flight, same request", func(t *testing.T) {
		// The very request alice is running, under her key: mallory's
		// call runs on its own at once, rather than waiting for alice's.
		before := o.CountID(chargeMethod, "held")
		pctx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer mallory-same", "idempotency-key", "order-8")
		done := make(chan error, 1)
		go func() {
			_, err := c.Charge(pctx, heldReq)
			done <- err
		}()
		eventually(t, "mallory's call reached the handler", func() bool { return o.CountID(chargeMethod, "held") == before+1 })
		g.open()
		require.NoError(t, <-done)
	})
	g.open()
	require.NoError(t, <-held)
}

// TestSquattingCannotBlockAnotherCaller: a caller who uses a key first,
// completed or still running, does not block the call another caller later
// makes with that key.
func TestSquattingCannotBlockAnotherCaller(t *testing.T) {
	g := newGate(t)
	o := holdOrigin(g)
	c := dialClient(t, serveDefaults(t, o))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	// Mallory guesses alice's next order numbers and uses them first: one
	// completes, one stays in flight.
	_, err := c.Charge(asCaller("mallory", "order-9"), &echov1.ChargeRequest{RequestId: "squat", Account: "mallory", AmountCents: 1})
	require.NoError(t, err)
	squatting := make(chan error, 1)
	go func() {
		_, err := c.Charge(asCaller("mallory", "order-10"), &echov1.ChargeRequest{RequestId: "held", Account: "mallory", AmountCents: 1})
		squatting <- err
	}()
	eventually(t, "mallory's squat in flight", func() bool { return o.CountID(chargeMethod, "held") == 1 })

	for _, key := range []string{"order-9", "order-10"} {
		kctx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer alice", "idempotency-key", key)
		resp, err := c.Charge(kctx, &echov1.ChargeRequest{RequestId: "alice-" + key, Account: "alice", AmountCents: 900})
		require.NoError(t, err, key)
		assert.Equal(t, "alice-"+key, resp.GetRequestId(), key)
	}
	cents, charges := o.Balance("alice")
	assert.Equal(t, 2, charges, "both of alice's charges ran")
	assert.Equal(t, int64(1800), cents)
	g.open()
	require.NoError(t, <-squatting)
}
