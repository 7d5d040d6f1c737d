package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/otlptranslator"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// ServiceName is the service.name of the exported metrics (Prometheus's
// target_info).
const ServiceName = "stormguard-metrics-example"

// DefaultListen is where /metrics is served unless told otherwise: the
// port the OpenTelemetry Prometheus exporter conventionally uses.
const DefaultListen = "127.0.0.1:9464"

// Step is the time one tick stands for.
const Step = 10 * time.Millisecond

// callTimeout bounds each call (on the wall clock).
const callTimeout = 5 * time.Second

// Phase is a stretch of ticks in which the orders service behaves one way.
type Phase struct {
	Name     string
	From, To int // ticks [From, To)
	About    string
}

// Phases are the example's traffic, in order.
var Phases = []Phase{
	{"flaky", 0, 300, "every 20th Put fails its first attempt; every 5th Notify fails"},
	{"outage", 300, 800, "every attempt fails with UNAVAILABLE"},
	{"recovery", 800, 1400, "every attempt succeeds"},
}

// Ticks is the number of ticks of the whole run.
const Ticks = 1400

// Config configures a Demo. The zero Config serves /metrics on
// DefaultListen and runs budgets and breakers on the simulated clock.
type Config struct {
	// Listener is where /metrics is served; nil: listen on DefaultListen.
	Listener net.Listener
	// Realtime runs budgets and breakers on the wall clock and paces the
	// ticks Step apart, instead of the simulated clock.
	Realtime bool
	// Seed seeds the breakers' jitter on the simulated clock.
	Seed uint64
}

// Demo is the running example: two origins, a client using the suite, and
// the /metrics endpoint.
type Demo struct {
	cfg            Config
	clock          *simClock // nil when Realtime
	orders, search *origin.Origin
	servers        []*origin.Server
	conns          []*grpc.ClientConn
	ordersClient   echov1.EchoServiceClient
	searchClient   echov1.EchoServiceClient
	mp             *sdkmetric.MeterProvider
	ln             net.Listener
	httpSrv        *http.Server
	httpDone       chan struct{}
}

// Start starts the origins and the /metrics endpoint and connects the
// client; Run sends the traffic. Close stops everything.
func Start(cfg Config) (_ *Demo, err error) {
	d := &Demo{cfg: cfg, httpDone: make(chan struct{})}
	defer func() {
		if err != nil {
			d.Close()
		}
	}()
	if !cfg.Realtime {
		d.clock = newSimClock()
	}

	// Metrics: the OpenTelemetry Prometheus exporter is a Reader of the
	// MeterProvider, registered in its own Prometheus registry.
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(
		otelprom.WithRegisterer(reg),
		// Prometheus-style names (stormguard_client_calls_total), whatever
		// the scraper asks for.
		otelprom.WithTranslationStrategy(otlptranslator.UnderscoreEscapingWithSuffixes),
	)
	if err != nil {
		return nil, fmt.Errorf("prometheus exporter: %w", err)
	}
	d.mp = sdkmetric.NewMeterProvider(
		sdkmetric.WithResource(resource.NewWithAttributes(semconv.SchemaURL, semconv.ServiceName(ServiceName))),
		sdkmetric.WithReader(exp),
		sdkmetric.WithView(durationBuckets()),
	)

	d.ln = cfg.Listener
	if d.ln == nil {
		if d.ln, err = net.Listen("tcp", DefaultListen); err != nil {
			return nil, fmt.Errorf("listening for /metrics: %w", err)
		}
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	d.httpSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		defer close(d.httpDone)
		_ = d.httpSrv.Serve(d.ln)
	}()

	// The two services the client calls, each behind the suite's server
	// interceptors, on 127.0.0.1 with a free port.
	d.orders = origin.New(ordersScript)
	d.search = origin.New(searchScript)
	for _, o := range []*origin.Origin{d.orders, d.search} {
		l, err := origin.TCP()
		if err != nil {
			return nil, err
		}
		srv := interceptor.NewServer()
		d.servers = append(d.servers, origin.Serve(l, o,
			grpc.ChainUnaryInterceptor(srv.Unary()),
			grpc.ChainStreamInterceptor(srv.Stream())))
	}

	// The client: the suite with its defaults, its metrics going to the
	// MeterProvider above.
	budgetCfg, breakerCfg := budget.Config{}, breaker.Config{}
	if d.clock != nil {
		budgetCfg.Now = d.clock.Now
		breakerCfg.Now = d.clock.Now
		breakerCfg.Rand = lockedRand(cfg.Seed)
	}
	guard := interceptor.NewClient(
		interceptor.WithMeterProvider(d.mp),
		interceptor.WithBudget(budgetCfg),
		interceptor.WithBreaker(breakerCfg),
	)
	for _, s := range d.servers {
		conn, err := s.Listener.Dial(
			grpc.WithChainUnaryInterceptor(guard.Unary()),
			grpc.WithChainStreamInterceptor(guard.Stream()),
		)
		if err != nil {
			return nil, err
		}
		d.conns = append(d.conns, conn)
	}
	d.ordersClient = echov1.NewEchoServiceClient(d.conns[0])
	d.searchClient = echov1.NewEchoServiceClient(d.conns[1])
	return d, nil
}

