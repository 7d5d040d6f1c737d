package interceptor

import (
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"google.golang.org/grpc"
	"google.golang.org/grpc/resolver"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/deadline"
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/internal/clock"
	"github.com/stormguard/stormguard/internal/cowmap"
	"github.com/stormguard/stormguard/internal/engine"
	"github.com/stormguard/stormguard/internal/limits"
	"github.com/stormguard/stormguard/internal/svcconfig"
)

// Client is the suite's client side: unary and stream interceptors that
// retry and hedge only what may be repeated, pay for every retry and hedge
// from a per-target budget, stop calling a target whose breaker is open,
// propagate the deadline, and record every decision as OpenTelemetry spans,
// events and metrics.
//
// Create one with NewClient and use it for any number of ClientConns:
// budgets are per target, breakers per target and method, and both are
// shared by every ClientConn of the same Client. A Client is safe for
// concurrent use.
type Client struct {
	o          clientOptions
	resolver   *idempotency.Resolver
	budgets    *budget.Registry // nil: no budget
	breakerOn  bool             // breakers are on
	breakerCfg breaker.Config   // the config of its breakers
	// brk holds the breaker of each (canonical target, method), up to
	// maxRoutes.
	brk       cowmap.Map[routeKey, *routeBreaker]
	dl        *deadline.Client
	tel       *telemetry
	retryable idempotency.CodeSet
	failures  idempotency.CodeSet
	hedgeQ    float64
	routes    cowmap.Map[routeKey, *route]
	// routeCache is routes' direct-mapped front (see routeOf).
	routeCache [routeCacheSize]atomic.Pointer[route]
	endpoints  cowmap.Map[string, *engine.Endpoints] // per canonical target
	// engine is what the engine takes from the Client's options (see
	// engine.Config).
	engine engine.Config
	// otherTel holds, per target name, the metrics of the routes of the
	// methods the protobuf registry does not know (see otherMetricsOf).
	otherTel cowmap.Map[string, *routeMetrics]
	yields   cowmap.Map[string, *engine.Yield] // per canonical target
	returns  atomic.Pointer[returnTable]       // failed calls, made on the first failure (see outer.go)
	// lastFailed is when (UnixNano, on the Client's clock) a call last
	// failed: the table is looked at only for returnWindow after.
	lastFailed atomic.Int64
	// grpcRetry is what the Client has seen of grpc-go's retries, per
	// ClientConn installed by hand (see grpcRetries).
	grpcRetry cowmap.Map[weak.Pointer[grpc.ClientConn], *grpcRetries]
	closeOnce sync.Once
	closeErr  error
	// defaultSC is WithDefaultServiceConfig's config, parsed (nil: none,
	// or invalid).
	defaultSC *svcconfig.Config
}

// NewClient returns a Client configured by opts. Nil options are ignored.
func NewClient(opts ...ClientOption) *Client {
	o := clientOptions{
		maxAttempts: defaultMaxAttempts,
		backoffBase: defaultBackoffBase,
		backoffMax:  defaultBackoffMax,
		replayLimit: defaultReplayLimit,
	}
	for _, opt := range opts {
		if opt != nil {
			opt.applyClient(&o)
		}
	}
	o.backoffBase = min(o.backoffBase, MaxBackoff)
	o.backoffMax = min(max(o.backoffMax, o.backoffBase), MaxBackoff)
	c := &Client{o: o}
	c.routes.Max = maxRoutes
	c.endpoints.Max = maxRoutes
	c.otherTel.Max = maxRoutes
	c.yields.Max = maxRoutes
	c.grpcRetry.Max = maxRoutes
	c.resolver = idempotency.NewResolver(idempotency.ResolverConfig{Idempotent: o.idempotent})
	c.checkMarks()
	if js := o.serviceConfig; js != "" {
		sc, err := svcconfig.Parse(js)
		switch {
		case err != nil:
			c.logger().Error("stormguard: WithDefaultServiceConfig: the service config is invalid (grpc.NewClient will fail with it)", "error", err)
		default:
			c.defaultSC = sc
			for _, w := range sc.Warnings {
				c.logger().Warn("stormguard: WithDefaultServiceConfig: "+w, "config", js)
			}
		}
	}
	c.budgets = o.budgets
	if !o.budgetSet {
		c.budgets = budget.NewRegistry(budget.Config{})
	}
	ratio := budget.DefaultRatio
	if c.budgets != nil {
		ratio = c.budgets.Ratio()
	}
	// Hedges alone should use at most about three quarters of the budget,
	// leaving the rest for retries: hedge when an attempt is slower than
	// the (1 - 0.75·ratio) quantile (and than three times the median: see
	// latency).
	c.hedgeQ = min(max(1-0.75*ratio, 0.5), 0.999)
	c.brk.Max = maxRoutes
	if !o.breakerSet || o.breaker != nil {
		c.breakerOn = true
		if o.breaker != nil {
			c.breakerCfg = *o.breaker
		}
		// The breakers are given the Client's times (their At forms);
		// their callback also calls the hook (see newBreaker), and a panic
		// in it is recovered.
		if user := c.breakerCfg.OnStateChange; user != nil {
			c.breakerCfg.OnStateChange = func(target string, from, to breaker.State) {
				defer func() {
					if v := recover(); v != nil {
						c.hookPanicked("breaker.Config.OnStateChange", v)
					}
				}()
				user(target, from, to)
			}
		}
	}
	c.dl = deadline.NewClient(o.deadlineCfg)
	c.retryable = resolveCodes(o.retryable, idempotency.CodeSet(engine.DefaultRetryable))
	c.failures = resolveCodes(o.failures, idempotency.CodeSet(engine.DefaultFailures))
	c.engine = engine.Config{Shadow: o.shadow, NoFailover: o.noFailover, MinRemaining: max(o.deadlineCfg.MinRemaining, 0),
		Failures: engine.CodeSet(c.failures)}
	c.tel = newTelemetry(&c.o, c)
	return c
}

