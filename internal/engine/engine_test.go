package engine

import (
	"errors"
	"net"
	"testing"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
)

// These tests drive the engine as an adapter does, on explicit times and
// with no transport: a Route, a Call with its plan, attempts opened
// (the admission), and outcomes taken through the one step.

const ms = time.Millisecond

var t0 = time.Unix(1_700_000_000, 0)

// host is the adapter's side of a call: it counts the reads of the
// operator's configuration and answers for the user's predicate.
type host struct {
	refreshed int
	retryIf   func(Outcome) bool
	asked     []Outcome
}

func (h *host) Refresh(time.Time, bool) { h.refreshed++ }

func (h *host) RetryIf(o Outcome) bool {
	h.asked = append(h.asked, o)
	return h.retryIf == nil || h.retryIf(o)
}

// throttle is an operator's throttle that is on or off.
type throttle struct{ on bool }

func (t *throttle) Throttled() bool { return t.on }
func (t *throttle) Failure()        {}
func (t *throttle) Success()        {}

// newRoute returns a route with no budget, no breaker and a backoff with
// no jitter: 10ms, 20ms, ... up to 100ms.
func newRoute(cfg Config) *Route {
	cfg.Jitter = func(n int64) int64 { return n - 1 } // the longest backoff
	cfg.Failures = Codes(Unavailable, DeadlineExceeded)
	return &Route{Config: &cfg, Endpoints: new(Endpoints), Rule: Rule{
		MaxAttempts: 3, Retryable: Codes(Unavailable), BackoffBase: 10 * ms, BackoffMax: 100 * ms, BackoffMult: 2}}
}

// begin begins a call that may be repeated on r at now.
func begin(r *Route, now time.Time) *Call {
	c := &Call{Rule: &r.Rule, Repeatable: true}
	c.Begin(r, now, 0)
	return c
}

// open opens an attempt of kind k at now, which the admission must let
// through.
func open(t *testing.T, c *Call, k Kind, now time.Time) *Attempt {
	t.Helper()
	a := new(Attempt)
	var adm Admission
	if c.Open(a, k, now, &adm); adm.Refused != 0 {
		t.Fatalf("%v at %v refused: %v", k, now.Sub(t0), adm.Refused)
	}
	return a
}

// drained returns a budget that grants nothing.
func drained(now time.Time) *budget.Budget {
	b := budget.New(budget.Config{Ratio: -1})
	for b.WithdrawAt(now) {
	}
	return b
}

var (
	epA = &net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 443}
	epB = &net.TCPAddr{IP: net.IPv4(10, 0, 0, 2), Port: 443}
)

func TestStepRetriesThenConcludes(t *testing.T) {
	r := newRoute(Config{})
	h := &host{}
	c := begin(r, t0)
	a := open(t, c, First, t0)
	v := c.Step(h, a, &Outcome{Code: Unavailable, At: t0.Add(5 * ms)}, 0)
	if v.Next != Again || v.Delay != 10*ms || v.Reason != 0 {
		t.Fatalf("first failure: %+v, want Again after 10ms", v)
	}
	a = open(t, c, Retry, t0.Add(15*ms))
	v = c.Step(h, a, &Outcome{Code: Unavailable, At: t0.Add(20 * ms)}, 0)
	if v.Next != Again || v.Delay != 20*ms {
		t.Fatalf("second failure: %+v, want Again after 20ms (the backoff grows)", v)
	}
	a = open(t, c, Retry, t0.Add(40*ms))
	v = c.Step(h, a, &Outcome{Code: Unavailable, At: t0.Add(45 * ms)}, 0)
	if v.Next != Done || v.Reason != ReasonMaxAttempts {
		t.Fatalf("third failure: %+v, want Done for max_attempts", v)
	}
	if c.Sent() != 3 || c.Retries() != 2 || c.Idle() != 30*ms {
		t.Errorf("sent %d, retries %d, idle %v; want 3, 2, 30ms", c.Sent(), c.Retries(), c.Idle())
	}
	if len(h.asked) != 2 {
		t.Errorf("RetryIf asked %d times, want 2 (not when no attempt is left)", len(h.asked))
	}
	if v := c.Step(h, open(t, begin(r, t0), First, t0), &Outcome{Code: OK, At: t0}, 0); v.Next != Done || v.Reason != 0 {
		t.Errorf("success: %+v, want Done", v)
	}
}

