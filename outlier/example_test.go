package outlier_test

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/stormguard/stormguard/outlier"
)

// The service config that turns the policy on, with the defaults, and with
// two settings changed.
func ExampleServiceConfig() {
	fmt.Println(outlier.ServiceConfig(outlier.Config{}))
	fmt.Println(outlier.ServiceConfig(outlier.Config{MaxEjectionPercent: 34, BaseEjectionTime: 10 * time.Second}))
	// Output:
	// {"loadBalancingConfig":[{"stormguard_outlier":{}}]}
	// {"loadBalancingConfig":[{"stormguard_outlier":{"maxEjectionPercent":34,"baseEjectionTime":"10s"}}]}
}

// A retry avoids the address its previous attempt went to.
func ExampleAvoidContext() {
	ctx := outlier.AvoidContext(context.Background(), "10.0.0.7:8080")
	ctx = outlier.AvoidContext(ctx, "[::ffff:10.0.0.8]:8080") // spelled as the resolver does
	fmt.Println(outlier.Avoided(ctx))
	// Output:
	// [10.0.0.7:8080 10.0.0.8:8080]
}

// counter is a health service that counts the Checks it answers.
type counter struct {
	healthpb.UnimplementedHealthServer
	n atomic.Int32
}

func (c *counter) Check(context.Context, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	c.n.Add(1)
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

// A client of three backends through the policy (round_robin inside), whose
// calls avoid the first backend.
func ExampleDialOption() {
	var eps []resolver.Endpoint
	var backends []*counter
	for range 3 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			panic(err)
		}
		s := grpc.NewServer()
		c := &counter{}
		healthpb.RegisterHealthServer(s, c)
		go func() { _ = s.Serve(l) }()
		defer s.Stop()
		backends = append(backends, c)
		eps = append(eps, resolver.Endpoint{Addresses: []resolver.Address{{Addr: l.Addr().String()}}})
	}
	r := manual.NewBuilderWithScheme("example")
	r.InitialState(resolver.State{Endpoints: eps})
	conn, err := grpc.NewClient("example:///backends",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithResolvers(r),
		outlier.DialOption(outlier.Config{}),
	)
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)
	// Call until all three backends have answered: connected to each.
	for backends[0].n.Load() == 0 || backends[1].n.Load() == 0 || backends[2].n.Load() == 0 {
		if _, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
			panic(err)
		}
	}
	backends[0].n.Store(0)

	ctx := outlier.AvoidContext(context.Background(), eps[0].Addresses[0].Addr)
	ok := 0
	for range 30 {
		if _, err := client.Check(ctx, &healthpb.HealthCheckRequest{}); err == nil {
			ok++
		}
	}
	fmt.Printf("%d of 30 calls ok, %d sent to the avoided backend\n", ok, backends[0].n.Load())
	// Output:
	// 30 of 30 calls ok, 0 sent to the avoided backend
}