// MetricsAddr is the address /metrics is served on.
func (d *Demo) MetricsAddr() string { return d.ln.Addr().String() }

// Targets returns the orders and search services' addresses (the
// server_address and server_port labels of their series).
func (d *Demo) Targets() (orders, search string) {
	return d.servers[0].Listener.Target, d.servers[1].Listener.Target
}

// Close stops the client, the origins and the /metrics endpoint.
func (d *Demo) Close() {
	for _, c := range d.conns {
		_ = c.Close()
	}
	for _, s := range d.servers {
		s.Stop()
	}
	if d.httpSrv != nil {
		_ = d.httpSrv.Close()
		<-d.httpDone
	} else if d.ln != nil {
		_ = d.ln.Close()
	}
	if d.mp != nil {
		_ = d.mp.Shutdown(context.Background())
	}
}

// Tally counts what the calls to one service did, as the caller and the
// service saw them.
type Tally struct {
	Calls, OK, Failed int
	// Attempts is the number of attempts that reached the service.
	Attempts int
	// RefusedBy counts the failed calls by interceptor.RefusedBy: the
	// reason the suite attached when it refused a retry or the call.
	RefusedBy map[interceptor.Reason]int
}

// PhaseReport is what one phase did.
type PhaseReport struct {
	Phase          Phase
	Orders, Search Tally
}

// Run sends the traffic, one call to each service per tick, and reports
// each phase.
func (d *Demo) Run(ctx context.Context) ([]PhaseReport, error) {
	var reports []PhaseReport
	start := time.Now()
	for _, ph := range Phases {
		r := PhaseReport{Phase: ph}
		r.Orders.RefusedBy = map[interceptor.Reason]int{}
		r.Search.RefusedBy = map[interceptor.Reason]int{}
		ordersBefore, searchBefore := d.orders.Total(), d.search.Total()
		for tick := ph.From; tick < ph.To; tick++ {
			if err := d.pace(ctx, start, tick); err != nil {
				return reports, err
			}
			if err := ctx.Err(); err != nil {
				return reports, err
			}
			if err := r.Orders.add(d.callOrders(ctx, tick)); err != nil {
				return reports, fmt.Errorf("orders, tick %d: %w", tick, err)
			}
			if err := r.Search.add(d.callSearch(ctx, tick)); err != nil {
				return reports, fmt.Errorf("search, tick %d: %w", tick, err)
			}
		}
		r.Orders.Attempts = d.orders.Total() - ordersBefore
		r.Search.Attempts = d.search.Total() - searchBefore
		reports = append(reports, r)
	}
	return reports, nil
}

