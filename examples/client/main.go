package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/interceptor"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// flushTimeout bounds the export of the last spans at exit.
const flushTimeout = 5 * time.Second

type config struct {
	addr    string
	timeout time.Duration
}

func main() {
	var cfg config
	flag.StringVar(&cfg.addr, "addr", "127.0.0.1:50051", "address of the example server")
	flag.DurationVar(&cfg.timeout, "timeout", 2*time.Second, "deadline of each call")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "client:", err)
		os.Exit(1)
	}
}

// errNoneSucceeded is returned when every call failed.
var errNoneSucceeded = errors.New("no call succeeded: is the server running at -addr?")

// run makes the demo calls against cfg.addr, printing outcomes and spans
// to out.
func run(ctx context.Context, cfg config, out io.Writer) (err error) {
	tp, where, err := tracerProvider(ctx, out)
	if err != nil {
		return err
	}
	defer func() {
		fctx, cancel := context.WithTimeout(context.Background(), flushTimeout)
		defer cancel()
		err = errors.Join(err, tp.Shutdown(fctx))
	}()
	fmt.Fprintf(out, "client: calling %s through stormguard; spans go to %s\n", cfg.addr, where)

	guard := interceptor.NewClient(interceptor.WithTelemetry(interceptor.Telemetry{TracerProvider: tp}))
	cc, err := grpc.NewClient(cfg.addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDisableRetry(), // the suite retries; grpc's own must not stack
		grpc.WithChainUnaryInterceptor(guard.Unary()),
		grpc.WithChainStreamInterceptor(guard.Stream()),
	)
	if err != nil {
		return err
	}
	defer cc.Close()
	if ok := demo(ctx, echov1.NewEchoServiceClient(cc), cfg.timeout, out); ok == 0 {
		return errNoneSucceeded
	}
	return nil
}

// tracerProvider exports over OTLP/gRPC when the standard environment
// variables name an endpoint, and to out otherwise.
func tracerProvider(ctx context.Context, out io.Writer) (*sdktrace.TracerProvider, string, error) {
	res := resource.NewSchemaless(attribute.String("service.name", "stormguard-example-client"))
	for _, v := range []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"} {
		if ep := os.Getenv(v); ep != "" {
			exp, err := otlptracegrpc.New(ctx)
			if err != nil {
				return nil, "", err
			}
			return sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res)), "OTLP/gRPC " + ep, nil
		}
	}
	exp, err := stdouttrace.New(stdouttrace.WithWriter(out), stdouttrace.WithPrettyPrint())
	if err != nil {
		return nil, "", err
	}
	// A syncer prints each span as it ends: the attempts, then their call.
	return sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithResource(res)), "stdout", nil
}

// demo makes one call of each kind and prints its outcome; it returns how
// many succeeded.
func demo(ctx context.Context, c echov1.EchoServiceClient, timeout time.Duration, out io.Writer) (ok int) {
	calls := []struct {
		name, why string
		call      func(context.Context) (string, error)
	}{
		{"Get", "NO_SIDE_EFFECTS: retried, hedged after an adaptive delay", func(ctx context.Context) (string, error) {
			r, err := c.Get(ctx, &echov1.GetRequest{RequestId: "get-1", Key: "greeting"})
			return fmt.Sprintf("value %q", r.GetValue()), err
		}},
		{"Charge", "retry_with_key: retried with the same generated idempotency key", func(ctx context.Context) (string, error) {
			r, err := c.Charge(ctx, &echov1.ChargeRequest{RequestId: "charge-1", Account: "acct-1", AmountCents: 1250})
			return fmt.Sprintf("%s, balance %d cents", r.GetChargeId(), r.GetBalanceCents()), err
		}},
		{"Put", "IDEMPOTENT: retried", func(ctx context.Context) (string, error) {
			_, err := c.Put(ctx, &echov1.PutRequest{RequestId: "put-1", Key: "greeting", Value: []byte("hello")})
			return "stored", err
		}},
		{"Notify", "unmarked: sent exactly once", func(ctx context.Context) (string, error) {
			_, err := c.Notify(ctx, &echov1.NotifyRequest{RequestId: "notify-1", Message: "hi"})
			return "acknowledged", err
		}},
		{"Get", "reads what Put stored", func(ctx context.Context) (string, error) {
			r, err := c.Get(ctx, &echov1.GetRequest{RequestId: "get-2", Key: "greeting"})
			return fmt.Sprintf("value %q", r.GetValue()), err
		}},
		{"List", "NO_SIDE_EFFECTS stream: retried until the first response", func(ctx context.Context) (string, error) {
			s, err := c.List(ctx, &echov1.ListRequest{RequestId: "list-1", Count: 3})
			if err != nil {
				return "", err
			}
			n := 0
			for {
				if _, err := s.Recv(); errors.Is(err, io.EOF) {
					return fmt.Sprintf("%d items", n), nil
				} else if err != nil {
					return "", err
				}
				n++
			}
		}},
	}
	for _, k := range calls {
		cctx, cancel := context.WithTimeout(ctx, timeout)
		what, err := k.call(cctx)
		cancel()
		if err == nil {
			ok++
			fmt.Fprintf(out, "==> %s (%s): OK, %s\n", k.name, k.why, what)
			continue
		}
		st := status.Convert(err)
		refused := ""
		if r := interceptor.RefusedBy(err); r != "" {
			refused = fmt.Sprintf(" [retry refused by %s]", r)
		}
		fmt.Fprintf(out, "==> %s (%s): %s: %s%s\n", k.name, k.why, st.Code(), st.Message(), refused)
	}
	return ok
}