// TestStepRules takes one failure through the step for each rule that
// stops or shapes a retry.
func TestStepRules(t *testing.T) {
	errUser := errors.New("the attempt's error")
	for _, tc := range []struct {
		name   string
		plan   func(c *Call, r *Route, h *host)
		o      Outcome
		others int
		next   Next
		reason Reason
		delay  time.Duration
	}{
		{name: "retryable", o: Outcome{Code: Unavailable}, next: Again, delay: 10 * ms},
		{name: "code", o: Outcome{Code: InvalidArgument}, reason: ReasonCode},
		{name: "cut at its per-attempt timeout", o: Outcome{Code: DeadlineExceeded, TimedOut: true}, next: Again, delay: 10 * ms},
		{name: "not idempotent", plan: func(c *Call, _ *Route, _ *host) { c.Repeatable = false }, o: Outcome{Code: Unavailable}, reason: ReasonNotIdempotent},
		{name: "asked for one attempt", plan: func(c *Call, _ *Route, _ *host) { c.Asked = 1 }, o: Outcome{Code: Unavailable}, reason: ReasonMaxAttempts},
		{name: "the transport retries", plan: func(c *Call, _ *Route, _ *host) { c.GRPCRetry = true }, o: Outcome{Code: Unavailable}, reason: ReasonGRPCRetry},
		{name: "RetryPolicy.If", plan: func(_ *Call, _ *Route, h *host) { h.retryIf = func(o Outcome) bool { return o.Err != errUser } },
			o: Outcome{Code: Unavailable, Err: errUser}, reason: ReasonRetryIf},
		{name: "pushback -1", o: Outcome{Code: Unavailable, Pushback: Delay{Stop: true, Sent: true}}, reason: ReasonPushback},
		{name: "pushback 50ms", o: Outcome{Code: Unavailable, Pushback: Delay{After: 50 * ms, Set: true, Sent: true}}, next: Again, delay: 50 * ms},
		{name: "the longer of pushback and RetryInfo", o: Outcome{Code: Unavailable, Pushback: Delay{After: 50 * ms, Set: true, Sent: true},
			RetryInfo: Delay{After: 80 * ms, Set: true, Sent: true}}, next: Again, delay: 80 * ms},
		{name: "RetryInfo says stop", o: Outcome{Code: Unavailable, RetryInfo: Delay{Stop: true, Sent: true}}, reason: ReasonPushback},
		{name: "the backoff ends after the deadline", plan: func(c *Call, _ *Route, _ *host) { c.Deadline = t0.Add(10 * ms) },
			o: Outcome{Code: Unavailable}, reason: ReasonDeadline},
		{name: "the caller left", o: Outcome{Code: Canceled, CallerLeft: true}},
		{name: "budget", plan: func(_ *Call, r *Route, _ *host) { r.Budget = drained(t0) }, o: Outcome{Code: Unavailable}, reason: ReasonBudget},
		{name: "throttle", plan: func(c *Call, _ *Route, _ *host) { c.Throttle = &throttle{on: true} }, o: Outcome{Code: Unavailable}, reason: ReasonThrottle},
		// A hedged call: a retry is sent at once while others run, and a
		// refusal that does not settle the call waits for them.
		{name: "hedged: retryable", o: Outcome{Code: Unavailable}, others: 1, next: Again},
		{name: "hedged: budget", plan: func(_ *Call, r *Route, _ *host) { r.Budget = drained(t0) }, o: Outcome{Code: Unavailable}, others: 1, next: Wait, reason: ReasonBudget},
		{name: "hedged: code", o: Outcome{Code: InvalidArgument}, others: 1, reason: ReasonCode},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, h := newRoute(Config{}), &host{}
			c := &Call{Rule: &r.Rule, Repeatable: true}
			if tc.plan != nil {
				tc.plan(c, r, h)
			}
			c.Begin(r, t0, 0)
			a := open(t, c, First, t0)
			tc.o.At = t0.Add(ms)
			v := c.Step(h, a, &tc.o, tc.others)
			if v.Next != tc.next || v.Reason != tc.reason || v.Delay != tc.delay {
				t.Errorf("verdict %+v (%v), want next %v, reason %v, delay %v", v, v.Reason, tc.next, tc.reason, tc.delay)
			}
		})
	}
}