// pace moves the simulated clock to the tick, or, in real time, waits for
// it.
func (d *Demo) pace(ctx context.Context, start time.Time, tick int) error {
	if d.clock != nil {
		d.clock.Set(time.Duration(tick) * Step)
		return nil
	}
	wait := time.Until(start.Add(time.Duration(tick) * Step))
	if wait <= 0 {
		return nil
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// callOrders makes the tick's call to orders: a Notify every 10th tick
// (unmarked in the proto: sent exactly once), a Put otherwise (IDEMPOTENT).
func (d *Demo) callOrders(ctx context.Context, tick int) error {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	if tick%10 == 0 {
		_, err := d.ordersClient.Notify(ctx, &echov1.NotifyRequest{RequestId: requestID("notify", tick), Message: "tick"})
		return err
	}
	_, err := d.ordersClient.Put(ctx, &echov1.PutRequest{RequestId: requestID("put", tick), Key: "k", Value: []byte("v")})
	return err
}

// callSearch makes the tick's call to search: a Get (NO_SIDE_EFFECTS,
// hedged after an adaptive delay).
func (d *Demo) callSearch(ctx context.Context, tick int) error {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	_, err := d.searchClient.Get(ctx, &echov1.GetRequest{RequestId: requestID("get", tick), Key: "k"})
	return err
}

// add counts a call's outcome. It returns err when the call failed with
// another status than the scripts' UNAVAILABLE: the demo did not go as
// designed (or the caller left).
func (t *Tally) add(err error) error {
	t.Calls++
	if err == nil {
		t.OK++
		return nil
	}
	t.Failed++
	if r := interceptor.RefusedBy(err); r != "" {
		t.RefusedBy[r]++
	}
	if status.Code(err) != codes.Unavailable {
		return err
	}
	return nil
}

// The services' scripts answer each attempt by its request id
// ("put-<tick>") and attempt number, so that every run fails the same
// attempts.

var errUnavailable = origin.Reply{Code: codes.Unavailable, Message: "orders: unavailable"}

func ordersScript(c origin.Call) origin.Reply {
	kind, tick := parseID(c.RequestID)
	switch phaseOf(tick) {
	case "flaky":
		if c.Attempt == 1 && (kind == "put" && tick%20 == 7 || kind == "notify" && tick%50 == 0) {
			return errUnavailable
		}
	case "outage":
		return errUnavailable
	}
	return origin.Reply{}
}

func searchScript(c origin.Call) origin.Reply {
	if _, tick := parseID(c.RequestID); c.Attempt == 1 && tick%25 == 3 {
		return origin.Reply{Delay: 500 * time.Millisecond} // stops early when the call is done
	}
	return origin.Reply{}
}

func requestID(kind string, tick int) string { return kind + "-" + strconv.Itoa(tick) }

func parseID(id string) (kind string, tick int) {
	i := strings.LastIndexByte(id, '-')
	if i < 0 {
		return id, -1
	}
	n, err := strconv.Atoi(id[i+1:])
	if err != nil {
		return id, -1
	}
	return id[:i], n
}

func phaseOf(tick int) string {
	for _, ph := range Phases {
		if tick >= ph.From && tick < ph.To {
			return ph.Name
		}
	}
	return ""
}

// durationBuckets gives the suite's call-duration histogram bucket
// boundaries in seconds, from 100 µs to 10 s, so that
// histogram_quantile has something to work with.
func durationBuckets() sdkmetric.View {
	return sdkmetric.NewView(
		sdkmetric.Instrument{
			Name:  "*.client.call.duration",
			Kind:  sdkmetric.InstrumentKindHistogram,
			Scope: instrumentation.Scope{Name: interceptor.ScopeName},
		},
		sdkmetric.Stream{Aggregation: sdkmetric.AggregationExplicitBucketHistogram{
			Boundaries: []float64{0.0001, 0.0003, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1, 3, 10},
		}},
	)
}

// simClock is the budgets' and breakers' clock when not in real time: it
// stands still between ticks, so that their decisions depend on the ticks
// alone. It is safe for concurrent use.
type simClock struct {
	base time.Time
	off  atomic.Int64
}

func newSimClock() *simClock { return &simClock{base: time.Now()} }

func (c *simClock) Now() time.Time { return c.base.Add(time.Duration(c.off.Load())) }

func (c *simClock) Set(d time.Duration) { c.off.Store(int64(d)) }

// lockedRand returns a seeded random source in [0, 1) safe for concurrent
// use, for the breakers' jitter.
func lockedRand(seed uint64) func() float64 {
	var mu sync.Mutex
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	return func() float64 {
		mu.Lock()
		defer mu.Unlock()
		return r.Float64()
	}
}
