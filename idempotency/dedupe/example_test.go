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
// retries one with the same key.
func ExampleServer() {
	dd := dedupe.NewServer(dedupe.Config{
		// Scope keys by caller, e.g. from auth info; here a header.
		Identity: func(ctx context.Context) string {
			if v := metadata.ValueFromIncomingContext(ctx, "x-tenant"); len(v) == 1 {
				return v[0]
			}
			return ""
		},
	})
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
		"x-tenant", "shop-7", idempotency.MetadataKey, "order-42")
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
