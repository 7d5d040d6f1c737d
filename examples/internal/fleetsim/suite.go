package fleetsim

import (
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/internal/breakerrand"
)

// suiteClient is the suite's client (interceptor.NewClient() as it comes)
// for one target: the library's retry budget and breaker decide, driven
// with the model's times; the engine's rules around them are the interim
// engine's (engine_interim.go).
type suiteClient struct {
	interimEngine
	budget  *budget.Budget
	breaker *breaker.Breaker
	// failedAt is, per backend, when its last failure came (the engine's
	// endpoint.lastFail), in ns since the run's origin; 0: none yet.
	failedAt []int64
	base     time.Time
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

// PolicySuiteWith is the suite's client with the given budget and attempt
// limit.
func PolicySuiteWith(o SuiteOptions) *ClientPolicy {
	attempts := o.MaxAttempts
	if attempts <= 0 {
		attempts = defaultAttempts
	}
	return &ClientPolicy{Key: "suite", Name: "stormguard defaults", MaxAttempts: attempts, MarksRetries: true,
		New: func(e *Env, _ int) Client {
			g := newInterimEngine(e, attempts)
			if o.BackoffBase > 0 {
				g.base = o.BackoffBase
			}
			if o.BackoffMax > 0 {
				g.cap = max(o.BackoffMax, g.base)
			}
			var bc breaker.Config
			breakerrand.Set(&bc, e.Rand.Float64)
			return &suiteClient{
				interimEngine: g,
				budget:        budget.New(o.Budget),
				breaker:       breaker.New(bc),
				failedAt:      make([]int64, max(e.Backends, 1)),
				base:          e.Base,
			}
		}}
}

// Begin deposits the call in the budget and asks the breaker for its
// first attempt. An open breaker refuses it (the engine, when it knows
// endpoints that served nothing, lets such an attempt through to its pick
// and refuses it there only if it picks one of them; with no fail-over in
// the interim engine, every endpoint is alike).
func (s *suiteClient) Begin(c *Call, now time.Time) bool {
	s.budget.DepositAt(now)
	t, err := s.breaker.AdmitAt(now)
	if err != nil {
		return false
	}
	c.ticket = t
	return true
}

// Settle reports the attempt's outcome to the breaker and the target's
// table, and decides as the engine's decide does: the rules, then whether
// the retry could be paid for now (the breaker open, the target dead for
// sure, the budget's PeekAt), so that no backoff is waited for a retry
// that would be refused.
func (s *suiteClient) Settle(c *Call, now time.Time, o Outcome) Verdict {
	failed := failure(o.Code)
	c.ticket.DoneAt(failed, now)
	s.record(now, failed)
	if failed {
		s.failedAt[o.Backend] = max(now.Sub(s.base).Nanoseconds(), 1)
	}
	if o.Code == OK {
		return Verdict{}
	}
	d, ok := s.rules(c, now, o)
	if !ok || s.dryEverywhere(c, now) || s.breaker.RetryAfterAt(now) > 0 || s.servedNothing(now, minDeadForSure) || !s.peek(c, now) {
		return Verdict{}
	}
	return Verdict{Retry: true, Delay: d}
}

// Send is the engine's gate for a retry that is due: the breaker, the
// target having served nothing lately, then a token from the budget.
func (s *suiteClient) Send(c *Call, now time.Time) bool {
	t, err := s.breaker.AdmitAt(now)
	if err != nil {
		return false
	}
	if s.dryEverywhere(c, now) || s.servedNothing(now, minServedNothing) || !s.withdraw(c, now) {
		t.Ignore()
		return false
	}
	c.ticket, c.budgeted = t, true
	return true
}

// failedLately is the engine's endpoints.failedLately for backend b: it
// failed an attempt within epFailedMemory of now.
func (s *suiteClient) failedLately(b int, now time.Time) bool {
	f := s.failedAt[b]
	return f != 0 && now.Sub(s.base).Nanoseconds()-f < int64(epFailedMemory)
}

// dryEverywhere is the engine's: after a failure whose server said its
// retry budget could not pay for a retry (Outcome.Dry), the retry avoids
// that backend and every backend that failed an attempt in the last 10 s,
// and is not sent when that leaves none (see Pick).
func (s *suiteClient) dryEverywhere(c *Call, now time.Time) bool {
	if !c.dry {
		return false
	}
	for b := range s.failedAt {
		if !s.failedLately(b, now) {
			return false
		}
	}
	return true
}

// Pick is the engine's pick through grpc-go's round_robin: a retry after a
// dry answer picks again, at most maxRepicks times, while it picks a
// backend it avoids (see dryEverywhere), and then goes where it picked.
func (s *suiteClient) Pick(c *Call, now time.Time, m int) int {
	b := s.roundRobin.Pick(c, now, m)
	if c.Attempts == 0 || !c.dry {
		return b
	}
	for range maxRepicks {
		if !s.failedLately(b, now) {
			break
		}
		b = s.roundRobin.Pick(c, now, m)
	}
	return b
}

// peek and withdraw are the engine's: after a failure the server said its
// retry budget could not pay a retry of (Outcome.Dry), the budget pays
// from its credit alone, never lent.
func (s *suiteClient) peek(c *Call, now time.Time) bool {
	if c.dry {
		return s.budget.PeekNoNewLoanAt(now)
	}
	return s.budget.PeekAt(now)
}

func (s *suiteClient) withdraw(c *Call, now time.Time) bool {
	if c.dry {
		return s.budget.WithdrawNoNewLoanAt(now)
	}
	return s.budget.WithdrawAt(now)
}

func (s *suiteClient) End(*Call, time.Time, bool) {}

// Credit returns what the client's budget holds at now, in retries (its
// Stats' Credit: negative while it is owed).
func (s *suiteClient) Credit(now time.Time) float64 { return s.budget.StatsAt(now).Credit }
