package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"path"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/otlptranslator"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/breakerrand"
	"github.com/stormguard/stormguard/internal/clock"
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

// callTimeout bounds each call in real time (-realtime). On the simulated
// clock calls carry no deadline: see Demo.callContext.
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
	{"outage", 300, 1700, "every attempt fails with UNAVAILABLE"},
	{"recovery", 1700, Ticks, "every attempt succeeds"},
}

// Ticks is the number of ticks of the whole run (24 s of simulated time).
const Ticks = 2400

// Config configures a Demo. The zero Config serves /metrics on
// DefaultListen and runs the Client on the simulated clock.
type Config struct {
	// Listener is where /metrics is served; nil: listen on DefaultListen.
	Listener net.Listener
	// Realtime runs the client on the wall clock and paces the ticks Step
	// apart, instead of the simulated clock.
	Realtime bool
	// Seed seeds the breakers' jitter on the simulated clock.
	Seed uint64
	// Pace, on the simulated clock, is the least wall-clock time a tick
	// takes (0: as fast as the calls go). It changes no decision: the
	// end-to-end test slows the traffic down so that Prometheus scrapes the
	// counters while they grow.
	Pace time.Duration
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

	tick   atomic.Int64 // the tick being sent, for the hooks
	mu     sync.Mutex   // guards events
	events []event      // what the hooks saw since the phase began

	inc *incidents // the incidents (incidents.go)
}

// event is a refusal or a breaker change seen by the Client's hooks.
type event struct {
	tick     int
	target   string
	method   string             // a breaker change's method, "Put"
	reason   interceptor.Reason // a refusal
	from, to breaker.State      // a breaker change (when reason is "")
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
	// MeterProvider above. On the simulated clock the whole Client (its
	// budgets, breakers, per-endpoint windows, deadlines, latencies, and
	// the timers of its backoffs and hedges) runs on that clock, and the
	// breakers' jitter is seeded.
	opts := []interceptor.ClientOption{
		interceptor.WithTelemetry(interceptor.Telemetry{MeterProvider: d.mp}),
		interceptor.WithHooks(interceptor.Hooks{
			OnRefusal: func(e interceptor.RefusalEvent) { d.record(event{target: e.Target, reason: e.Reason}) },
			OnBreakerChange: func(e interceptor.BreakerEvent) {
				d.record(event{target: e.Target, method: path.Base(e.Method), from: e.From, to: e.To})
			},
		}),
	}
	if d.clock != nil {
		var bc breaker.Config
		breakerrand.Set(&bc, lockedRand(cfg.Seed))
		opts = append(opts,
			clock.ClientOption(d.clock.Now, d.clock.NewTimer).(interceptor.ClientOption),
			interceptor.WithBreaker(&bc),
		)
	}
	guard := interceptor.NewClient(opts...)
	for _, s := range d.servers {
		// DialOptions: grpc-go's own retries off, the suite's interceptors on.
		conn, err := grpc.NewClient(s.Listener.Target, s.Listener.ConnectOptions(guard.DialOptions()...)...)
		if err != nil {
			return nil, err
		}
		d.conns = append(d.conns, conn)
	}
	d.ordersClient = echov1.NewEchoServiceClient(d.conns[0])
	d.searchClient = echov1.NewEchoServiceClient(d.conns[1])
	if err := d.startIncidents(); err != nil {
		return nil, err
	}
	return d, nil
}

// MetricsAddr is the address /metrics is served on.
func (d *Demo) MetricsAddr() string { return d.ln.Addr().String() }

// Targets returns the orders and search services' addresses (the
// server_address and server_port labels of their series).
func (d *Demo) Targets() (orders, search string) {
	return d.servers[0].Listener.Target, d.servers[1].Listener.Target
}

// Close stops the client, the origins, the incidents and the /metrics
// endpoint.
func (d *Demo) Close() {
	if d.inc != nil {
		d.inc.close()
	}
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
	// reason the suite attached, for the caller to read, when it refused a
	// retry or the call (budget, breaker, deadline, pushback).
	RefusedBy map[interceptor.Reason]int
	// Refusals counts every refusal of a retry, a hedge or a call by
	// reason, as interceptor.Hooks.OnRefusal reported them (what the
	// stormguard.client.refusals metric counts), with the ticks of the
	// first and the last.
	Refusals map[interceptor.Reason]Seen
}

// Seen counts events and says at which ticks the first and the last were.
type Seen struct{ N, First, Last int }

// BreakerChange is a change of state of the breaker of one method of a
// service (interceptor.Hooks.OnBreakerChange; the suite keeps a breaker per
// target and method), at a tick.
type BreakerChange struct {
	Tick     int
	Service  string // "orders" or "search"
	Method   string // "Put", "Notify" or "Get"
	From, To breaker.State
}

// PhaseReport is what one phase did.
type PhaseReport struct {
	Phase          Phase
	Orders, Search Tally
	Breakers       []BreakerChange
}

// Run sends the traffic, one call to each service per tick, and reports
// each phase.
func (d *Demo) Run(ctx context.Context) ([]PhaseReport, error) {
	var reports []PhaseReport
	start := time.Now()
	for _, ph := range Phases {
		r := PhaseReport{Phase: ph}
		ordersBefore, searchBefore := d.orders.Total(), d.search.Total()
		for _, t := range []*Tally{&r.Orders, &r.Search} {
			t.RefusedBy = map[interceptor.Reason]int{}
			t.Refusals = map[interceptor.Reason]Seen{}
		}
		err := d.runPhase(ctx, start, ph, &r)
		r.Orders.Attempts = d.orders.Total() - ordersBefore
		r.Search.Attempts = d.search.Total() - searchBefore
		d.collect(&r)
		reports = append(reports, r)
		if err != nil {
			return reports, err
		}
	}
	return reports, nil
}