// TestPushbackStopHolds: a server's "do not retry" holds for the rest of
// the call, whatever the later attempts' outcomes.
func TestPushbackStopHolds(t *testing.T) {
	r, h := newRoute(Config{}), &host{}
	c := begin(r, t0)
	a1, a2 := open(t, c, First, t0), open(t, c, Hedge, t0.Add(ms))
	if v := c.Step(h, a1, &Outcome{Code: Unavailable, Pushback: Delay{Stop: true, Sent: true}, At: t0.Add(2 * ms)}, 1); v.Next != Wait || v.Reason != ReasonPushback {
		t.Fatalf("pushback -1 beside another attempt: %+v, want Wait", v)
	}
	if v := c.Step(h, a2, &Outcome{Code: Unavailable, At: t0.Add(3 * ms)}, 0); v.Next != Done || v.Reason != ReasonPushback {
		t.Fatalf("the other attempt's failure: %+v, want Done for pushback", v)
	}
}

// TestAdmission opens attempts against each gate, enforcing and in shadow
// mode: a refusal takes nothing, and in shadow mode the budget's and the
// breaker's refusals do not stand.
func TestAdmission(t *testing.T) {
	openBreaker := func() *breaker.Breaker {
		b := breaker.New(breaker.Config{MinAttempts: 1, Jitter: -1})
		tk, _ := b.AdmitAt(t0)
		tk.DoneAt(true, t0)
		return b
	}
	for _, shadow := range []bool{false, true} {
		for _, tc := range []struct {
			name   string
			set    func(c *Call, r *Route)
			kind   Kind
			reason Reason
			fails  bool // the gate's own failure (a call refused before it sent anything fails with it)
		}{
			{name: "deadline", set: func(c *Call, _ *Route) { c.Deadline = t0 }, kind: First, reason: ReasonDeadline, fails: true},
			{name: "open breaker", set: func(_ *Call, r *Route) { r.Breaker = openBreaker() }, kind: First, reason: ReasonBreaker, fails: true},
			{name: "budget", set: func(_ *Call, r *Route) { r.Budget = drained(t0) }, kind: Retry, reason: ReasonBudget},
			{name: "budget, hedge", set: func(_ *Call, r *Route) { r.Budget = drained(t0) }, kind: Hedge, reason: ReasonBudget},
			{name: "throttle", set: func(c *Call, _ *Route) { c.Throttle = &throttle{on: true} }, kind: Retry, reason: ReasonThrottle},
			{name: "throttle, first attempt", set: func(c *Call, _ *Route) { c.Throttle = &throttle{on: true} }, kind: First},
		} {
			r := newRoute(Config{Shadow: shadow, NoFailover: true})
			c := &Call{Rule: &r.Rule, Repeatable: true}
			tc.set(c, r)
			c.Begin(r, t0, 0)
			a := new(Attempt)
			var adm Admission
			c.Open(a, tc.kind, t0.Add(ms), &adm)
			want := tc.reason
			if shadow && (want == ReasonBudget || want == ReasonBreaker) {
				if adm.Refused != 0 || adm.Would != want || a.Paid() {
					t.Errorf("shadow, %s: %+v, paid %v; want sent, would refuse for %v, not paid", tc.name, adm, a.Paid(), want)
				}
				continue
			}
			if adm.Refused != want || adm.Fails != tc.fails || adm.Would != 0 {
				t.Errorf("shadow %v, %s: %+v, want refused for %v (fails %v)", shadow, tc.name, adm, want, tc.fails)
			}
			if sent := c.Sent(); (want == 0) != (sent == 1) {
				t.Errorf("shadow %v, %s: %d sent", shadow, tc.name, sent)
			}
			if want == ReasonBreaker && adm.RetryAfter <= 0 {
				t.Errorf("%s: no RetryAfter", tc.name)
			}
		}
	}
}

// TestPeekTakesNothing: a budget with one token says yes to Peek as often
// as asked; Open takes the token, and says the retry was paid for.
func TestPeekTakesNothing(t *testing.T) {
	for _, shadow := range []bool{false, true} {
		r := newRoute(Config{Shadow: shadow})
		r.Budget = drained(t0)
		c := begin(r, t0) // deposits nothing: Ratio < 0
		r.Budget = budget.New(budget.Config{Ratio: -1, Burst: 1})
		for range 3 {
			if why := c.Peek(t0, Retry, false); why != 0 {
				t.Fatalf("shadow %v: Peek refused for %v", shadow, why)
			}
		}
		a := open(t, c, Retry, t0)
		if a.Paid() == shadow {
			t.Errorf("shadow %v: paid %v (in shadow mode nothing is paid)", shadow, a.Paid())
		}
		if why := c.Peek(t0, Retry, false); (why == ReasonBudget) == shadow {
			t.Errorf("shadow %v: Peek after the token was taken: %v", shadow, why)
		}
	}
}

