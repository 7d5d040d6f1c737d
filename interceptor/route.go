package interceptor

import (
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/internal/protoreg"
	"github.com/stormguard/stormguard/internal/svcconfig"
)

// maxRoutes bounds the (target, method) routes a Client caches, and the
// breakers it keeps (one per target and method). Generated code has far
// fewer; a proxy forwarding caller-chosen method names gets, beyond the
// bound, a route built for each call and no breaker for the methods past
// it (and, for methods the protobuf registry does not know, metrics under
// one "_OTHER" method).
const maxRoutes = 10_000

// methodConfigTTL is how long a route trusts the grpc service config it
// read for its method before reading it again: service config changes take
// effect within this time, and a call does not take the ClientConn's lock.
const methodConfigTTL = time.Second

type routeKey struct{ target, method string }

// route is everything a call needs that depends only on its target and
// method, resolved once and cached.
type route struct {
	method     string // "/pkg.Svc/Method"
	rawTarget  string // the ClientConn's target, as its routeKey has it
	target     string // the dependency's name (WithTargetName), or cc.Target()
	key        string // its budget's, breakers' and endpoint table's key (see dependency)
	policy     idempotency.Policy
	budget     *budget.Budget   // nil: none
	breaker    *breaker.Breaker // nil: none
	endpoints  *endpoints       // the target's endpoints
	yield      *yield           // the target's load, to which hedges yield; nil without a budget
	rule       retryRule        // from the proto's options and the Client's
	perAttempt time.Duration
	lat        *latency                 // adaptive hedging; nil unless rule.hedge && rule.hedgeDelay == 0
	respType   protoreflect.MessageType // streams: to drain a failed attempt; may be nil
	tel        *routeTelemetry

	outer      outerGate // tries of retry loops outside the suite (outer.go)
	mc         atomic.Pointer[methodConfig]
	warnedOnce atomic.Bool // the grpc-go retryPolicy warning was logged
}

// retryRule is how the calls of one method retry and hedge (when they may
// be repeated): as the method's proto options and the Client's options say
// (route.rule), or as the service config's policy for the method says
// (methodConfig.rule).
type retryRule struct {
	maxAttempts             int // for repeatable calls
	retryable               idempotency.CodeSet
	backoffBase, backoffMax time.Duration
	backoffMult             float64 // 2, unless a service config says otherwise
	hedge                   bool
	hedgeDelay              time.Duration // 0: adaptive (route.lat)
	maxHedges               int
	fromServiceConfig       bool
}

// methodConfig is what the ClientConn's service config says of the
// route's method, as read at a time from one ClientConn.
type methodConfig struct {
	cc        *grpc.ClientConn
	read      time.Time
	timeout   time.Duration // 0: none
	grpcRetry bool          // a retryPolicy: grpc-go retries the method itself, unless its retries are off
	// The retryPolicy's retryable codes and attempts (see grpcRetries).
	grpcCodes    idempotency.CodeSet
	grpcAttempts int
	// provisional: no retryPolicy, read before the ClientConn was ready,
	// maybe before it had its service config: the calls that use it are
	// watched as if it had one (see applyGRPCRetry), and it is read again
	// after provisionalTTL.
	provisional bool
	// watched is what the Client has seen of grpc-go's retries on cc,
	// looked up by the first call that needs it (see call.watchedOf).
	watched atomic.Pointer[grpcRetries]

	// For a ClientConn dialed with DialOptions: the service config it was
	// read from (its generation), the policy it gives the method (nil:
	// none) and its retry throttle (nil: none).
	watch    *svcconfig.Watch
	gen      uint64
	rule     *retryRule
	throttle *svcconfig.Throttle
}

// routeOf returns the route of (target, method) as routeFor does, through
// a direct-mapped cache indexed by the address of the method name's bytes:
// generated code passes the same constant on every call, so that a call
// finds its route without hashing its target and method. A miss (a method
// name built for each call, two routes on one slot) goes to routeFor.
func (c *Client) routeOf(target, method string) *route {
	i := routeSlot(method)
	if r := c.routeCache[i].Load(); r != nil && r.method == method && r.rawTarget == target {
		return r
	}
	r := c.routeFor(target, method)
	c.routeCache[i].Store(r)
	return r
}

// routeCacheSize is the number of slots of Client.routeCache.
const routeCacheSize = 256

// routeSlot is the routeCache slot of method: its bytes' address, mixed.
func routeSlot(method string) uint64 {
	p := uint64(uintptr(unsafe.Pointer(unsafe.StringData(method))))
	return (p * 0x9E3779B97F4A7C15) >> (64 - 8) // routeCacheSize = 2⁸
}

