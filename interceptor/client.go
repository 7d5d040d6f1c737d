package interceptor

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/deadline"
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/internal/clock"
	"github.com/stormguard/stormguard/internal/cowmap"
)

// Metadata keys the client reads and writes (gRFC A6).
const (
	// PreviousAttemptsKey is sent on every retry and hedge: the number of
	// attempts of the same call sent before it.
	PreviousAttemptsKey = "grpc-previous-rpc-attempts"
	// PushbackKey is read from response trailers: a value from 0 to
	// MaxPushback is the delay in milliseconds before the next attempt
	// (replacing the backoff); a negative, larger or malformed value, or
	// several values, mean "do not retry".
	PushbackKey = "grpc-retry-pushback-ms"
	// BudgetedKey is sent, with the value "1", on every retry and hedge of
	// the suite's client: its own budget bounds it. A stormguard server
	// serves such a retry even when its own retry budget is spent (it
	// still counts it), so that the two budgets do not both charge it.
	BudgetedKey = "stormguard-budgeted"
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
	budgets    *budget.Registry  // nil: no budget
	breakerOn  bool              // breakers are on
	breakers   *breaker.Registry // WithBreakers' registry; nil: the Client makes its own breakers
	breakerCfg breaker.Config    // the config of its own breakers (callbacks wrapped)
	// brk holds the breaker of each (canonical target, method), up to
	// MaxRoutes.
	brk       cowmap.Map[routeKey, *routeBreaker]
	dl        *deadline.Client
	tel       *telemetry
	retryable idempotency.CodeSet
	failures  idempotency.CodeSet
	hedgeQ    float64
	routes    cowmap.Map[routeKey, *route]
	endpoints cowmap.Map[string, *endpoints] // per canonical target
	returns   atomic.Pointer[returnTable]    // failed calls, made on the first failure (see outer.go)
	// lastFailed is when (UnixNano, on the Client's clock) a call last
	// failed: the table is looked at only for returnWindow after.
	lastFailed atomic.Int64
	// grpcRetry is what the Client has seen of grpc-go's retries, per
	// ClientConn installed by hand (see grpcRetries).
	grpcRetry cowmap.Map[weak.Pointer[grpc.ClientConn], *grpcRetries]
	closeOnce sync.Once
	closeErr  error
}

// NewClient returns a Client configured by opts. Nil options are ignored.
func NewClient(opts ...ClientOption) *Client {
	o := clientOptions{
		maxAttempts: DefaultMaxAttempts,
		backoffBase: DefaultBackoffBase,
		backoffMax:  DefaultBackoffMax,
		replayLimit: DefaultReplayLimit,
	}
	for _, opt := range opts {
		if opt != nil {
			opt.applyClient(&o)
		}
	}
	o.backoffMax = max(o.backoffMax, o.backoffBase)
	c := &Client{o: o}
	c.routes.Max = MaxRoutes
	c.endpoints.Max = MaxRoutes
	c.grpcRetry.Max = MaxRoutes
	c.resolver = idempotency.NewResolver(idempotency.ResolverConfig{Idempotent: o.idempotent})
	c.checkMarks()
	ratio := budget.DefaultRatio
	if !o.noBudget {
		if o.budgets != nil {
			c.budgets = o.budgets
		} else {
			cfg := o.budgetCfg
			c.budgets = budget.NewRegistry(cfg)
			if cfg.Ratio > 0 && !math.IsInf(cfg.Ratio, 0) {
				ratio = cfg.Ratio
			}
		}
	}
	// Hedges alone should use about three quarters of the budget, leaving
	// the rest for retries: hedge when an attempt is slower than the
	// (1 - 0.75·ratio) quantile.
	c.hedgeQ = min(max(1-0.75*ratio, 0.5), 0.999)
	c.brk.Max = MaxRoutes
	if !o.noBreaker {
		c.breakerOn = true
		if o.breakers != nil {
			c.breakers = o.breakers
		} else {
			cfg := o.breakerCfg
			// The callback runs wherever the breaker's state changes,
			// also on the Client's own goroutines: a panic in it is
			// recovered (see Hooks). Each breaker adds the hook (see
			// newBreaker).
			if user := cfg.OnStateChange; user != nil {
				cfg.OnStateChange = c.safeStateChange("breaker.Config.OnStateChange", user)
			}
			c.breakerCfg = cfg
		}
	}
	c.dl = deadline.NewClient(o.deadlineCfg)
	c.retryable = resolveCodes(o.retryable, idempotency.Codes(codes.Unavailable))
	c.failures = resolveCodes(o.failures, idempotency.Codes(codes.Unavailable, codes.DeadlineExceeded, codes.ResourceExhausted, codes.Internal))
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

// DialOptions returns the dial options that install the Client on a
// ClientConn: grpc.WithDisableRetry, so that grpc-go's own service-config
// retries do not multiply the suite's, and both interceptors (after any
// interceptors given earlier in the dial options). Interceptors installed
// this way know grpc-go does not retry, so a service config retryPolicy
// does not stop the suite from retrying, from the first call (see Unary
// for interceptors installed by hand).
func (c *Client) DialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithDisableRetry(),
		grpc.WithChainUnaryInterceptor(c.unaryInterceptor(true)),
		grpc.WithChainStreamInterceptor(c.streamInterceptor(true)),
	}
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
