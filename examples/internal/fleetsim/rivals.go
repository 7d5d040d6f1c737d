package fleetsim

import (
	"math"
	"math/rand/v2"
	"time"

	"github.com/stormguard/stormguard/internal/engine"
)

// The rival policies: what users pick instead of the suite, from their
// published defaults. Every retrying rival makes at most 3 attempts (gRPC's
// maxAttempts in the storm lab, the AWS SDKs' standard default, the
// suite's), so that what differs between them is what bounds the
// retries; Envoy's num_retries defaults to 1 and Finagle retries only what
// a RetryPolicy says, and both are given 3 attempts here. A rival
// retries UNAVAILABLE (grpc-go's retryableStatusCodes as the storm lab sets
// them; Envoy's retry_on "unavailable"), and the AWS SDKs also their
// throttling errors (RESOURCE_EXHAUSTED), which they retry by default.
// Every client picks its backends round robin from a random start, as
// grpc-go's round_robin does.

// rivalAttempts is every retrying rival's attempt limit.
const rivalAttempts = 3

// The suite's default backoff, which the gRPC rivals are given too (their
// service config has no default).
const (
	suiteBackoffBase = engine.DefaultBackoffBase
	suiteBackoffMax  = engine.DefaultBackoffMax
)

// roundRobin is a client's backend choice: grpc-go's round_robin, which
// starts at a random backend.
type roundRobin struct{ next int }

func newRoundRobin(e *Env) roundRobin { return roundRobin{next: e.Rand.IntN(max(e.Backends, 1))} }

// Pick sends every attempt where round_robin picks.
func (r *roundRobin) Pick(_ *Call, _ time.Time, m int) (int, bool) { return r.pick(m), true }

func (r *roundRobin) pick(m int) int {
	b := r.next % m
	r.next = b + 1
	return b
}

// noRetries sends each call once.
type noRetries struct{ roundRobin }

// PolicyNone is a client that never retries.
func PolicyNone() *ClientPolicy {
	return &ClientPolicy{Key: "none", Name: "no retries", MaxAttempts: 1,
		New: func(e *Env, _ int) Client { return &noRetries{newRoundRobin(e)} }}
}

func (*noRetries) Begin(*Call, time.Time) bool              { return true }
func (*noRetries) Settle(*Call, time.Time, Outcome) Verdict { return Verdict{} }
func (*noRetries) Send(*Call, time.Time) bool               { return true }
func (*noRetries) End(*Call, time.Time, bool)               {}

// grpcClient is grpc-go's service-config retryPolicy (stream.go,
// shouldRetry), with its retryThrottling when throttle is set.
//
// Its backoff is grpc-go's: min(initialBackoff × multiplier^n, maxBackoff)
// × a random factor in [0.8, 1.2), n the retries since the last pushback
// (grpc-go v1.85.0 stream.go); a pushback ≥ 0 is the delay itself and
// resets n, a negative one stops the call (and counts as a failure for
// the throttle). grpc-go has no default backoff (the retryPolicy must
// give one): the model gives it the suite's defaults, 50 ms doubling to
// 1 s, so that the two differ in what bounds retries, not in timing.
type grpcClient struct {
	roundRobin
	rand     *rand.Rand
	throttle *GRPCThrottle
	// initial, maxBackoff are the policy's initialBackoff and maxBackoff
	// (multiplier 2).
	initial, maxBackoff time.Duration
}

// GRPCThrottle is grpc-go's retryThrottler (clientconn.go), transcribed:
// tokens start at maxTokens; each failed attempt with a retryable code
// takes one (not below 0) and no retry follows while maxTokens/2 or fewer
// are left; each successful RPC gives tokenRatio back (up to maxTokens).
// The storm lab's capacity model runs it too. A nil *GRPCThrottle
// throttles nothing.
type GRPCThrottle struct{ tokens, max, thresh, ratio float64 }

// NewGRPCThrottle returns grpc-go's throttle of retryThrottling
// {maxTokens, tokenRatio}, full.
func NewGRPCThrottle(maxTokens, tokenRatio float64) *GRPCThrottle {
	return &GRPCThrottle{tokens: maxTokens, max: maxTokens, thresh: maxTokens / 2, ratio: tokenRatio}
}

