package interceptor_test

import (
	"context"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// A Put (IDEMPOTENT) whose first attempt fails is retried; a Notify
// (unmarked) is sent once, whatever happens.
func Example() {
	o := origin.New(origin.FailFirst(1, codes.Unavailable))
	l := origin.Bufconn()
	srv := origin.Serve(l, o)
	defer srv.Stop()

	guard := interceptor.NewClient()
	conn, err := l.Dial( // insecure, grpc.WithDisableRetry()
		grpc.WithChainUnaryInterceptor(guard.Unary()),
		grpc.WithChainStreamInterceptor(guard.Stream()),
	)
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	echo := echov1.NewEchoServiceClient(conn)

	_, err = echo.Put(context.Background(), &echov1.PutRequest{RequestId: "p"})
	fmt.Println("Put:", status.Code(err), "after", o.CountID(echov1.EchoService_Put_FullMethodName, "p"), "attempts")
	_, err = echo.Notify(context.Background(), &echov1.NotifyRequest{RequestId: "n"})
	fmt.Println("Notify:", status.Code(err), "after", o.CountID(echov1.EchoService_Notify_FullMethodName, "n"), "attempt")
	// Output:
	// Put: OK after 2 attempts
	// Notify: Unavailable after 1 attempt
}

// RefusedBy tells why a failed call was not retried.
func ExampleRefusedBy() {
	o := origin.New(origin.Always(codes.Unavailable))
	l := origin.Bufconn()
	srv := origin.Serve(l, o)
	defer srv.Stop()
	guard := interceptor.NewClient()
	conn, _ := l.Dial(grpc.WithChainUnaryInterceptor(guard.Unary()))
	defer conn.Close()
	echo := echov1.NewEchoServiceClient(conn)

	// A lone call: its deposit (0.1) funds no retry, the floor funds one.
	_, err := echo.Put(context.Background(), &echov1.PutRequest{})
	fmt.Println(status.Code(err), interceptor.RefusedBy(err), o.Total())
	// Output:
	// Unavailable budget 2
}
