package dedupe_test

import (
	"context"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/dedupe"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// A payment server that deduplicates retried charges, and a client that
// retries one with the same key. Keys are scoped by the caller's
// authorization metadata (or TLS client certificate).
func ExampleServer() {
	dd := dedupe.NewServer(dedupe.Config{})
	payments := origin.New(nil) // the demo EchoService: Charge moves money
	l := origin.Bufconn()
	srv := origin.Serve(l, payments,
		grpc.ChainUnaryInterceptor(dd.Unary()),
		grpc.ChainStreamInterceptor(dd.Stream()))
	defer srv.Stop()
	cc, err := l.Dial()
	if err != nil {
		panic(err)
	}
	defer cc.Close()
	client := echov1.NewEchoServiceClient(cc)

	// One logical call, one key, however many attempts.
	ctx := metadata.AppendToOutgoingContext(context.Background(),
		"authorization", "Bearer shop-7-token", idempotency.MetadataKey, "order-42")
	req := &echov1.ChargeRequest{RequestId: "order-42", Account: "alice", AmountCents: 1999}
	for attempt := 1; attempt <= 2; attempt++ {
		resp, err := client.Charge(ctx, req)
		fmt.Println("attempt", attempt, resp.GetChargeId(), status.Code(err))
	}
	// The same key with another amount is refused, not answered.
	req.AmountCents = 2999
	_, err = client.Charge(ctx, req)
	fmt.Println("reused key:", status.Code(err))

	cents, charges := payments.Balance("alice")
	fmt.Println("charges:", charges, "cents:", cents)
	st := dd.Stats()
	fmt.Println("hits:", st.Hits, "misses:", st.Misses, "conflicts:", st.Conflicts)
	// Output:
	// attempt 1 ch_1 OK
	// attempt 2 ch_1 OK
	// reused key: InvalidArgument
	// charges: 1 cents: 1999
	// hits: 1 misses: 1 conflicts: 1
}

// A server whose callers have no identity (plaintext, no credentials)
// refuses their keyed writes, unless it lets them share one anonymous key
// space.
func ExampleConfig_allowAnonymous() {
	for _, allow := range []bool{false, true} {
		dd := dedupe.NewServer(dedupe.Config{AllowAnonymous: allow})
		l := origin.Bufconn()
		srv := origin.Serve(l, origin.New(nil), grpc.ChainUnaryInterceptor(dd.Unary()))
		cc, err := l.Dial()
		if err != nil {
			panic(err)
		}
		ctx := metadata.AppendToOutgoingContext(context.Background(), idempotency.MetadataKey, "order-42")
		_, err = echov1.NewEchoServiceClient(cc).Charge(ctx, &echov1.ChargeRequest{RequestId: "order-42", Account: "bob", AmountCents: 500})
		fmt.Println("AllowAnonymous:", allow, "->", status.Code(err))
		cc.Close()
		srv.Stop()
	}
	// Output:
	// AllowAnonymous: false -> FailedPrecondition
	// AllowAnonymous: true -> OK
}
