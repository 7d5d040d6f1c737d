package interceptor_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"net"
	"os"
	"sync/atomic"
	"time"

	"github.com/stormguard/stormguard/semconv"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/interceptor"
)

// These examples use only public packages, so that they can be copied: the
// service is grpc's own health service, served over an in-memory
// connection. Its Check method is not marked idempotent in its proto, so
// the examples mark it with WithIdempotent.

const check = "/grpc.health.v1.Health/Check"

// flakyHealth is a health service that fails its first `fail` Checks with
// UNAVAILABLE, stalls its first `stall` Checks until the caller gives up,
// and counts the Checks it receives.
type flakyHealth struct {
	healthpb.UnimplementedHealthServer
	fail, stall atomic.Int32
	calls       atomic.Int32
}

func (h *flakyHealth) Check(ctx context.Context, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	h.calls.Add(1)
	if h.stall.Add(-1) >= 0 {
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	if h.fail.Add(-1) >= 0 {
		return nil, status.Error(codes.Unavailable, "warming up")
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

// serve serves h on an in-memory listener, behind opts, and returns a
// dialer for it and a stop function.
func serve(h healthpb.HealthServer, opts ...grpc.ServerOption) (grpc.DialOption, func()) {
	l := bufconn.Listen(1 << 20)
	s := grpc.NewServer(opts...)
	healthpb.RegisterHealthServer(s, h)
	go func() { _ = s.Serve(l) }()
	dialer := grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return l.DialContext(ctx) })
	return dialer, s.Stop
}

// A server whose first answer is UNAVAILABLE, and a Client that retries
// it: the body of this example is a complete program (README.md shows it as
// one). Mark the methods that may be repeated in their protos; grpc's
// health service is not marked, so the client marks its Check here.
func Example() {
	// A server whose first answer is UNAVAILABLE, behind the suite's server interceptor.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	var calls atomic.Int32
	failFirst := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if calls.Add(1) == 1 {
			return nil, status.Error(codes.Unavailable, "warming up")
		}
		return h(ctx, req)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(interceptor.NewServer().Unary(), failFirst))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(lis)
	defer srv.Stop()

	// The client. grpc's health Check is not marked in its proto, so mark it here.
	guard := interceptor.NewClient(interceptor.WithIdempotent("/grpc.health.v1.Health/Check"))
	conn, err := grpc.NewClient(lis.Addr().String(),
		append(guard.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	fmt.Println(resp.GetStatus(), err, "after", calls.Load(), "attempts") // SERVING <nil> after 2 attempts
	// Output: SERVING <nil> after 2 attempts
}

// WithIdempotent marks methods of a proto one cannot annotate: without
// it, grpc's health Check is unmarked, and sent once.
func ExampleWithIdempotent() {
	for _, opts := range [][]interceptor.ClientOption{nil, {interceptor.WithIdempotent(check)}} {
		h := &flakyHealth{}
		h.fail.Store(1)
		dialer, stop := serve(h)
		guard := interceptor.NewClient(opts...)
		conn, _ := grpc.NewClient("passthrough:///health",
			append(guard.DialOptions(), dialer, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
		_, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
		fmt.Println(status.Code(err), "after", h.calls.Load(), "attempt(s)")
		conn.Close()
		stop()
	}
	// Output:
	// Unavailable after 1 attempt(s)
	// OK after 2 attempt(s)
}

// WithHedging sends another attempt when the first has not answered after
// the delay; the first answer wins and the other attempt is cancelled.
func ExampleWithHedging() {
	h := &flakyHealth{}
	h.stall.Store(1) // the first attempt hangs
	dialer, stop := serve(h)
	defer stop()

	guard := interceptor.NewClient(interceptor.WithIdempotent(check), interceptor.WithHedging(10*time.Millisecond, 2))
	conn, _ := grpc.NewClient("passthrough:///health",
		append(guard.DialOptions(), dialer, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	defer conn.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	fmt.Println(resp.GetStatus(), err)
	// Output:
	// SERVING <nil>
}

// RefusedBy tells why a failed call was not retried: here the budget, for
// a lone call whose deposit (0.1 of a retry) funds none, with the budget's
// start-up burst turned off.
func ExampleRefusedBy() {
	h := &flakyHealth{}
	h.fail.Store(1 << 30) // down
	dialer, stop := serve(h)
	defer stop()

	guard := interceptor.NewClient(interceptor.WithIdempotent(check), interceptor.WithBudget(budget.NewRegistry(budget.Config{Burst: -1})))
	conn, _ := grpc.NewClient("passthrough:///health",
		append(guard.DialOptions(), dialer, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	defer conn.Close()

	_, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
	fmt.Println(status.Code(err), interceptor.RefusedBy(err), h.calls.Load())
	// Output:
	// Unavailable budget 1
}

// forward is a service whose Check calls another service: a handler in the
// middle of a chain.
type forward struct {
	healthpb.UnimplementedHealthServer
	next healthpb.HealthClient
}

func (f *forward) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	return f.next.Check(ctx, req)
}

// A Server tells its callers not to retry (grpc-retry-pushback-ms: -1) when
// its handler failed because its own call was refused a retry: only the
// layer next to the failure retries, and a chain does not multiply the
// load on a dead dependency.
func ExampleNewServer() {
	down := &flakyHealth{}
	down.fail.Store(1 << 30)
	dialDown, stopDown := serve(down)
	defer stopDown()

	// The middle service calls the dead one through its own Client.
	guard := interceptor.NewClient(interceptor.WithIdempotent(check), interceptor.WithBudget(budget.NewRegistry(budget.Config{Burst: -1})))
	downConn, _ := grpc.NewClient("passthrough:///down",
		append(guard.DialOptions(), dialDown, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	defer downConn.Close()
	srv := interceptor.NewServer(interceptor.WithDedupe(nil))
	dialMiddle, stopMiddle := serve(&forward{next: healthpb.NewHealthClient(downConn)},
		grpc.ChainUnaryInterceptor(srv.Unary()), grpc.ChainStreamInterceptor(srv.Stream()))
	defer stopMiddle()

	conn, _ := grpc.NewClient("passthrough:///middle", dialMiddle, grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer conn.Close()
	var trailer metadata.MD
	_, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
	// The refusal was the middle service's, not this caller's: RefusedBy
	// reports nothing, RefusedDownstream what the middle service said.
	fmt.Println(status.Code(err), interceptor.RefusedDownstream(err), interceptor.RefusedBy(err) == "", trailer.Get(semconv.PushbackKey))
	// Output:
	// Unavailable budget true [-1]
}

// WithHooks reports each decision to the application, here as log/slog
// records; the Client's own rare warnings go to WithLogger's logger.
func ExampleWithHooks() {
	h := &flakyHealth{}
	h.fail.Store(1)
	dialer, stop := serve(h)
	defer stop()

	// A text handler without the time, so that the output is stable.
	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey && len(groups) == 0 {
				return slog.Attr{}
			}
			return a
		},
	}))
	guard := interceptor.NewClient(
		interceptor.WithIdempotent(check),
		interceptor.WithTelemetry(interceptor.Telemetry{Logger: logger}),
		interceptor.WithHooks(interceptor.Hooks{
			OnRetry: func(e interceptor.RetryEvent) {
				logger.Info("retry", "method", e.Method, "attempt", e.Attempt, "cause", status.Code(e.Err))
			},
			OnRefusal: func(e interceptor.RefusalEvent) {
				logger.Warn("refused", "method", e.Method, "reason", e.Reason, "attempts", e.Attempts)
			},
		}),
	)
	conn, _ := grpc.NewClient("passthrough:///health",
		append(guard.DialOptions(), dialer, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	defer conn.Close()

	client := healthpb.NewHealthClient(conn)
	_, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{}) // fails once, then OK
	fmt.Println(err)
	h.fail.Store(1 << 30) // down
	_, err = client.Check(context.Background(), &healthpb.HealthCheckRequest{}, interceptor.MaxAttempts(2))
	fmt.Println(status.Code(err))
	// Output:
	// level=INFO msg=retry method=/grpc.health.v1.Health/Check attempt=2 cause=Unavailable
	// <nil>
	// level=INFO msg=retry method=/grpc.health.v1.Health/Check attempt=2 cause=Unavailable
	// level=WARN msg=refused method=/grpc.health.v1.Health/Check reason=max_attempts attempts=2
	// Unavailable
}