// routeFor returns the route of (target, method), cached up to maxRoutes.
func (c *Client) routeFor(target, method string) *route {
	k := routeKey{target, method}
	if r, ok := c.routes.Load(k); ok {
		return r
	}
	return c.routes.LoadOrCreate(k, c.newRoute)
}

func (c *Client) newRoute(k routeKey) *route {
	method := k.method
	target, key := c.dependency(k.target)
	p := c.resolver.Lookup(method)
	r := &route{
		method:     method,
		rawTarget:  k.target,
		target:     target,
		policy:     p,
		perAttempt: p.PerAttemptTimeout,
		tel:        newRouteTelemetry(method, target, p.Known, c.o.instrumented, c.otherMetricsOf(target, p.Known)),
		respType:   protoreg.ResponseType(method),
		rule: retryRule{
			maxAttempts: c.o.maxAttempts,
			retryable:   c.retryable,
			backoffBase: c.o.backoffBase,
			backoffMax:  c.o.backoffMax,
			backoffMult: 2,
		},
	}
	if r.perAttempt == 0 {
		r.perAttempt = c.o.perAttempt
	}
	r.key = key
	if c.budgets != nil {
		r.budget = c.budgets.For(key)
	}
	if c.breakerOn {
		r.breaker = c.breakerFor(key, method, p.Known)
	}
	r.endpoints = c.endpoints.LoadOrCreate(key, func(string) *endpoints { return &endpoints{} })
	if c.budgets != nil {
		r.yield = c.yields.LoadOrCreate(key, func(string) *yield { return newYield() })
	}
	rl := &r.rule
	if p.MaxAttempts > 0 {
		rl.maxAttempts = clampAttempts(p.MaxAttempts)
	}
	if p.RetryableCodes != 0 {
		rl.retryable = p.RetryableCodes
	}
	switch {
	case p.Hedging:
		rl.hedge, rl.hedgeDelay, rl.maxHedges = true, p.HedgingDelay, p.MaxHedges
	case c.o.hedging:
		rl.hedge, rl.hedgeDelay = true, c.o.hedgeDelay
		if c.o.hedgeAttempts > 0 {
			rl.maxAttempts = clampAttempts(c.o.hedgeAttempts)
		}
	}
	if rl.maxHedges <= 0 || rl.maxHedges >= rl.maxAttempts {
		rl.maxHedges = rl.maxAttempts - 1
	}
	if rl.hedge && rl.hedgeDelay == 0 {
		r.lat = newLatency(c.hedgeQ)
	}
	return r
}

// otherMetricsOf returns the metrics that the routes to target of the
// methods the protobuf registry does not know share (their attributes say
// "_OTHER"), made on first use; nil for a known method, whose route makes
// its own, and past maxRoutes targets.
func (c *Client) otherMetricsOf(target string, known bool) *routeMetrics {
	if known {
		return nil
	}
	m, _ := c.otherTel.LoadOrCreateIfRoom(target, func(string) *routeMetrics {
		return newRouteMetrics("", target, false, c.o.instrumented)
	})
	return m
}

// dependency returns what a ClientConn's target is called (in telemetry,
// errors and hooks) and the key of its budget, breaker and endpoint table:
// the name WithTargetName gives it, for both; by default the target itself
// and, as the key, its canonical form, since budgets and breakers are per
// service: "host:port" and "dns:///host:port" name the same one.
func (c *Client) dependency(target string) (name, key string) {
	if f := c.o.targetName; f != nil {
		if n := f(target); n != "" {
			return n, n
		}
	}
	return target, canonicalTarget(target)
}

// routeBreaker is the breaker of one method of one (canonical) target.
type routeBreaker struct {
	target, method string
	known          bool // the protobuf registry knows the method (its name goes into metrics)
	b              *breaker.Breaker
}

// breakerFor returns the breaker of method on the canonical target, made
// on first use; nil past maxRoutes breakers. A breaker is per method, not
// per target, so that a method that serves is never refused because
// another method of the same target fails: each opens only on its own
// method's failures. The budget and the endpoint table stay per target.
func (c *Client) breakerFor(target, method string, known bool) *breaker.Breaker {
	rb, ok := c.brk.LoadOrCreateIfRoom(routeKey{target, method}, func(k routeKey) *routeBreaker {
		return c.newBreaker(k, known)
	})
	if !ok {
		return nil
	}
	return rb.b
}

