package deadline_test

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/deadline"
)

func ExampleParseHeader() {
	for _, v := range []string{"250", "0", "9999999999", "-5", "1.5", "250ms", " 250", "12345678901", ""} {
		d, ok := deadline.ParseHeader(v)
		fmt.Printf("%-13q %v %v\n", v, d, ok)
	}
	// Output:
	// "250"         250ms true
	// "0"           0s true
	// "9999999999"  720h0m0s true
	// "-5"          0s false
	// "1.5"         0s false
	// "250ms"       0s false
	// " 250"        0s false
	// "12345678901" 0s false
	// ""            0s false
}

func ExampleFormatHeader() {
	fmt.Println(deadline.FormatHeader(1500*time.Microsecond), deadline.FormatHeader(-time.Second), deadline.FormatHeader(2*time.Second))
	// Output: 1 0 2000
}

func ExampleClient_AttemptContext() {
	c := deadline.NewClient(deadline.ClientConfig{Margin: 10 * time.Millisecond, MarginFraction: 0.1})
	now := time.Now()
	ctx, cancel := context.WithDeadline(context.Background(), now.Add(500*time.Millisecond))
	defer cancel()

	// The first attempt, sent now: 500 ms left, 10 ms + 10% margin.
	attempt, err := c.AttemptContext(ctx, now)
	fmt.Println(metadata.ValueFromOutgoingContext(attempt, deadline.MetadataKey), err)

	// A retry 300 ms later sends what is left then.
	attempt, err = c.AttemptContext(ctx, now.Add(300*time.Millisecond))
	fmt.Println(metadata.ValueFromOutgoingContext(attempt, deadline.MetadataKey), err)

	// Past the deadline, nothing may be sent.
	_, err = c.AttemptContext(ctx, now.Add(time.Second))
	fmt.Println(status.Code(err))
	// Output:
	// [440] <nil>
	// [170] <nil>
	// DeadlineExceeded
}

func ExampleServer_Apply() {
	s := deadline.NewServer(deadline.ServerConfig{})
	// What grpc hands the server: a 10 s grpc-timeout, and a header saying
	// the caller has 200 ms left.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctx = metadata.NewIncomingContext(ctx, metadata.Pairs(deadline.MetadataKey, "200"))

	handlerCtx, done, err := s.Apply(ctx)
	defer done()
	left, _ := deadline.Remaining(handlerCtx)
	fmt.Println(err, left <= 200*time.Millisecond, s.Stats())
	// Output: <nil> true {0 0 1}
}
