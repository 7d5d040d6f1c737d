package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	echov1 "github.com/stormguard/stormguard/examples/proto/echo/v1"
	"github.com/stormguard/stormguard/internal/origin"
)

func main() {
	callers := flag.Int("callers", 50, "concurrent callers")
	flag.Bool("quick", false, "run the quick subset (all scenarios are quick for now)")
	flag.Parse()
	if err := run(*callers); err != nil {
		fmt.Fprintln(os.Stderr, "stormlab:", err)
		os.Exit(1)
	}
}

// naiveRetry is the "retry=3" interceptor everybody writes: up to three
// attempts on Unavailable, no budget, no breaker, no backoff.
func naiveRetry(attempts int) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		var err error
		for range attempts {
			if err = invoker(ctx, method, req, reply, cc, opts...); status.Code(err) != codes.Unavailable {
				return err
			}
		}
		return err
	}
}

func run(callers int) error {
	fmt.Println("scenario 1: outage, one hop —", callers, "concurrent callers, origin always UNAVAILABLE")
	fmt.Printf("%-32s %8s %8s %6s\n", "policy", "origin", "ampl.", "ok")
	for _, p := range []struct {
		name     string
		attempts int
	}{{"no retries", 1}, {"3 attempts, no budget", 3}} {
		seen, ok, err := outage(callers, p.attempts)
		if err != nil {
			return err
		}
		fmt.Printf("%-32s %8d %7.2fx %6d\n", p.name, seen, float64(seen)/float64(callers), ok)
	}
	return nil
}

func outage(callers, attempts int) (seen, ok int, err error) {
	l, err := origin.TCP()
	if err != nil {
		return 0, 0, err
	}
	o := origin.New(origin.Always(codes.Unavailable))
	srv := origin.Serve(l, o)
	defer srv.Stop()
	cc, err := l.Dial(grpc.WithChainUnaryInterceptor(naiveRetry(attempts)))
	if err != nil {
		return 0, 0, err
	}
	defer cc.Close()
	client := echov1.NewEchoServiceClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var mu sync.Mutex
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := client.Get(ctx, &echov1.GetRequest{RequestId: fmt.Sprint(i)})
			if err == nil {
				mu.Lock()
				ok++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return o.Total(), ok, nil
}