// TestServesNothingThresholds: a retry is refused before its backoff only
// on stronger evidence that the target serves nothing (nothingBeforeBackoff
// failures, no success) than when it is due (nothingWhenDue); a first
// attempt is never refused for it.
func TestServesNothingThresholds(t *testing.T) {
	for _, tc := range []struct {
		failures                    int
		refusedWhenDue, refusedStep bool
	}{
		{nothingWhenDue - 1, false, false},
		{nothingWhenDue, true, false},
		{nothingBeforeBackoff - 1, true, false},
		{nothingBeforeBackoff, true, true},
	} {
		r := newRoute(Config{})
		r.Breaker = breaker.New(breaker.Config{}) // closed: 20 attempts before it may open
		for i := range tc.failures - 1 {
			r.Endpoints.Record(epA, true, t0.Add(time.Duration(i)*ms))
		}
		now := t0.Add(100 * ms)
		c := begin(r, now)
		a := open(t, c, First, now)
		v := c.Step(&host{}, a, &Outcome{Code: Unavailable, Endpoint: epA, At: now}, 0)
		if got := v.Reason == ReasonBreaker; got != tc.refusedStep {
			t.Errorf("%d failures: the step's verdict %+v; refused before the backoff: %v, want %v", tc.failures, v, got, tc.refusedStep)
		}
		if got := c.Peek(now, Retry, false) == ReasonBreaker; got != tc.refusedWhenDue {
			t.Errorf("%d failures: refused when due: %v, want %v", tc.failures, got, tc.refusedWhenDue)
		}
		var adm Admission
		if c.Open(new(Attempt), First, now, &adm); adm.Refused != 0 {
			t.Errorf("%d failures: a first attempt refused for %v", tc.failures, adm.Refused)
		}
	}
}

// TestFailover: a failure on an endpoint that fails while the others serve
// is retried as a fail-over, which the budget does not pay for; its pick
// avoids the failing endpoint, and, if it can go nowhere else, the budget
// pays at the pick or it is not sent.
func TestFailover(t *testing.T) {
	r := newRoute(Config{})
	for i := range 10 {
		at := t0.Add(time.Duration(i) * ms)
		r.Endpoints.Record(epA, true, at)
		r.Endpoints.Record(epB, false, at)
	}
	r.Budget = drained(t0)
	now := t0.Add(20 * ms)
	c := begin(r, now)
	a := open(t, c, First, now)
	v := c.Step(&host{}, a, &Outcome{Code: Unavailable, Endpoint: epA, At: now}, 0)
	if v.Next != Again || !v.Failover {
		t.Fatalf("failure on the outlier: %+v, want a fail-over (the budget grants nothing)", v)
	}
	now = now.Add(v.Delay)
	retry := open(t, c, Retry, now)
	if !retry.AtPick() || retry.Paid() {
		t.Fatalf("fail-over retry: at pick %v, paid %v; want decided at its pick, unpaid", retry.AtPick(), retry.Paid())
	}
	var p Pick
	c.Pick(&p, retry)
	for range maxFreeRepicks {
		if got := p.Judge(epA); got != PickAgain {
			t.Fatalf("pick of the outlier: %v, want PickAgain", got)
		}
	}
	if got := p.Judge(epA); got != PickPay {
		t.Fatalf("pick of the outlier after the re-picks: %v, want PickPay", got)
	}
	if got := p.Pay(now); got != PickUnpaid || !p.Stands(got) {
		t.Fatalf("pay with a drained budget: %v, want PickUnpaid, standing", got)
	}
	if adm := c.Picked(retry, true, now); adm.Refused != ReasonBudget || c.Sent() != 1 {
		t.Errorf("picked, refused: %+v, sent %d; want refused for the budget, not counted", adm, c.Sent())
	}
	var p2 Pick
	if c.Pick(&p2, retry); p2.Judge(epB) != PickSend {
		t.Error("a pick of the endpoint that serves is not sent")
	}
}

