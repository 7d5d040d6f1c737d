package interceptor

// The service config drives the suite (see Client.DialOptions): the policy
// it gives a method becomes the retryRule of the calls of that method on a
// ClientConn dialed with DialOptions.

import (
	"slices"
	"time"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/internal/svcconfig"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/resolver"
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
	if mc.rule == nil || !c.grpc.off || c.rule == mc.rule {
		return
	}
	switch pol := c.route.policy; {
	case pol.SendOnce:
		c.scIgnored = scIgnoredOnce
	case pol.Level == idempotency.RetryWithKey && !c.hasKey:
		c.scIgnored = scIgnoredNoKey
	default:
		c.rule, c.scIgnored = mc.rule, ""
		c.plan.repeatable = true
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
func (r *route) ruleFrom(mp *svcconfig.Method) *retryRule {
	rl := r.rule
	rl.fromServiceConfig = true
	switch {
	case mp.Retry != nil:
		rp := mp.Retry
		rl.maxAttempts = clampAttempts(rp.MaxAttempts)
		rl.retryable = idempotency.Codes(rp.RetryableStatusCodes...)
		rl.backoffBase = min(rp.InitialBackoff, MaxBackoff)
		rl.backoffMax = min(max(rp.MaxBackoff, rp.InitialBackoff), MaxBackoff)
		rl.backoffMult = rp.BackoffMultiplier
		rl.hedge, rl.hedgeDelay, rl.maxHedges = false, 0, 0
	case mp.Hedging != nil:
		hp := mp.Hedging
		rl.maxAttempts = clampAttempts(hp.MaxAttempts)
		rl.retryable = idempotency.Codes(hp.NonFatalStatusCodes...)
		rl.hedge, rl.hedgeDelay, rl.maxHedges = true, max(hp.HedgingDelay, time.Nanosecond), rl.maxAttempts-1
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
