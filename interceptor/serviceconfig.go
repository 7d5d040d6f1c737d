package interceptor

// What does the operator's config say? The service config of a method, as
// grpc-go and the resolver give it: its timeout, and, through
// DialOptions, its retryPolicy or hedgingPolicy and retryThrottling, which
// drive the suite (the policy becomes the engine's Rule of the method's
// calls on that ClientConn); installed by hand, a retryPolicy is grpc-go's
// to carry out (see grpcRetries). It is read when a call starts, and again
// after a failure the engine may retry (call.Refresh).

import (
	"slices"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/resolver"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/internal/engine"
	"github.com/stormguard/stormguard/internal/svcconfig"
)

// Values of semconv.AttrServiceConfig: the service config's policy for the
// method drove the call, or was not applied because the proto says the
// method is sent once, or may be repeated only with an idempotency key.
const (
	scApplied      = "applied"
	scIgnoredOnce  = "ignored:send_once"
	scIgnoredNoKey = "ignored:no_key"
)

// applyServiceConfig lets the service config's retryPolicy or
// hedgingPolicy for the method (mc.rule), if any, drive the call: the
// operator's policy says the method may be repeated, and how. It applies
// only through DialOptions, where grpc-go's own retries are off (installed
// by hand, a retryPolicy is grpc-go's to carry out: see applyGRPCRetry).
// The proto has the last word on safety: a send_once method is sent once,
// and a retry_with_key method without a key is not repeated, whatever the
// service config says.
func (c *call) applyServiceConfig(mc *methodConfig) {
	if mc.rule == nil || mc.watch == nil || c.e.Rule == mc.rule {
		return
	}
	switch pol := c.route.policy; {
	case pol.SendOnce:
		c.scIgnored = scIgnoredOnce
	case pol.Level == idempotency.RetryWithKey && !c.hasKey:
		c.scIgnored = scIgnoredNoKey
	default:
		c.e.Rule, c.scIgnored = mc.rule, ""
		c.e.Repeatable = true
	}
}

// applyGRPCRetry notes whether grpc-go retries the method itself: its
// service config has a retryPolicy and grpc-go's retries are not known to
// be off (DialOptions turns them off; installed by hand, the Client
// watches what grpc-go does with such calls: see grpcRetries). Sending
// more attempts of our own would multiply grpc-go's; when its retries are
// off, the suite retries as for any other method. mc becomes the call's
// method config.
func (c *call) applyGRPCRetry(mc *methodConfig) {
	c.mc = mc
	if mc.watch != nil || !c.e.Repeatable {
		return
	}
	if !mc.grpcRetry {
		// Read before the ClientConn was ready, the config may not be
		// grpc's yet: the attempt is watched all the same, in case its
		// failure shows a retryPolicy (see noteGRPCRetries).
		if mc.provisional && c.watched == nil {
			c.watched = c.watchedOf(mc)
		}
		return
	}
	if c.watched == nil {
		c.watched = c.watchedOf(mc)
	}
	switch {
	case c.watched != nil && c.watched.off.Load():
		c.e.GRPCRetry = false
	case !c.e.GRPCRetry:
		c.e.GRPCRetry = true
		c.client.warnGRPCRetry(c.route)
	}
}

// watchedOf returns what the Client has seen of grpc-go's retries on
// mc's ClientConn, looked up once per method config read.
func (c *call) watchedOf(mc *methodConfig) *grpcRetries {
	if w := mc.watched.Load(); w != nil {
		return w
	}
	w := c.client.grpcRetriesOf(mc.cc)
	if w != nil {
		mc.watched.Store(w)
	}
	return w
}