// The retryThrottling of the storm lab's grpc-go row and of gRFC A6's
// example: {maxTokens: 10, tokenRatio: 0.1}, per channel (one per client
// here).
const (
	grpcMaxTokens  = 10
	grpcTokenRatio = 0.1
)

// Throttle counts a failed attempt with a retryable code and reports
// whether no retry may follow.
func (t *GRPCThrottle) Throttle() bool {
	if t == nil {
		return false
	}
	t.tokens = max(t.tokens-1, 0)
	return t.tokens <= t.thresh
}

// SuccessfulRPC counts a call that succeeded.
func (t *GRPCThrottle) SuccessfulRPC() {
	if t != nil {
		t.tokens = min(t.tokens+t.ratio, t.max)
	}
}

// PolicyGRPC is grpc-go's retryPolicy: 3 attempts on UNAVAILABLE, no
// bound on retries beyond that (the "retry=3" everyone writes).
func PolicyGRPC() *ClientPolicy { return PolicyGRPCWith(false, suiteBackoffBase, suiteBackoffMax) }

// PolicyGRPCThrottled is grpc-go's retryPolicy with retryThrottling
// {maxTokens: 10, tokenRatio: 0.1}.
func PolicyGRPCThrottled() *ClientPolicy {
	return PolicyGRPCWith(true, suiteBackoffBase, suiteBackoffMax)
}

// PolicyGRPCWith is grpc-go's retryPolicy with the given initialBackoff
// and maxBackoff, throttled or not.
func PolicyGRPCWith(throttled bool, initial, maxBackoff time.Duration) *ClientPolicy {
	key, name := "grpc", "grpc-go retryPolicy (3 attempts)"
	if throttled {
		key, name = "grpc-throttle", "grpc-go + retryThrottling"
	}
	return &ClientPolicy{Key: key, Name: name, MaxAttempts: rivalAttempts, MarksRetries: true,
		New: func(e *Env, _ int) Client { return newGRPCClient(e, throttled, initial, maxBackoff) }}
}

func newGRPCClient(e *Env, throttled bool, initial, maxBackoff time.Duration) *grpcClient {
	c := &grpcClient{roundRobin: newRoundRobin(e), rand: e.Rand, initial: initial, maxBackoff: maxBackoff}
	if throttled {
		c.throttle = NewGRPCThrottle(grpcMaxTokens, grpcTokenRatio)
	}
	return c
}

func (g *grpcClient) Begin(*Call, time.Time) bool { return true }
func (g *grpcClient) Send(*Call, time.Time) bool  { return true }
func (g *grpcClient) End(*Call, time.Time, bool)  {}

func (g *grpcClient) Settle(c *Call, _ time.Time, o Outcome) Verdict {
	if o.Code == OK {
		g.throttle.SuccessfulRPC()
		return Verdict{}
	}
	if o.Pushback != NoPushback && o.Pushback < 0 {
		g.throttle.Throttle() // grpc-go: "this counts as a failure for throttling"
		return Verdict{}
	}
	if o.Code != Unavailable || g.throttle.Throttle() || c.Attempts >= rivalAttempts {
		return Verdict{}
	}
	if o.Pushback != NoPushback {
		c.backoffN = 0
		return Verdict{Retry: true, Delay: o.Pushback}
	}
	d := min(float64(g.initial)*math.Pow(2, float64(c.backoffN)), float64(g.maxBackoff))
	c.backoffN++
	return Verdict{Retry: true, Delay: time.Duration(d * (0.8 + 0.4*g.rand.Float64()))}
}

