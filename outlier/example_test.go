package outlier_test

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
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

// A client of three backends through the policy (round_robin inside), whose
// calls avoid the first backend.
func ExampleDialOption() {
	var eps []resolver.Endpoint
	var origins []*origin.Origin
	for range 3 {
		o := origin.New(nil)
		l, err := origin.TCP()
		if err != nil {
			panic(err)
		}
		srv := origin.Serve(l, o)
		defer srv.Stop()
		origins = append(origins, o)
		eps = append(eps, resolver.Endpoint{Addresses: []resolver.Address{{Addr: l.Target}}})
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
	client := echov1.NewEchoServiceClient(conn)
	// Call until all three backends have answered: connected to each.
	for i := 0; origins[0].Total() == 0 || origins[1].Total() == 0 || origins[2].Total() == 0; i++ {
		if _, err := client.Put(context.Background(), &echov1.PutRequest{RequestId: "warm-up-" + strconv.Itoa(i)}); err != nil {
			panic(err)
		}
	}
	origins[0].Reset()

	ctx := outlier.AvoidContext(context.Background(), eps[0].Addresses[0].Addr)
	ok := 0
	for i := range 30 {
		if _, err := client.Put(ctx, &echov1.PutRequest{RequestId: strconv.Itoa(i)}); err == nil {
			ok++
		}
	}
	fmt.Printf("%d of 30 calls ok, %d sent to the avoided backend\n", ok, origins[0].Total())
	// Output:
	// 30 of 30 calls ok, 0 sent to the avoided backend
}
