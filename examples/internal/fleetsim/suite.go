package fleetsim

import (
	"net"
	"net/netip"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/internal/breakerrand"
	"github.com/stormguard/stormguard/internal/engine"
)

// suiteClient is the suite's client (interceptor.NewClient() as it comes)
// for one target: the library's attempt engine (internal/engine) decides
// every attempt (the one step, the admission with the budget, the breaker
// and the endpoint table, the rules, the pick), driven with the model's
// times. The model gives it what the interceptor, its gRPC adapter, gives
// it: each attempt's outcome, the endpoint each pick went to, and the
// picks of grpc-go's round_robin.
type suiteClient struct {
	rr    roundRobin
	route engine.Route
	run   *suiteRun
}

// suiteRun is what the suite's clients of one run share: the engine's
// Config (one per interceptor.Client: each client of the fleet is one),
// the backends' addresses and what the channel's resolver gives.
type suiteRun struct {
	cfg   engine.Config
	addrs []net.Addr
}

// Endpoints implements engine.Resolved: the channel was given every
// backend.
func (r *suiteRun) Endpoints() int { return len(r.addrs) }

func newSuiteRun(e *Env) *suiteRun {
	r := &suiteRun{cfg: engine.Config{Failures: engine.DefaultFailures,
		Jitter: func(n int64) int64 { return e.Rand.Int64N(n) }}}
	for b := range max(e.Backends, 1) {
		r.addrs = append(r.addrs, net.TCPAddrFromAddrPort(netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, byte(b >> 8), byte(b)}), 443)))
	}
	return r
}

// SuiteOptions shape the suite's client: a budget Config, an attempt
// limit and a backoff (RetryPolicy's MaxAttempts, BackoffBase and
// BackoffMax; 0: the defaults).
type SuiteOptions struct {
	Budget                  budget.Config
	MaxAttempts             int
	BackoffBase, BackoffMax time.Duration
}

// PolicySuite is the suite's client with its defaults.
func PolicySuite() *ClientPolicy { return PolicySuiteWith(SuiteOptions{}) }

// PolicySuiteWith is the suite's client with the given budget, attempt
// limit and backoff.
func PolicySuiteWith(o SuiteOptions) *ClientPolicy {
	rule := engine.Rule{MaxAttempts: engine.DefaultMaxAttempts, Retryable: engine.DefaultRetryable,
		BackoffBase: engine.DefaultBackoffBase, BackoffMax: engine.DefaultBackoffMax, BackoffMult: 2}
	if o.MaxAttempts > 0 {
		rule.MaxAttempts = o.MaxAttempts
	}
	if o.BackoffBase > 0 {
		rule.BackoffBase = o.BackoffBase
	}
	if o.BackoffMax > 0 {
		rule.BackoffMax = max(o.BackoffMax, rule.BackoffBase)
	}
	rule.MaxHedges = rule.MaxAttempts - 1 // as the interceptor's ruleOf sets it; no hedging
	return &ClientPolicy{Key: "suite", Name: "stormguard defaults", MaxAttempts: rule.MaxAttempts, MarksRetries: true,
		New: func(e *Env, _ int) Client {
			run := e.suite
			if run == nil {
				run = newSuiteRun(e)
				e.suite = run
			}
			var bc breaker.Config
			breakerrand.Set(&bc, e.Rand.Float64)
			return &suiteClient{rr: newRoundRobin(e), run: run, route: engine.Route{
				Config:    &run.cfg,
				Budget:    budget.New(o.Budget),
				Breaker:   breaker.New(bc),
				Endpoints: new(engine.Endpoints),
				Yield:     engine.NewYield(),
				Rule:      rule,
			}}
		}}
}

// host is the interceptor's side of a call that the engine asks while it
// decides: no operator's configuration to read again, no user predicate.
type host struct{}

func (host) Refresh(time.Time, bool)     {}
func (host) RetryIf(engine.Outcome) bool { return true }

// Begin begins the call in the engine (which deposits it into the
// budget) and opens its first attempt: an open breaker refuses it here,
// unless the endpoints that served nothing are known, when it is judged
// at its pick.
func (s *suiteClient) Begin(c *Call, now time.Time) bool {
	c.eng = engine.Call{Rule: &s.route.Rule, Repeatable: true}
	c.eng.Deadline, c.eng.Resolved = c.Deadline, s.run
	c.eng.Begin(&s.route, now, 0)
	var adm engine.Admission
	c.eng.Open(&c.att, engine.First, now, &adm)
	return adm.Refused == 0
}

// Pick picks the attempt's backend as grpc-go's round_robin does, and has
// the engine judge each pick: an avoided backend is picked again, a
// guarded first attempt or an unpaid fail-over is refused there (false),
// and a fail-over with nowhere else to go is paid for there.
func (s *suiteClient) Pick(c *Call, now time.Time, m int) (int, bool) {
	var p engine.Pick
	c.eng.Pick(&p, &c.att)
	for {
		b := s.rr.pick(m)
		v := p.Judge(s.run.addrs[b])
		if v == engine.PickAgain {
			continue
		}
		if v == engine.PickPay {
			v = p.Pay(now)
		}
		adm := c.eng.Picked(&c.att, v >= engine.PickRefused, now)
		c.budgeted = c.att.Paid() || p.Paid()
		return b, adm.Refused == 0
	}
}

// Settle takes the attempt's outcome through the engine's step: what it
// learns (breaker, endpoint table), then the rules and whether the retry
// could be paid for now.
func (s *suiteClient) Settle(c *Call, now time.Time, o Outcome) Verdict {
	eo := engine.Outcome{Code: engineCodes[o.Code], Endpoint: s.run.addrs[o.Backend], At: now, BudgetDry: o.Dry}
	switch {
	case o.Pushback == NoPushback:
	case o.Pushback < 0 || o.Pushback > engine.MaxPushback:
		eo.Pushback = engine.Delay{Stop: true, Sent: true}
	default:
		eo.Pushback = engine.Delay{After: o.Pushback, Set: true, Sent: true}
	}
	// DEADLINE_EXCEEDED comes from the call's deadline only: its caller
	// has left.
	eo.CallerLeft = o.Code == DeadlineExceeded
	v := c.eng.Step(host{}, &c.att, &eo, 0)
	if v.Next != engine.Again {
		return Verdict{}
	}
	return Verdict{Retry: true, Delay: v.Delay}
}

// engineCodes are the model's codes as the engine numbers them.
var engineCodes = [...]engine.Code{OK: engine.OK, Unavailable: engine.Unavailable,
	ResourceExhausted: engine.ResourceExhausted, DeadlineExceeded: engine.DeadlineExceeded}

// Send opens the retry that is due: the engine's admission.
func (s *suiteClient) Send(c *Call, now time.Time) bool {
	var adm engine.Admission
	c.eng.Open(&c.att, engine.Retry, now, &adm)
	return adm.Refused == 0
}

func (s *suiteClient) End(*Call, time.Time, bool) {}

// Credit returns what the client's budget holds at now, in retries (its
// Stats' Credit: negative while it is owed).
func (s *suiteClient) Credit(now time.Time) float64 { return s.route.Budget.StatsAt(now).Credit }
