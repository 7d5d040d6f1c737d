package interceptor

import (
	"strings"
	"sync/atomic"
	"unsafe"

	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/internal/breakername"
	"github.com/stormguard/stormguard/internal/engine"
	"github.com/stormguard/stormguard/internal/protoreg"
)

// maxRoutes bounds the (target, method) routes a Client caches, and the
// breakers it keeps (one per target and method). Generated code has far
// fewer; a proxy forwarding caller-chosen method names gets, beyond the
// bound, a route built for each call and no breaker for the methods past
// it (and, for methods the protobuf registry does not know, metrics under
// one "_OTHER" method).
const maxRoutes = 10_000

type routeKey struct{ target, method string }

// route is everything a call needs that depends only on its target and
// method, resolved once and cached: what the engine knows of it (eng), and
// what the adapter needs beside it.
type route struct {
	eng       engine.Route
	method    string // "/pkg.Svc/Method"
	rawTarget string // the ClientConn's target, as its routeKey has it
	target    string // the dependency's name (WithTargetName), or cc.Target()
	key       string // its budget's, breakers' and endpoint table's key (see dependency)
	policy    idempotency.Policy
	respType  protoreflect.MessageType // streams: to drain a failed attempt; may be nil
	tel       *routeTelemetry

	mc         atomic.Pointer[methodConfig]
	warnedOnce atomic.Bool // the grpc-go retryPolicy warning was logged
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
		method:    method,
		rawTarget: k.target,
		target:    target,
		key:       key,
		policy:    p,
		tel:       newRouteTelemetry(method, target, p.Known, c.o.instrumented, c.otherMetricsOf(target, p.Known)),
		respType:  protoreg.ResponseType(method),
	}
	e := &r.eng
	e.Config, e.Rule, e.PerAttempt = &c.engine, c.ruleOf(p), p.PerAttemptTimeout
	if e.PerAttempt == 0 {
		e.PerAttempt = c.o.perAttempt
	}
	if c.budgets != nil {
		e.Budget = c.budgets.For(key)
		e.Yield = c.yields.LoadOrCreate(key, func(string) *engine.Yield { return engine.NewYield() })
	}
	if c.breakerOn {
		e.Breaker = c.breakerFor(key, method, p.Known)
	}
	e.Endpoints = c.endpoints.LoadOrCreate(key, func(string) *engine.Endpoints { return &engine.Endpoints{} })
	if e.Rule.Hedge && e.Rule.HedgeDelay == 0 {
		e.Latency = engine.NewLatency(c.hedgeQ)
	}
	return r
}

// ruleOf returns how the calls of a method with policy p retry and hedge:
// as its proto options say, else as the Client's options do.
func (c *Client) ruleOf(p idempotency.Policy) engine.Rule {
	rl := engine.Rule{
		MaxAttempts: c.o.maxAttempts,
		Retryable:   engine.CodeSet(c.retryable),
		BackoffBase: c.o.backoffBase,
		BackoffMax:  c.o.backoffMax,
		BackoffMult: 2,
	}
	if p.MaxAttempts > 0 {
		rl.MaxAttempts = clampAttempts(p.MaxAttempts)
	}
	if p.RetryableCodes != 0 {
		rl.Retryable = engine.CodeSet(p.RetryableCodes)
	}
	switch {
	case p.Hedging:
		rl.Hedge, rl.HedgeDelay, rl.MaxHedges = true, p.HedgingDelay, p.MaxHedges
	case c.o.hedging:
		rl.Hedge, rl.HedgeDelay = true, c.o.hedgeDelay
		if c.o.hedgeAttempts > 0 {
			rl.MaxAttempts = clampAttempts(c.o.hedgeAttempts)
		}
	}
	if rl.MaxHedges <= 0 || rl.MaxHedges >= rl.MaxAttempts {
		rl.MaxHedges = rl.MaxAttempts - 1
	}
	return rl
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
	if c.o.hooks.OnBreakerChange != nil {
		user := cfg.OnStateChange
		cfg.OnStateChange = func(name string, from, to breaker.State) {
			if user != nil {
				user(name, from, to)
			}
			callHook(c, "OnBreakerChange", c.o.hooks.OnBreakerChange, BreakerEvent{Target: k.target, Method: k.method, From: from, To: to})
		}
	}
	breakername.Set(&cfg, k.target+k.method)
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