// TestGuardedFirstAttempt: an open breaker lets a first attempt through to
// its pick when the endpoints that served nothing are known; it is sent to
// one that serves, and refused only if it picks one that does not.
func TestGuardedFirstAttempt(t *testing.T) {
	r := newRoute(Config{})
	b := breaker.New(breaker.Config{MinAttempts: 1, Jitter: -1})
	tk, _ := b.AdmitAt(t0)
	tk.DoneAt(true, t0)
	r.Breaker = b
	r.Endpoints.Record(epA, true, t0)
	r.Endpoints.Record(epB, false, t0)
	now := t0.Add(ms)
	c := begin(r, now)
	a := open(t, c, First, now)
	if !a.AtPick() {
		t.Fatal("the first attempt is not decided at its pick")
	}
	var p Pick
	c.Pick(&p, a)
	if got := p.Judge(epB); got != PickSend {
		t.Errorf("pick of the endpoint that serves: %v", got)
	}
	if adm := c.Picked(a, false, now); adm.Refused != 0 {
		t.Errorf("sent to the endpoint that serves, refused: %+v", adm)
	}
	c2 := begin(r, now)
	a2 := open(t, c2, First, now)
	var p2 Pick
	c2.Pick(&p2, a2)
	for range maxRepicks {
		p2.Judge(epA)
	}
	if got := p2.Judge(epA); got != PickRefused {
		t.Fatalf("pick of the endpoint that served nothing, after the re-picks: %v", got)
	}
	if adm := c2.Picked(a2, true, now); adm.Refused != ReasonBreaker || !adm.Fails || c2.Sent() != 0 {
		t.Errorf("refused at the pick: %+v, sent %d", adm, c2.Sent())
	}
}

// TestStepBudgetDry takes a failure the server said its budget could not
// pay a retry for (Outcome.BudgetDry) through the step: the retry avoids
// the endpoint that said so and every endpoint that failed lately, is
// not sent when that leaves none, and is paid from the budget's credit
// alone, never from a new loan.
func TestStepBudgetDry(t *testing.T) {
	h := &host{}
	fail := func(c *Call, a *Attempt, at time.Time, ep net.Addr, dry bool) Verdict {
		return c.Step(h, a, &Outcome{Code: Unavailable, Endpoint: ep, At: at, BudgetDry: dry}, 0)
	}

	t.Run("every endpoint failed lately", func(t *testing.T) {
		r := newRoute(Config{})
		r.Endpoints.Record(epB, true, t0) // B failed 9 s before
		c := begin(r, t0.Add(9*time.Second))
		a := open(t, c, First, t0.Add(9*time.Second))
		if v := fail(c, a, t0.Add(9*time.Second), epA, true); v.Next != Done || v.Reason != ReasonBudget {
			t.Fatalf("dry on A, B failed 9 s ago: %+v, want Done for budget", v)
		}
	})

	t.Run("an endpoint that failed long ago is tried", func(t *testing.T) {
		r := newRoute(Config{})
		r.Endpoints.Record(epB, true, t0) // B failed 10 s before: forgotten
		now := t0.Add(10 * time.Second)
		c := begin(r, now)
		a := open(t, c, First, now)
		v := fail(c, a, now, epA, true)
		if v.Next != Again {
			t.Fatalf("dry on A, B failed 10 s ago: %+v, want Again", v)
		}
		if got := c.Avoid(); len(got) != 1 || got[0] != epA {
			t.Errorf("the retry avoids %v, want [A]", got)
		}
	})

	t.Run("paid from credit, not from a new loan", func(t *testing.T) {
		r := newRoute(Config{})
		r.Budget = budget.New(budget.Config{}) // no deposit yet: only a loan would pay
		now := t0.Add(time.Minute)
		r.Endpoints.Record(epB, false, now) // B serves: the retry has somewhere to go
		c := begin(r, now)
		a := open(t, c, First, now)
		if v := fail(c, a, now, epA, true); v.Next != Done || v.Reason != ReasonBudget {
			t.Fatalf("dry with no credit: %+v, want Done for budget", v)
		}
		for range 10 { // ten calls' deposits: credit for one retry
			begin(r, now)
		}
		c = begin(r, now)
		a = open(t, c, First, now)
		if v := fail(c, a, now, epA, true); v.Next != Again {
			t.Fatalf("dry with credit: %+v, want Again", v)
		}
		var adm Admission
		if c.Open(new(Attempt), Retry, now, &adm); adm.Refused != 0 {
			t.Fatalf("the retry paid from credit refused: %v", adm.Refused)
		}
		c = begin(r, now)
		a = open(t, c, First, now)
		if v := fail(c, a, now, epA, false); v.Next != Again {
			t.Fatalf("the same failure, not dry: %+v, want Again (a loan pays)", v)
		}
		adm = Admission{}
		if c.Open(new(Attempt), Retry, now, &adm); adm.Refused != 0 {
			t.Fatalf("the retry a loan pays for refused: %v", adm.Refused)
		}
	})

	t.Run("an endpoint not heard from yet is somewhere to go", func(t *testing.T) {
		r := newRoute(Config{})
		c := begin(r, t0)
		c.Resolved = resolved(2) // A answered; B, which the channel was given, has not
		a := open(t, c, First, t0)
		v := fail(c, a, t0, epA, true)
		if v.Next != Again {
			t.Fatalf("dry on A, B unheard: %+v, want Again", v)
		}
		if got := c.Avoid(); len(got) != 1 || got[0] != epA {
			t.Errorf("the retry avoids %v, want [A]", got)
		}
		c = begin(r, t0)
		a = open(t, c, First, t0)
		if v := fail(c, a, t0, epA, true); v.Next != Done || v.Reason != ReasonBudget {
			t.Fatalf("dry on A, the channel's endpoints not known: %+v, want Done for budget", v)
		}
	})

	t.Run("shadow mode sends it", func(t *testing.T) {
		r := newRoute(Config{Shadow: true})
		r.Endpoints.Record(epB, true, t0)
		c := begin(r, t0.Add(time.Second))
		a := open(t, c, First, t0.Add(time.Second))
		if v := fail(c, a, t0.Add(time.Second), epA, true); v.Next != Again {
			t.Fatalf("dry everywhere in shadow mode: %+v, want Again", v)
		}
	})
}