func resolveCodes(set, def idempotency.CodeSet) idempotency.CodeSet {
	switch set {
	case 0:
		return def
	case noCodes:
		return 0
	}
	return set
}

// now reads the Client's clock.
func (c *Client) now() time.Time {
	if c.o.now != nil {
		return c.o.now()
	}
	// The monotonic clock alone (time.Now reads the wall clock too): the
	// Client only compares times with each other and with deadlines, which
	// carry a monotonic reading.
	return procEpoch.Add(time.Since(procEpoch))
}

// procEpoch is the origin of the Client's default clock.
var procEpoch = time.Now()

// newTimer makes a timer on the Client's timers.
func (c *Client) newTimer(d time.Duration) clock.Timer {
	if c.o.newTimer != nil {
		return c.o.newTimer(d)
	}
	return clock.NewTimer(d)
}

// afterFunc calls f on its own goroutine after d on the Client's timers;
// stop prevents that if f has not started.
func (c *Client) afterFunc(d time.Duration, f func()) (stop func() bool) {
	if c.o.newTimer == nil {
		return time.AfterFunc(d, f).Stop
	}
	t := c.o.newTimer(d)
	done := make(chan struct{})
	var once sync.Once
	go func() {
		select {
		case <-t.C():
			f()
		case <-done:
		}
	}()
	return func() bool {
		stopped := t.Stop()
		once.Do(func() { close(done) })
		return stopped
	}
}

// DialOptions returns the dial options that install the Client on one
// ClientConn: grpc.WithDisableRetry, so that grpc-go's own retries never
// multiply the suite's; the Client's default service config, if any
// (WithDefaultServiceConfig); the ClientConn's resolvers, wrapped so that
// the suite reads the service configs and endpoints they give; and both
// interceptors (after any interceptors given earlier in the dial options).
// Call it once per ClientConn, so that each follows its own resolver.
// Resolvers of your own (a manual resolver, a service-discovery client)
// go in resolvers, instead of grpc.WithResolvers: DialOptions wraps them
// too. nil resolvers are ignored.
//
// The service config drives the suite: a method's retryPolicy or
// hedgingPolicy is carried out within the budget, the breaker and the
// deadline, taking precedence over the proto's options and the Client's
// (maxAttempts capped at 10, not grpc-go's 5); retryThrottling bounds the
// ClientConn's retries and hedges besides the budget (ReasonThrottle); a
// config the resolver gives at run time applies on the next call. A
// send_once method is sent once, and a retry_with_key method is repeated
// only with a key, whatever the service config says; the call span's
// semconv.AttrServiceConfig says which way it went. The resolvers given
// here and those grpc registers for dns, xds, passthrough, unix,
// unix-abstract, google-c2p and the default scheme are read; for others,
// and for a default config given to grpc directly, only the retryPolicy is
// read, through grpc, at most once a second. The endpoints the resolver
// gives keep a fresh ClientConn whose first answers all come from one
// failing endpoint from being taken for a dead target.
// docs/grpc-retries.md has the details.
func (c *Client) DialOptions(resolvers ...resolver.Builder) []grpc.DialOption {
	w := svcconfig.NewWatch(c.defaultSC)
	opts := []grpc.DialOption{
		grpc.WithDisableRetry(),
		// grpc-go does not retry, so its attempt limit only caps the
		// retryPolicy it parses: raised to the suite's, for the policies
		// the suite reads through grpc (see above).
		grpc.WithMaxCallAttempts(limits.MaxAttempts),
		grpc.WithResolvers(append(w.Wrap(resolvers...), w.Builders(resolverSchemes()...)...)...),
	}
	if c.o.serviceConfig != "" {
		opts = append(opts, grpc.WithDefaultServiceConfig(c.o.serviceConfig))
	}
	return append(opts,
		grpc.WithChainUnaryInterceptor(c.unaryInterceptor(w)),
		grpc.WithChainStreamInterceptor(c.streamInterceptor(w)),
	)
}

// Close unregisters the Client's gauge callbacks from its MeterProvider,
// so that a Client that is no longer used can be collected. Calls made
// after Close still work; their gauges are no longer reported. Close
// returns the MeterProvider's error, if any; later calls return the same.
// It is safe to call concurrently with calls and with itself.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		if reg := c.tel.reg; reg != nil {
			c.closeErr = reg.Unregister()
		}
	})
	return c.closeErr
}

// warnGRPCRetry reports, once per route, that grpc-go's own retry policy
// covers a method, so the suite sends one attempt per call.
func (c *Client) warnGRPCRetry(r *route) {
	if !r.warnedOnce.CompareAndSwap(false, true) {
		return
	}
	c.logger().Warn("stormguard: grpc-go's service-config retryPolicy covers this method and grpc-go's retries are not known to be off, so the suite sends one attempt per call and leaves retries to grpc-go (a failure grpc-go does not retry shows they are off, and the suite then retries); dial with Client.DialOptions, which disables grpc-go's retries, to let the suite retry within its budget from the first call",
		"method", r.method, "target", r.target)
}