// awsClient is the AWS SDKs' standard retry mode: a retry quota of 500
// tokens per client; a retry takes its cost from the quota and is not
// made when the quota has less; a call that succeeds at once gives 1
// token back, a retry that succeeds its own cost (aws-sdk-js-v3
// middleware-retry constants.ts: INITIAL_RETRY_TOKENS 500, RETRY_COST 5,
// TIMEOUT_RETRY_COST 10, NO_RETRY_INCREMENT 1; defaultRetryQuota.ts;
// aws-sdk-go-v2 retry/standard.go). Its backoff is the Go SDK's
// ExponentialJitterBackoff: a random share of min(20 s, base × 2^attempt),
// attempt the number of the attempt that failed (1 s base today).
//
// The 2026 behaviour (AWS_NEW_RETRIES_2026, the default from November
// 2026; https://github.com/aws/aws-sdk-go-v2/pull/3400,
// https://github.com/aws/aws-sdk-cpp/issues/3832, the AWS Developer
// Tools blog "Announcing updated retry behavior for AWS SDKs and Tools"):
// a transient (non-throttling) retry costs 14 tokens, a
// throttling one 5; the base backoff is 50 ms for transient errors and
// 1 s for throttling; MAX_BACKOFF applies before the jitter; and the SDK
// honours the server's retry-after (here, grpc-retry-pushback-ms).
type awsClient struct {
	roundRobin
	rand   *rand.Rand
	quota  int
	v2026  bool
	cost   int // a transient retry's cost
	tcost  int // a throttling retry's cost
	base   time.Duration
	tbase  time.Duration
	honour bool // honours the server's retry-after
}

// The AWS standard retry quota's constants (see awsClient).
const (
	awsQuota          = 500
	awsRetryCost      = 5
	awsNoRetryRefund  = 1
	awsRetryCost2026  = 14
	awsThrottleCost26 = 5
	awsMaxBackoff     = 20 * time.Second
	awsBase           = time.Second
	awsBase2026       = 50 * time.Millisecond
	awsThrottleBase26 = time.Second
)

// PolicyAWS is the AWS SDK standard retry mode as it is today; with
// v2026, as it is from November 2026.
func PolicyAWS(v2026 bool) *ClientPolicy {
	key, name := "aws", "AWS SDK standard (retry cost 5)"
	if v2026 {
		key, name = "aws-2026", "AWS SDK standard, 2026 (cost 14)"
	}
	return &ClientPolicy{Key: key, Name: name, MaxAttempts: rivalAttempts,
		New: func(e *Env, _ int) Client {
			c := &awsClient{roundRobin: newRoundRobin(e), rand: e.Rand, quota: awsQuota, v2026: v2026,
				cost: awsRetryCost, tcost: awsRetryCost, base: awsBase, tbase: awsBase}
			if v2026 {
				c.cost, c.tcost, c.base, c.tbase, c.honour = awsRetryCost2026, awsThrottleCost26, awsBase2026, awsThrottleBase26, true
			}
			return c
		}}
}

func (a *awsClient) Begin(*Call, time.Time) bool { return true }
func (a *awsClient) Send(*Call, time.Time) bool  { return true }
func (a *awsClient) End(*Call, time.Time, bool)  {}

func (a *awsClient) Settle(c *Call, _ time.Time, o Outcome) Verdict {
	if o.Code == OK {
		refund := awsNoRetryRefund
		if c.Attempts > 1 {
			refund = c.tokens
		}
		a.quota = min(a.quota+refund, awsQuota)
		return Verdict{}
	}
	throttled := o.Code == ResourceExhausted
	if (o.Code != Unavailable && !throttled) || c.Attempts >= rivalAttempts {
		return Verdict{}
	}
	cost, b := a.cost, a.base
	if throttled {
		cost, b = a.tcost, a.tbase
	}
	if a.quota < cost {
		return Verdict{}
	}
	a.quota -= cost
	c.tokens = cost
	if a.honour && o.Pushback != NoPushback && o.Pushback >= 0 {
		return Verdict{Retry: true, Delay: o.Pushback}
	}
	d := min(float64(awsMaxBackoff), float64(b)*math.Pow(2, float64(c.Attempts)))
	return Verdict{Retry: true, Delay: time.Duration(a.rand.Float64() * d)}
}

// envoyClient is Envoy's retry budget (a cluster's circuit breaker
// thresholds, envoy/config/cluster/v3/circuit_breaker.proto, RetryBudget):
// a retry is made only while the retries in flight or in backoff are
// fewer than max(min_retry_concurrency, budget_percent × the active
// requests), budget_percent 20% and min_retry_concurrency 3 by default.
// An Envoy sidecar per client: one budget per client. Its backoff is
// Envoy's (route_components.proto, RetryPolicy.RetryBackOff): base_interval
// 25 ms, max_interval 10 × base, fully jittered exponential.
type envoyClient struct {
	roundRobin
	rand            *rand.Rand
	active, retries int
}