// resolved is a channel's resolver that gave n endpoints.
type resolved int

func (n resolved) Endpoints() int { return int(n) }

// TestStepUnheardEndpointsArePaidFor: a failure on the one endpoint a
// channel has heard from, while others it was given have not answered,
// is retried away from it, but as an ordinary retry the budget pays for,
// not as a free fail-over: a fleet of fresh or quiet clients whose target
// fails everywhere would otherwise retry each client's first failures
// for free.
func TestStepUnheardEndpointsArePaidFor(t *testing.T) {
	h := &host{}
	for _, tc := range []struct {
		name   string
		budget *budget.Budget
		want   Next
	}{
		{"a budget that pays", nil, Again},
		{"a drained budget", drained(t0), Done},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRoute(Config{})
			r.Budget = tc.budget
			c := begin(r, t0)
			c.Resolved = resolved(3)
			a := open(t, c, First, t0)
			v := c.Step(h, a, &Outcome{Code: Unavailable, Endpoint: epA, At: t0.Add(ms)}, 0)
			if v.Next != tc.want || v.Failover {
				t.Fatalf("failure on A, B and C unheard: %+v, want %v and no fail-over", v, tc.want)
			}
			if got := c.Avoid(); len(got) != 1 || got[0] != epA {
				t.Errorf("the retry avoids %v, want [A]", got)
			}
		})
	}
}

// TestEndpointsFindTheirEndpoints records outcomes on tables small enough
// to be searched and large enough to be looked up by address: each
// address keeps one endpoint, which counts its own outcomes.
func TestEndpointsFindTheirEndpoints(t *testing.T) {
	for _, n := range []int{1, epScan, epScan + 1, 40} {
		var eps Endpoints
		addrs := make([]net.Addr, n)
		for i := range addrs {
			addrs[i] = &net.TCPAddr{IP: net.IPv4(10, 1, byte(i>>8), byte(i)), Port: 443}
		}
		for i, a := range addrs {
			for range i + 1 {
				eps.Record(a, i%2 == 1, t0)
			}
		}
		if got := eps.seen(); got != n {
			t.Errorf("%d endpoints: the table holds %d", n, got)
		}
		for i, a := range addrs {
			ok, fail := eps.countsOf(a, t0)
			want := int64(i + 1)
			if i%2 == 1 && (ok != 0 || fail != want) || i%2 == 0 && (ok != want || fail != 0) {
				t.Errorf("%d endpoints, endpoint %d: %d ok, %d failed; want %d of one kind", n, i, ok, fail, want)
			}
		}
	}
}