// newBreaker makes the breaker of k, named by its target and its method
// ("dns:///host:443/pkg.Svc/Method": the target an OnStateChange of
// WithBreaker's Config receives), whose callback also calls
// Hooks.OnBreakerChange.
func (c *Client) newBreaker(k routeKey, known bool) *routeBreaker {
	rb := &routeBreaker{target: k.target, method: k.method, known: known}
	cfg := c.breakerCfg
	cfg.Target = k.target + k.method
	if c.o.hooks.OnBreakerChange != nil {
		user := cfg.OnStateChange
		cfg.OnStateChange = func(name string, from, to breaker.State) {
			if user != nil {
				user(name, from, to)
			}
			callHook(c, "OnBreakerChange", c.o.hooks.OnBreakerChange, BreakerEvent{Target: k.target, Method: k.method, From: from, To: to})
		}
	}
	rb.b = breaker.New(cfg)
	return rb
}

// canonicalTarget returns target in grpc's canonical form for the targets
// whose scheme is implied: "host:port" is "dns:///host:port". Targets that
// name a scheme ("dns:///x", "passthrough:///x", "unix:///p") are returned
// as they are: another resolver may well mean another set of endpoints.
func canonicalTarget(target string) string {
	if target == "" || strings.Contains(target, "://") || strings.HasPrefix(target, "unix:") {
		return target
	}
	return "dns:///" + target
}

// methodConfig returns the service config of the route's method as cc
// has it (nil cc: none). Through DialOptions (w not nil, following the
// ClientConn's resolver) it is read again when the resolver has given the
// ClientConn another service config, so that a new one takes effect on the
// next call; otherwise at most once per methodConfigTTL per ClientConn.
func (r *route) methodConfig(cc *grpc.ClientConn, now time.Time, w *svcconfig.Watch) *methodConfig {
	mc := r.mc.Load()
	if mc != nil && mc.cc == cc && mc.watch == w {
		if w != nil && w.Following() {
			if mc.gen == w.Generation() {
				return mc
			}
		} else if ttl := mc.ttl(); now.Sub(mc.read) < ttl && !now.Before(mc.read) {
			return mc
		}
	}
	return r.readMethodConfig(cc, now, w)
}

// provisionalTTL is how long a provisional method config is trusted: until
// the ClientConn is ready, grpc may not have its service config yet.
const provisionalTTL = 10 * time.Millisecond

// ttl is how long mc is trusted, when no Watch follows its ClientConn.
func (mc *methodConfig) ttl() time.Duration {
	if mc.provisional {
		return provisionalTTL
	}
	return methodConfigTTL
}

// readMethodConfig reads the method's service config from cc now, and
// caches it. The first calls on a new ClientConn run before grpc has its
// service config (grpc resolves the target on the first call), so the
// failure path reads it again, and a config without a retryPolicy read
// while cc was not ready is provisional.
//
// Through DialOptions (w not nil), the method's retryPolicy or
// hedgingPolicy comes from the service config's JSON as the resolver gave
// it (w), or, when w does not know it, from grpc's reading of its
// retryPolicy (the default service config given to grpc directly, or a
// resolver w does not wrap).
func (r *route) readMethodConfig(cc *grpc.ClientConn, now time.Time, w *svcconfig.Watch) *methodConfig {
	next := &methodConfig{cc: cc, read: now, watch: w}
	var cfg *svcconfig.Config
	if w != nil {
		next.gen = w.Generation() // first: a config given after is read by the next call
		cfg, next.throttle, _ = w.Current()
	}
	if cc != nil {
		m := cc.GetMethodConfig(r.method)
		if m.Timeout != nil && *m.Timeout > 0 {
			next.timeout = *m.Timeout
		}
		if rp := m.RetryPolicy; rp != nil {
			next.grpcRetry, next.grpcAttempts = true, rp.MaxAttempts
			for code, ok := range rp.RetryableStatusCodes {
				if ok {
					next.grpcCodes |= idempotency.Codes(code)
				}
			}
			if w != nil && cfg == nil {
				next.rule = r.ruleFrom(&svcconfig.Method{Retry: &svcconfig.Retry{
					MaxAttempts: rp.MaxAttempts, InitialBackoff: rp.InitialBackoff, MaxBackoff: rp.MaxBackoff,
					BackoffMultiplier: rp.BackoffMultiplier, RetryableStatusCodes: codeList(next.grpcCodes),
				}})
			}
		} else if w == nil {
			next.provisional = cc.GetState() != connectivity.Ready
		}
	}
	if mp := cfg.Lookup(r.method); mp != nil {
		next.rule = r.ruleFrom(mp)
	}
	r.mc.Store(next)
	return next
}
