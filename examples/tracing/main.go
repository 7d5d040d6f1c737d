package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/stormguard/stormguard/semconv"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	otelconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// ServiceName is the service.name of the exported spans.
const ServiceName = "stormguard-example"

// RootPrefix starts the name of each scenario's root span.
const RootPrefix = "tracing-example/"

// EndpointEnv is the environment variable that, when set, sends the spans
// over OTLP/gRPC to that endpoint (the standard OpenTelemetry variable,
// read by otlptracegrpc).
const EndpointEnv = "OTEL_EXPORTER_OTLP_ENDPOINT"

// runTimeout bounds the whole run, export included.
const runTimeout = 60 * time.Second

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
	err := realMain(ctx, os.Stdout, os.Getenv(EndpointEnv))
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "tracing:", err)
		os.Exit(1)
	}
}

func realMain(ctx context.Context, out io.Writer, endpoint string) error {
	results, spans, err := runExample(ctx, endpoint)
	PrintTree(out, results, spans)
	if err != nil {
		return err
	}
	if endpoint != "" {
		fmt.Fprintf(out, "\nexported %d spans over OTLP/gRPC to %s as service %q\n", len(spans), endpoint, ServiceName)
	}
	return nil
}

// runExample runs the scenarios with a tracer provider that keeps every
// span in memory and, when endpoint is not empty, also exports it over
// OTLP/gRPC. It returns the scenarios' results and the spans recorded; the
// spans have been exported (flushed) when it returns without error.
func runExample(ctx context.Context, endpoint string) ([]Result, tracetest.SpanStubs, error) {
	tel, err := newTelemetry(ctx, endpoint)
	if err != nil {
		return nil, nil, err
	}
	results, runErr := Run(ctx, tel.tp)
	spans := tel.mem.GetSpans() // before Shutdown, which empties mem
	// Shutdown flushes the OTLP exporter: without it the last spans are lost.
	if err := tel.tp.Shutdown(ctx); err != nil {
		return results, spans, errors.Join(runErr, fmt.Errorf("exporting spans to %s: %w", endpoint, err))
	}
	return results, spans, runErr
}

// telemetry is the tracer provider of a run: every span goes to mem, and
// also to an OTLP/gRPC exporter when an endpoint is given.
type telemetry struct {
	tp  *sdktrace.TracerProvider
	mem *tracetest.InMemoryExporter
}

func newTelemetry(ctx context.Context, endpoint string) (*telemetry, error) {
	mem := tracetest.NewInMemoryExporter()
	opts := []sdktrace.TracerProviderOption{
		sdktrace.WithResource(resource.NewWithAttributes(otelconv.SchemaURL, otelconv.ServiceName(ServiceName))),
		sdktrace.WithSyncer(mem),
	}
	if endpoint != "" {
		// otlptracegrpc reads OTEL_EXPORTER_OTLP_ENDPOINT (and the other
		// OTEL_EXPORTER_OTLP_* variables) itself; the endpoint is passed
		// explicitly too so that tests need not set the environment.
		// "http://" means no TLS.
		exp, err := otlptracegrpc.New(ctx, otlptracegrpc.WithEndpointURL(endpoint))
		if err != nil {
			return nil, fmt.Errorf("OTLP exporter for %s: %w", endpoint, err)
		}
		opts = append(opts, sdktrace.WithBatcher(exp))
	}
	return &telemetry{tp: sdktrace.NewTracerProvider(opts...), mem: mem}, nil
}

// Result is what one scenario did.
type Result struct {
	Name    string // scenario name; its root span is RootPrefix+Name
	About   string // one line on what it shows
	TraceID trace.TraceID
	Target  string       // the origin's address, 127.0.0.1:port
	Calls   []CallResult // in call order
}

// CallResult is the outcome of one logical call.
type CallResult struct {
	Method    string     // e.g. "echo.v1.EchoService/Put"
	Code      codes.Code // final status
	Want      codes.Code // what the scenario expects
	RefusedBy interceptor.Reason
}

// scenario is one thing to show: a client configured for it and the calls
// it makes.
type scenario struct {
	name, about string
	client      []interceptor.ClientOption
	calls       []func(context.Context, echov1.EchoServiceClient) (method string, want codes.Code, err error)
}

// Request ids, which the origin's script answers by.
const (
	idRetried   = "retried-twice"
	idBudget    = "budget-refused"
	idHedged    = "hedged"
	idOpener    = "breaker-opener"
	idRejected  = "breaker-rejected"
	idUnmarked  = "unmarked"
	hedgeDelay  = 50 * time.Millisecond
	stallFirst  = 10 * time.Second // the hedged call's first attempt; cancelled when the hedge wins
	callTimeout = 15 * time.Second
)

// script is the origin's behaviour, by request id.
func script(c origin.Call) origin.Reply {
	unavailable := origin.Reply{Code: codes.Unavailable, Message: "origin: unavailable (" + c.RequestID + ")"}
	switch c.RequestID {
	case idRetried:
		if c.Attempt <= 2 {
			return unavailable
		}
		return origin.Reply{}
	case idHedged:
		// The first attempt stalls; the hedge (which carries
		// grpc-previous-rpc-attempts) answers at once.
		if len(c.Metadata.Get(semconv.PreviousAttemptsKey)) == 0 {
			return origin.Reply{Delay: stallFirst}
		}
		return origin.Reply{}
	case idBudget, idOpener, idRejected, idUnmarked:
		return unavailable
	}
	return origin.Reply{Code: codes.NotFound, Message: "origin: unknown request id " + c.RequestID}
}