// Refresh implements engine.Host: it reads the method's service config
// again after a failed attempt (see route.readMethodConfig), with force,
// or without when the resolver gave another service config since the
// call read it (a fresh ClientConn's first call runs before it has any):
// its policy applies from this decision on, a retryPolicy found now stops
// the suite's retries, and a method timeout bounds the rest of the call,
// measured from its start, when it is tighter than its deadline.
func (c *call) Refresh(now time.Time, force bool) {
	if w := c.mc.watch; !force && (w == nil || c.mc.gen == w.Generation()) {
		return
	}
	mc := c.route.readMethodConfig(c.mc.cc, now, c.mc.watch)
	c.applyServiceConfig(mc)
	c.applyGRPCRetry(mc)
	if mc.timeout > 0 {
		if dl := c.e.Start().Add(mc.timeout); c.e.Deadline.IsZero() || dl.Before(c.e.Deadline) {
			c.e.Deadline = dl
		}
	}
}

// ruleFrom returns the rule the service config's policy mp gives the
// route's method: a retryPolicy's attempts (capped at the suite's limit,
// not grpc-go's 5), backoff (capped at MaxBackoff) and retryable codes,
// and no hedging; or a
// hedgingPolicy's attempts, delay (0: every attempt at once, as gRFC A6
// says) and non-fatal codes, after which a failed attempt is retried.
// What the policy does not say (the per-attempt timeout) stays the
// route's.
func (r *route) ruleFrom(mp *svcconfig.Method) *engine.Rule {
	rl := r.eng.Rule
	rl.FromServiceConfig = true
	switch {
	case mp.Retry != nil:
		rp := mp.Retry
		rl.MaxAttempts = clampAttempts(rp.MaxAttempts)
		rl.Retryable = engine.CodeSet(idempotency.Codes(rp.RetryableStatusCodes...))
		rl.BackoffBase = min(rp.InitialBackoff, MaxBackoff)
		rl.BackoffMax = min(max(rp.MaxBackoff, rp.InitialBackoff), MaxBackoff)
		rl.BackoffMult = rp.BackoffMultiplier
		rl.Hedge, rl.HedgeDelay, rl.MaxHedges = false, 0, 0
	case mp.Hedging != nil:
		hp := mp.Hedging
		rl.MaxAttempts = clampAttempts(hp.MaxAttempts)
		rl.Retryable = engine.CodeSet(idempotency.Codes(hp.NonFatalStatusCodes...))
		rl.Hedge, rl.HedgeDelay, rl.MaxHedges = true, max(hp.HedgingDelay, time.Nanosecond), rl.MaxAttempts-1
	default:
		return nil
	}
	return &rl
}

// resolverSchemes are the schemes whose registered resolvers DialOptions
// wraps: grpc's own, xDS's, and the default.
func resolverSchemes() []string {
	schemes := []string{"dns", "passthrough", "unix", "unix-abstract", "xds", "google-c2p"}
	if d := resolver.GetDefaultScheme(); !slices.Contains(schemes, d) {
		schemes = append(schemes, d)
	}
	return schemes
}

// codeList lists the codes of s.
func codeList(s idempotency.CodeSet) []codes.Code {
	var out []codes.Code
	for c := codes.Code(1); c < 32; c++ {
		if s.Has(c) {
			out = append(out, c)
		}
	}
	return out
}

// methodConfig is what the ClientConn's service config says of the
// route's method, as read at a time from one ClientConn.
type methodConfig struct {
	cc          *grpc.ClientConn
	read, until time.Time     // until: read + ttl, when no Watch follows cc
	timeout     time.Duration // 0: none
	grpcRetry   bool          // a retryPolicy: grpc-go retries the method itself, unless its retries are off
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
	rule     *engine.Rule
	throttle *svcconfig.Throttle
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
		} else if now.Before(mc.until) && !now.Before(mc.read) {
			return mc
		}
	}
	return r.readMethodConfig(cc, now, w)
}

// methodConfigTTL is how long a route trusts the grpc service config it
// read for its method before reading it again: service config changes take
// effect within this time, and a call does not take the ClientConn's lock.
const methodConfigTTL = time.Second

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
	next.until = now.Add(next.ttl())
	r.mc.Store(next)
	return next
}