// Envoy's retry budget and backoff defaults (see envoyClient).
const (
	envoyBudgetPercent = 0.20
	envoyMinRetries    = 3
	envoyBase          = 25 * time.Millisecond
	envoyMax           = 10 * envoyBase
)

// PolicyEnvoy is Envoy's retry budget, per client.
func PolicyEnvoy() *ClientPolicy {
	return &ClientPolicy{Key: "envoy", Name: "Envoy retry budget (20%, min 3)", MaxAttempts: rivalAttempts,
		New: func(e *Env, _ int) Client { return &envoyClient{roundRobin: newRoundRobin(e), rand: e.Rand} }}
}

func (v *envoyClient) Begin(*Call, time.Time) bool { return true }
func (v *envoyClient) Send(*Call, time.Time) bool  { return true }

func (v *envoyClient) Pick(c *Call, now time.Time, m int) (int, bool) {
	v.active++ // an attempt in flight is an active request
	return v.roundRobin.Pick(c, now, m)
}

func (v *envoyClient) Settle(c *Call, _ time.Time, o Outcome) Verdict {
	v.active--
	v.done(c)
	if o.Code != Unavailable || c.Attempts >= rivalAttempts {
		return Verdict{}
	}
	if limit := max(envoyMinRetries, int(envoyBudgetPercent*float64(v.active))); v.retries >= limit {
		return Verdict{} // upstream_rq_retry_overflow
	}
	v.retries++
	c.active = true
	d := min(float64(envoyBase)*math.Pow(2, float64(c.Attempts-1)), float64(envoyMax))
	return Verdict{Retry: true, Delay: time.Duration(v.rand.Float64() * d)}
}

// done ends the call's active retry, if it has one.
func (v *envoyClient) done(c *Call) {
	if c.active {
		v.retries--
		c.active = false
	}
}

func (v *envoyClient) End(c *Call, _ time.Time, _ bool) { v.done(c) }

// finagleClient is Finagle's default RetryBudget (finagle-core
// RetryBudget.scala, RetryBudget.apply()): ttl 10 s, minRetriesPerSec 10,
// percentCanRetry 0.2, as a leaky token bucket over a window of ttl in 10
// slices: each request deposits 1,000, each retry withdraws 1,000 / 0.2 =
// 5,000 when the window's sum plus a reserve of minRetriesPerSec × ttl ×
// 5,000 holds that much. Its backoff is RetryPolicy.tries' (decorrelated
// jitter from 5 ms to 200 ms).
type finagleClient struct {
	roundRobin
	rand  *rand.Rand
	slots [finagleSlots]int64
	slot  int64 // the second the newest slot counts
	sum   int64
}

// Finagle's RetryBudget defaults (see finagleClient).
const (
	finagleSlots    = 10
	finagleTTL      = 10 * time.Second
	finagleDeposit  = 1000
	finagleWithdraw = 5000 // ScaleFactor / percentCanRetry
	finagleReserve  = 10 * 10 * finagleWithdraw
	finagleMinWait  = 5 * time.Millisecond
	finagleMaxWait  = 200 * time.Millisecond
)

// PolicyFinagle is Finagle's default retry budget, per client.
func PolicyFinagle() *ClientPolicy {
	return &ClientPolicy{Key: "finagle", Name: "Finagle RetryBudget (20% + 10/s)", MaxAttempts: rivalAttempts,
		New: func(e *Env, _ int) Client { return &finagleClient{roundRobin: newRoundRobin(e), rand: e.Rand} }}
}

// add adds n to the window's newest slot at now.
func (f *finagleClient) add(now time.Time, n int64) {
	s := now.UnixNano() / int64(finagleTTL/finagleSlots)
	for ; f.slot < s; f.slot++ {
		if s-f.slot > finagleSlots {
			f.slots, f.sum, f.slot = [finagleSlots]int64{}, 0, s
			break
		}
		i := (f.slot + 1) % finagleSlots
		f.sum -= f.slots[i]
		f.slots[i] = 0
	}
	f.slots[s%finagleSlots] += n
	f.sum += n
}

