package fleetsim

import (
	"reflect"
	"testing"
	"time"
)

// target is a small target for the kernel's tests: 2 backends × 4
// workers × 10 ms (800 requests a second), a queue of 50 each.
var target = Backends{M: 2, Workers: 4, Queue: 50, Service: 10 * time.Millisecond, RTT: time.Millisecond}

func run(t *testing.T, cfg Config) *Result {
	t.Helper()
	r, err := Run(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestHealthyRunServesEveryCall: without a failure, at 50% of the
// target's capacity, every call succeeds with one attempt, whatever the
// policy.
func TestHealthyRunServesEveryCall(t *testing.T) {
	for _, p := range append(Rivals(), PolicySuite()) {
		r := run(t, Config{Groups: []Group{{Clients: 40, Rate: 10, Jitter: 1}}, Backends: target, Duration: 10 * time.Second, Seed: 3, Client: p})
		if w := r.Window; w.Calls < 3900 || w.OK != w.Calls || w.Sent != w.Calls || w.Handled != w.Calls {
			t.Errorf("%s: %+v, want every call ok at one attempt", p.Name, w)
		}
	}
}

// TestRunIsDeterministic: the same configuration gives the same result.
func TestRunIsDeterministic(t *testing.T) {
	cfg := Config{Groups: []Group{{Clients: 50, Rate: 5, Jitter: 1}}, Backends: target, Duration: 20 * time.Second, Seed: 9,
		Failure: Failure{Mode: Independent, P: 0.4, Start: 5 * time.Second, End: 15 * time.Second},
		Client:  PolicySuite(), Server: PolicySuiteServer()}
	a, b := run(t, cfg), run(t, cfg)
	a.Wall, b.Wall = 0, 0
	if !reflect.DeepEqual(a, b) {
		t.Errorf("two runs differ:\n%+v\n%+v", a.Window, b.Window)
	}
}

// TestSameFirstAttemptsFail: the draws depend on the call and the
// attempt, not on the policy, so every policy's first attempts fail alike:
// the calls a policy without retries loses are the first attempts that
// failed for every other.
func TestSameFirstAttemptsFail(t *testing.T) {
	cfg := Config{Groups: []Group{{Clients: 30, Rate: 4, Jitter: 1}}, Backends: target, Duration: 10 * time.Second, Seed: 5,
		Failure: Failure{Mode: Independent, P: 0.3, Start: 0, End: 10 * time.Second}}
	cfg.Client = PolicyNone()
	none := run(t, cfg)
	cfg.Client = PolicyGRPC()
	naive := run(t, cfg)
	// Every failed call of the naive policy failed its first attempt too:
	// its retries add successes, never lose one.
	if naive.Window.OK < none.Window.OK || none.Window.Calls != naive.Window.Calls {
		t.Errorf("no retries %+v, three attempts %+v", none.Window, naive.Window)
	}
	if got, want := none.Window.OKPercent(), 70.0; got < want-2 || got > want+2 {
		t.Errorf("no retries ok %.1f%%, want about %.0f%%", got, want)
	}
}

// TestCapacityBoundsGoodput: with the service time 4 times longer, the
// target serves a quarter of its capacity (200 a second of the 400 asked),
// and the rest fails: the queue is full, or the deadline passes.
func TestCapacityBoundsGoodput(t *testing.T) {
	r := run(t, Config{Groups: []Group{{Clients: 40, Rate: 10, Jitter: 1}}, Backends: target, Duration: 20 * time.Second, Seed: 1,
		Failure: Failure{Mode: CapacityDrop, Factor: 4, Start: 5 * time.Second, End: 15 * time.Second}, Client: PolicyNone()})
	if got := r.Window.OKPercent(); got < 45 || got > 55 {
		t.Errorf("ok %.1f%% in the drop, want about 50%% (200 of 400 a second)", got)
	}
	if r.Recovery < 0 || r.Recovery > time.Second {
		t.Errorf("recovery %v, want within 1 s of the drop's end", r.Recovery)
	}
}

// TestLateWorkIsWasted: a handler that keeps working requests whose
// callers have left (here, the deadline is shorter than the queue's
// wait) counts them as wasted, and their calls fail DEADLINE_EXCEEDED.
func TestLateWorkIsWasted(t *testing.T) {
	b := Backends{M: 1, Workers: 1, Queue: 1000, Service: 10 * time.Millisecond}
	r := run(t, Config{Groups: []Group{{Clients: 1, Rate: 200}}, Backends: b, Duration: 2 * time.Second, Deadline: 100 * time.Millisecond,
		Seed: 1, Client: PolicyNone()})
	if r.Wasted == 0 || r.Codes["DeadlineExceeded"] == 0 || r.Codes["DeadlineExceeded"] < r.Wasted {
		t.Errorf("wasted %d, codes %v: want late work wasted and its calls out of time", r.Wasted, r.Codes)
	}
}

// TestClosedLoop: a closed-loop group makes exactly its calls, each worker
// one at a time.
func TestClosedLoop(t *testing.T) {
	r := run(t, Config{Groups: []Group{{Clients: 2, Workers: 3, Calls: 100}}, Backends: target, Duration: time.Minute, Seed: 1, Client: PolicyNone()})
	if r.All.Calls != 200 || r.All.OK != 200 {
		t.Errorf("%+v, want 200 calls ok", r.All)
	}
}

// TestValidate refuses what cannot run.
func TestValidate(t *testing.T) {
	ok := Config{Groups: []Group{{Clients: 1, Rate: 1}}, Duration: time.Second}
	bad := []func(*Config){
		func(c *Config) { c.Groups = nil },
		func(c *Config) { c.Groups[0].Rate = 0 },
		func(c *Config) { c.Groups[0].Rate = 2000 },
		func(c *Config) { c.Groups[0].Clients = MaxClients + 1 },
		func(c *Config) { c.Duration = 0 },
		func(c *Config) { c.Failure = Failure{Mode: Independent, P: 2, Start: 0, End: 1} },
		func(c *Config) { c.Failure = Failure{Mode: BackendDead, Start: 0, End: 1} },
		func(c *Config) { c.Failure = Failure{Mode: Throttling, Start: 0, End: 1} },
		func(c *Config) { c.Failure = Failure{Mode: Outage, Start: 2, End: 1} },
	}
	if _, err := Run(ok); err != nil {
		t.Fatal(err)
	}
	for i, f := range bad {
		c := ok
		c.Groups = append([]Group(nil), ok.Groups...)
		f(&c)
		if _, err := Run(c); err == nil {
			t.Errorf("case %d: no error", i)
		}
	}
}

// oneAtATime is a server policy that lets one attempt at a time reach its
// handler and holds the others in its own queue, for the kernel's tests.
type oneAtATime struct {
	t        *testing.T
	busy     bool
	held     int
	order    []int // the calls admitted, by K
	left     int
	maxLate  time.Duration // the latest Decide after a held call's deadline
	deadline map[int]time.Time
}

func (g *oneAtATime) Admit(c *Call, now time.Time, _, _ bool) (Admission, Outcome) {
	if g.busy || g.held > 0 {
		g.held++
		g.deadline[c.K] = c.Deadline
		return Held, Outcome{}
	}
	g.busy = true
	g.order = append(g.order, c.K)
	return Admitted, Outcome{}
}

func (g *oneAtATime) Decide(c *Call, now time.Time) (Admission, Outcome) {
	if !now.Before(c.Deadline) {
		g.t.Errorf("call %d asked about at %v, its deadline %v", c.K, now, c.Deadline)
	}
	if g.busy {
		return Held, Outcome{}
	}
	g.busy = true
	g.held--
	g.order = append(g.order, c.K)
	return Admitted, Outcome{}
}

func (g *oneAtATime) Leave(c *Call, now time.Time) {
	if !now.Equal(g.deadline[c.K]) {
		g.t.Errorf("call %d left at %v, its deadline %v", c.K, now, g.deadline[c.K])
	}
	g.held--
	g.left++
}

func (g *oneAtATime) Done(*Call, time.Time, Code, bool) bool {
	g.busy = false
	return false
}

// TestHeldAttemptsWaitInOrderAndLeaveAtTheirDeadline: a server policy
// that holds attempts in its own queue gets them back in order of
// arrival, one each time a place frees, and those whose callers' deadline
// comes first leave then, unanswered: their calls fail DEADLINE_EXCEEDED,
// and the handler never sees them. (This server does not refuse what can
// no longer end in time, as the suite's does: of those it admits, the
// ones that waited longest end after their callers left.)
func TestHeldAttemptsWaitInOrderAndLeaveAtTheirDeadline(t *testing.T) {
	g := &oneAtATime{t: t, deadline: map[int]time.Time{}}
	srv := &ServerPolicy{Key: "one", Name: "one at a time", New: func(*Env, int) Server { return g }}
	r := run(t, Config{Groups: []Group{{Clients: 1, Rate: 100}}, Backends: Backends{M: 1, Service: 50 * time.Millisecond},
		Duration: time.Second, Deadline: 120 * time.Millisecond, Seed: 1, Client: PolicyNone(), Server: srv})
	for i := 1; i < len(g.order); i++ {
		if g.order[i] <= g.order[i-1] {
			t.Fatalf("admitted out of arrival order: %v", g.order)
		}
	}
	if g.left == 0 || g.held != 0 || r.ServerLeft != g.left || r.ServerHeld != r.ServerLeft+len(g.order)-1 {
		t.Errorf("left %d (counted %d), still held %d, held %d, admitted %d: want some gone, each held one admitted or gone", g.left, r.ServerLeft, g.held, r.ServerHeld, len(g.order))
	}
	if r.All.Handled != len(g.order) || r.All.OK == 0 || r.Codes["DeadlineExceeded"] != r.All.Calls-r.All.OK {
		t.Errorf("%+v, codes %v: want the %d admitted handled, and every call not ok out of time", r.All, r.Codes, len(g.order))
	}
}