// runPhase sends the phase's ticks, counting the callers' outcomes in r.
func (d *Demo) runPhase(ctx context.Context, start time.Time, ph Phase, r *PhaseReport) error {
	for tick := ph.From; tick < ph.To; tick++ {
		if err := d.pace(ctx, start, tick); err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := r.Orders.add(d.callOrders(ctx, tick)); err != nil {
			return fmt.Errorf("orders, tick %d: %w", tick, err)
		}
		if err := r.Search.add(d.callSearch(ctx, tick)); err != nil {
			return fmt.Errorf("search, tick %d: %w", tick, err)
		}
	}
	return nil
}

// record keeps what a hook saw, at the current tick.
func (d *Demo) record(e event) {
	e.tick = int(d.tick.Load())
	d.mu.Lock()
	d.events = append(d.events, e)
	d.mu.Unlock()
}

// collect moves the hooks' events into the phase's report.
func (d *Demo) collect(r *PhaseReport) {
	d.mu.Lock()
	events := d.events
	d.events = nil
	d.mu.Unlock()
	orders, _ := d.Targets()
	for _, e := range events {
		service, t := "search", &r.Search
		// Refusals name the ClientConn's target, breakers the canonical
		// one ("dns:///host:port").
		if strings.TrimPrefix(e.target, "dns:///") == orders {
			service, t = "orders", &r.Orders
		}
		if e.reason == "" {
			r.Breakers = append(r.Breakers, BreakerChange{Tick: e.tick, Service: service, Method: e.method, From: e.from, To: e.to})
			continue
		}
		c, ok := t.Refusals[e.reason]
		if !ok {
			c.First = e.tick
		}
		c.N++
		c.Last = e.tick
		t.Refusals[e.reason] = c
	}
}

// pace moves the simulated clock to the tick, or, in real time, waits for
// it. On the simulated clock it also waits, if Config.Pace says so, until
// the tick's time at that pace.
func (d *Demo) pace(ctx context.Context, start time.Time, tick int) error {
	d.tick.Store(int64(tick))
	perTick := Step
	if d.clock != nil {
		d.clock.Set(time.Duration(tick) * Step)
		if perTick = d.cfg.Pace; perTick <= 0 {
			return nil
		}
	}
	wait := time.Until(start.Add(time.Duration(tick) * perTick))
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
	ctx, cancel := d.callContext(ctx)
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
	ctx, cancel := d.callContext(ctx)
	defer cancel()
	if d.clock != nil {
		defer d.clock.Run()()
	}
	_, err := d.searchClient.Get(ctx, &echov1.GetRequest{RequestId: requestID("get", tick), Key: "k"})
	return err
}

// callContext returns the context of one call. In real time it has a
// deadline callTimeout away. On the simulated clock it has none: a
// context's deadline is an instant of the wall clock, which the Client,
// reading the simulated clock, would compare with simulated instants (the
// time left, the deadline sent downstream, whether a backoff ends in
// time). It keeps ctx's cancellation, but not ctx's deadline either, for
// the same reason.
func (d *Demo) callContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if d.clock == nil {
		return context.WithTimeout(ctx, callTimeout)
	}
	cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, cancel)
	return cctx, func() {
		stop()
		cancel()
	}
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

// simClock is the Client's clock when not in real time. It moves a tick
// at a time (Set), and within a tick it stands still, so that the Client's
// decisions about orders, made while it stands still, depend on the ticks
// alone (and its backoffs take no time: see NewTimer); while a search
// call is in flight it runs with the wall clock
// (Run), though never into the next tick, so that the latencies the Client
// measures there, and the adaptive hedging delay it learns from them, are
// real. It starts at a whole second, so that every window of the suite
// (slots of 10 ms to 1 s) starts on a tick. It is safe for concurrent use.
//
// Reads from elsewhere see the same clock: a scrape of /metrics while it
// runs may find the end of an open period of orders' breaker up to a tick
// early, which changes no decision, only the tick at which the change to
// half-open is reported.
type simClock struct {
	base    time.Time
	off     atomic.Int64              // the tick's offset from base
	running atomic.Pointer[time.Time] // when Run started; nil: standing still
}

// maxRun is how far the clock runs past a tick's start: just short of the
// next tick, so that it never goes backwards.
const maxRun = Step - time.Nanosecond

func newSimClock() *simClock { return &simClock{base: time.Now().Truncate(time.Second)} }

// Now returns the simulated time.
func (c *simClock) Now() time.Time {
	t := c.base.Add(time.Duration(c.off.Load()))
	if r := c.running.Load(); r != nil {
		t = t.Add(min(time.Since(*r), maxRun))
	}
	return t
}

// Set moves the clock to d after its start, standing still.
func (c *simClock) Set(d time.Duration) {
	c.running.Store(nil)
	c.off.Store(int64(d))
}

// Run lets the clock run with the wall clock from the current tick's start
// until the returned function is called (at most until the next tick).
func (c *simClock) Run() (stop func()) {
	now := time.Now()
	c.running.Store(&now)
	return func() { c.running.Store(nil) }
}

// NewTimer returns a timer that fires once d has passed on the clock: at
// once while it stands still (a call to orders takes no simulated time,
// backoffs included), after d of the wall clock while it runs (search's
// hedging delay).
func (c *simClock) NewTimer(d time.Duration) clock.Timer {
	if c.running.Load() != nil {
		return clock.NewTimer(d)
	}
	ch := make(chan time.Time, 1)
	ch <- c.Now()
	return firedTimer(ch)
}

// firedTimer is a Timer that has fired.
type firedTimer chan time.Time

func (t firedTimer) C() <-chan time.Time { return t }
func (t firedTimer) Stop() bool          { return false }

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