func (f *finagleClient) Begin(_ *Call, now time.Time) bool {
	f.add(now, finagleDeposit)
	return true
}

func (f *finagleClient) Send(*Call, time.Time) bool { return true }
func (f *finagleClient) End(*Call, time.Time, bool) {}

func (f *finagleClient) Settle(c *Call, now time.Time, o Outcome) Verdict {
	if o.Code != Unavailable || c.Attempts >= rivalAttempts {
		return Verdict{}
	}
	f.add(now, 0)
	if f.sum+finagleReserve < finagleWithdraw {
		return Verdict{}
	}
	f.add(now, -finagleWithdraw)
	w := finagleMinWait
	if c.lastWait > 0 {
		w = min(finagleMaxWait, finagleMinWait+time.Duration(f.rand.Float64()*float64(3*c.lastWait-finagleMinWait)))
	}
	c.lastWait = w
	return Verdict{Retry: true, Delay: w}
}

// sreClient is Google SRE's client-side adaptive throttling ("Site
// Reliability Engineering", chapter 21, Handling Overload): every attempt
// is rejected locally with probability max(0, (requests − K × accepts) /
// (requests + 1)) over the last 2 minutes, K = 2; requests counts every
// attempt the client asked for (rejected ones too), accepts those its
// backend answered with success. In front of grpc-go's retryPolicy
// (3 attempts, the book's per-request limit), with its backoff.
type sreClient struct {
	grpcClient
	req, acc [sreSlots]int32
	slot     int64
	nreq     int32
	nacc     int32
}

// The adaptive throttling's constants (see sreClient).
const (
	sreK      = 2
	sreWindow = 2 * time.Minute
	sreSlots  = 12
)

// PolicySRE is Google SRE's client-side adaptive throttling, per client.
func PolicySRE() *ClientPolicy {
	return &ClientPolicy{Key: "sre", Name: "SRE adaptive throttling (K=2)", MaxAttempts: rivalAttempts, MarksRetries: true,
		New: func(e *Env, _ int) Client {
			return &sreClient{grpcClient: *newGRPCClient(e, false, suiteBackoffBase, suiteBackoffMax)}
		}}
}

// roll moves the window to now.
func (s *sreClient) roll(now time.Time) {
	t := now.UnixNano() / int64(sreWindow/sreSlots)
	for ; s.slot < t; s.slot++ {
		if t-s.slot > sreSlots {
			s.req, s.acc, s.nreq, s.nacc, s.slot = [sreSlots]int32{}, [sreSlots]int32{}, 0, 0, t
			break
		}
		i := (s.slot + 1) % sreSlots
		s.nreq -= s.req[i]
		s.nacc -= s.acc[i]
		s.req[i], s.acc[i] = 0, 0
	}
}

// admit counts a request and decides whether it is sent.
func (s *sreClient) admit(now time.Time) bool {
	s.roll(now)
	p := max(0, (float64(s.nreq)-sreK*float64(s.nacc))/(float64(s.nreq)+1))
	s.req[s.slot%sreSlots]++
	s.nreq++
	return s.rand.Float64() >= p
}

func (s *sreClient) Begin(_ *Call, now time.Time) bool { return s.admit(now) }
func (s *sreClient) Send(_ *Call, now time.Time) bool  { return s.admit(now) }

func (s *sreClient) Settle(c *Call, now time.Time, o Outcome) Verdict {
	if o.Code == OK {
		s.roll(now)
		s.acc[s.slot%sreSlots]++
		s.nacc++
	}
	return s.grpcClient.Settle(c, now, o)
}

// Rivals returns the rival policies, in table order.
func Rivals() []*ClientPolicy {
	return []*ClientPolicy{PolicyNone(), PolicyGRPC(), PolicyGRPCThrottled(), PolicyAWS(false), PolicyAWS(true),
		PolicyEnvoy(), PolicyFinagle(), PolicySRE()}
}
