package dedupe_test

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/dedupe"
)

// These examples use only public packages, so that they can be copied. The
// service is grpc's own health service; its Check stands in for a write,
// and is listed in Config.Methods, as a method of a proto one cannot
// annotate with retry_with_key would be.

// runs is a health service that counts how often its handler ran.
type runs struct {
	healthpb.UnimplementedHealthServer
	n atomic.Int32
}

func (r *runs) Check(context.Context, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	r.n.Add(1)
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

// serve serves h behind the dedupe server dd over an in-memory connection,
// and returns a client connection and a stop function.
func serve(h healthpb.HealthServer, dd *dedupe.Server) (*grpc.ClientConn, func()) {
	l := bufconn.Listen(1 << 20)
	s := grpc.NewServer(grpc.ChainUnaryInterceptor(dd.Unary()), grpc.ChainStreamInterceptor(dd.Stream()))
	healthpb.RegisterHealthServer(s, h)
	go func() { _ = s.Serve(l) }()
	cc, err := grpc.NewClient("passthrough:///dedupe",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return l.DialContext(ctx) }))
	if err != nil {
		panic(err)
	}
	return cc, func() { cc.Close(); s.Stop() }
}

// A server that runs each keyed write once: a retry with the same key and
// request gets the stored outcome; the same key with another request is
// refused. Keys are scoped by the caller's authorization metadata (or TLS
// client certificate).
func ExampleServer() {
	h := &runs{}
	dd := dedupe.NewServer(dedupe.Config{Methods: []string{"/grpc.health.v1.Health/Check"}})
	cc, stop := serve(h, dd)
	defer stop()
	client := healthpb.NewHealthClient(cc)

	// One logical call, one key, however many attempts.
	ctx := metadata.AppendToOutgoingContext(context.Background(),
		"authorization", "Bearer shop-7-token", idempotency.MetadataKey, "order-42")
	req := &healthpb.HealthCheckRequest{Service: "charge alice 19.99"}
	for attempt := 1; attempt <= 2; attempt++ {
		resp, err := client.Check(ctx, req)
		fmt.Println("attempt", attempt, resp.GetStatus(), status.Code(err))
	}
	// The same key with another request is refused, not answered.
	_, err := client.Check(ctx, &healthpb.HealthCheckRequest{Service: "charge alice 29.99"})
	fmt.Println("reused key:", status.Code(err))

	fmt.Println("handler runs:", h.n.Load())
	st := dd.Stats()
	fmt.Println("hits:", st.Hits, "misses:", st.Misses, "conflicts:", st.Conflicts)
	// Output:
	// attempt 1 SERVING OK
	// attempt 2 SERVING OK
	// reused key: InvalidArgument
	// handler runs: 1
	// hits: 1 misses: 1 conflicts: 1
}

// A server whose callers have no identity (plaintext, no credentials)
// refuses their keyed writes, unless it lets them share one anonymous key
// space.
func ExampleConfig_allowAnonymous() {
	for _, allow := range []bool{false, true} {
		dd := dedupe.NewServer(dedupe.Config{AllowAnonymous: allow, Methods: []string{"/grpc.health.v1.Health/Check"}})
		cc, stop := serve(&runs{}, dd)
		ctx := metadata.AppendToOutgoingContext(context.Background(), idempotency.MetadataKey, "order-42")
		_, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{Service: "charge bob 5.00"})
		fmt.Println("AllowAnonymous:", allow, "->", status.Code(err))
		stop()
	}
	// Output:
	// AllowAnonymous: false -> FailedPrecondition
	// AllowAnonymous: true -> OK
}