const (
	put    = "echo.v1.EchoService/Put"
	notify = "echo.v1.EchoService/Notify"
)

func putCall(id string, want codes.Code) func(context.Context, echov1.EchoServiceClient) (string, codes.Code, error) {
	return func(ctx context.Context, echo echov1.EchoServiceClient) (string, codes.Code, error) {
		_, err := echo.Put(ctx, &echov1.PutRequest{RequestId: id, Key: "k", Value: []byte("v")})
		return put, want, err
	}
}

var scenarios = []scenario{
	{
		name:  "retried-twice",
		about: "Put fails twice with UNAVAILABLE, then succeeds: three attempts, two retries scheduled",
		// The budget's start-up burst (it lends 5 retries ahead of the
		// calls that will pay for them) lets one lone call retry twice.
		client: []interceptor.ClientOption{},
		calls:  []func(context.Context, echov1.EchoServiceClient) (string, codes.Code, error){putCall(idRetried, codes.OK)},
	},
	{
		name:   "budget-refused",
		about:  "Put fails; a budget without its start-up burst has no credit for one lone call: the retry is refused",
		client: []interceptor.ClientOption{interceptor.WithBudget(budget.NewRegistry(budget.Config{Burst: -1}))},
		calls:  []func(context.Context, echov1.EchoServiceClient) (string, codes.Code, error){putCall(idBudget, codes.Unavailable)},
	},
	{
		name:   "hedged",
		about:  "Put's first attempt stalls; a hedge sent after 50ms answers first and the first attempt is cancelled",
		client: []interceptor.ClientOption{interceptor.WithHedging(hedgeDelay, 2)},
		calls:  []func(context.Context, echov1.EchoServiceClient) (string, codes.Code, error){putCall(idHedged, codes.OK)},
	},
	{
		name: "breaker-open",
		about: "a Put fails three times in a row (no budget, three attempts), which opens the breaker " +
			"(ConsecutiveFailures 3); the next Put is refused without being sent",
		client: []interceptor.ClientOption{interceptor.WithBudget(nil), interceptor.WithBreaker(&breaker.Config{ConsecutiveFailures: 3})},
		calls: []func(context.Context, echov1.EchoServiceClient) (string, codes.Code, error){
			putCall(idOpener, codes.Unavailable), putCall(idRejected, codes.Unavailable),
		},
	},
	{
		name:  "unmarked",
		about: "Notify has no idempotency option in the proto: it fails once and is not retried",
		calls: []func(context.Context, echov1.EchoServiceClient) (string, codes.Code, error){
			func(ctx context.Context, echo echov1.EchoServiceClient) (string, codes.Code, error) {
				_, err := echo.Notify(ctx, &echov1.NotifyRequest{RequestId: idUnmarked, Message: "hello"})
				return notify, codes.Unavailable, err
			},
		},
	},
}

// Run serves the scripted origin on 127.0.0.1, runs every scenario with a
// client of its own that records spans with tp, and returns what each did.
// Every call ends with the status its scenario expects, or Run returns an
// error saying which did not.
func Run(ctx context.Context, tp trace.TracerProvider) ([]Result, error) {
	l, err := origin.TCP()
	if err != nil {
		return nil, err
	}
	srv := origin.Serve(l, origin.New(script))
	defer srv.Stop()

	tracer := tp.Tracer("github.com/stormguard/stormguard/examples/tracing")
	var results []Result
	var errs []error
	for _, sc := range scenarios {
		res, err := runScenario(ctx, tracer, tp, l, sc)
		results = append(results, res)
		errs = append(errs, err)
	}
	return results, errors.Join(errs...)
}

func runScenario(ctx context.Context, tracer trace.Tracer, tp trace.TracerProvider, l *origin.Listener, sc scenario) (Result, error) {
	res := Result{Name: sc.name, About: sc.about, Target: l.Target}
	guard := interceptor.NewClient(append([]interceptor.ClientOption{interceptor.WithTelemetry(interceptor.Telemetry{TracerProvider: tp})}, sc.client...)...)
	cc, err := l.Dial(grpc.WithChainUnaryInterceptor(guard.Unary()), grpc.WithChainStreamInterceptor(guard.Stream()))
	if err != nil {
		return res, err
	}
	defer cc.Close()
	echo := echov1.NewEchoServiceClient(cc)

	ctx, root := tracer.Start(ctx, RootPrefix+sc.name, trace.WithNewRoot())
	defer root.End()
	res.TraceID = root.SpanContext().TraceID()
	var errs []error
	for _, call := range sc.calls {
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		method, want, err := call(cctx, echo)
		cancel()
		cr := CallResult{Method: method, Code: status.Code(err), Want: want, RefusedBy: interceptor.RefusedBy(err)}
		res.Calls = append(res.Calls, cr)
		if cr.Code != want {
			errs = append(errs, fmt.Errorf("scenario %s: %s ended with %v, want %v (%v)", sc.name, method, cr.Code, want, err))
		}
	}
	return res, errors.Join(errs...)
}
