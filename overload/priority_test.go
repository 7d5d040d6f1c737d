package overload

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stormguard/stormguard/priority"
)

// TestPriorityShedOrder: at a limit of 8 (MaxConcurrency), sheddable
// requests are shed from 2 in flight, retries and hedges (critical ones
// too) from 4, default first attempts at 8, and critical first attempts
// only once 8 critical requests are in flight.
func TestPriorityShedOrder(t *testing.T) {
	c := newClock()
	g := New(Config{NoAdmission: true, NoAdaptive: true, MaxConcurrency: 8})
	m := g.Method("/svc/M")
	now := c.Now()
	var open []Ticket
	admit := func(p priority.Priority, retry bool) Decision {
		t.Helper()
		tk, d := m.AdmitAt(now, Request{Retry: retry, Priority: p})
		if d.Reason == Admitted {
			open = append(open, tk)
		}
		return d
	}
	want := func(what string, d Decision, reason Reason, limit int64) {
		t.Helper()
		if d.Reason != reason || (reason != Admitted && d.Limit != limit) {
			t.Fatalf("%s: %+v, want %v at %d", what, d, reason, limit)
		}
		if reason == ShedRetry && d.RetryAfter != DoNotRetry {
			t.Fatalf("%s: a shed retry with RetryAfter %v", what, d.RetryAfter)
		}
		if reason == ShedFirst && d.RetryAfter != DefaultRetryAfter {
			t.Fatalf("%s: a shed first attempt with RetryAfter %v", what, d.RetryAfter)
		}
	}
	want("sheddable at 0", admit(priority.Sheddable, false), Admitted, 0)
	want("sheddable retry at 1", admit(priority.Sheddable, true), Admitted, 0)
	want("sheddable at 2", admit(priority.Sheddable, false), ShedFirst, 2)
	want("sheddable retry at 2", admit(priority.Sheddable, true), ShedRetry, 2)
	want("retry at 2", admit(priority.Default, true), Admitted, 0)
	want("retry at 3", admit(priority.Default, true), Admitted, 0)
	want("retry at 4", admit(priority.Default, true), ShedRetry, 4)
	want("critical retry at 4", admit(priority.Critical, true), ShedRetry, 4)
	for i := 4; i < 8; i++ {
		want("default first attempt under 8", admit(priority.Default, false), Admitted, 0)
	}
	want("default first attempt at 8", admit(priority.Default, false), ShedFirst, 8)
	for range 8 {
		want("critical first attempt, fewer than 8 critical", admit(priority.Critical, false), Admitted, 0)
	}
	if n := m.Inflight(); n != 16 {
		t.Fatalf("%d in flight, want 16", n)
	}
	want("critical first attempt at 8 critical", admit(priority.Critical, false), ShedFirst, 8)
	want("sheddable at 16", admit(priority.Sheddable, false), ShedFirst, 2)

	// A critical request ends: its place goes to another critical one,
	// not to a default one (16 in flight is still past the limit).
	open[len(open)-1].DoneAt(now)
	open = open[:len(open)-1]
	want("default first attempt at 15", admit(priority.Default, false), ShedFirst, 8)
	want("critical first attempt at 7 critical", admit(priority.Critical, false), Admitted, 0)

	if st := g.Stats(); st.ShedFirst != 5 || st.ShedRetry != 3 || st.Admitted != 17 {
		t.Errorf("stats %+v", st)
	}
	for _, tk := range open {
		tk.DoneAt(now)
	}
	if m.Inflight() != 0 || m.critical.Load() != 0 || g.inflight.Load() != 0 || g.critical.Load() != 0 {
		t.Errorf("after every end: method %d (%d critical), guard %d (%d critical)",
			m.Inflight(), m.critical.Load(), g.inflight.Load(), g.critical.Load())
	}
}

// TestPriorityAtAnAdaptiveLimit: at an engaged adaptive limit L, a
// sheddable first attempt is shed from L/4 in flight even with a deadline
// (admission would have let it pass: its caller said it may be dropped);
// a default first attempt with a deadline waits for a place, and a
// critical one, which has the limit to itself, is admitted; without a
// deadline a default one is shed at L and a critical one only once L
// critical requests are in flight.
func TestPriorityAtAnAdaptiveLimit(t *testing.T) {
	c := newClock()
	g := New(Config{MinLimit: 8})
	m := g.Method("/svc/M")
	for range 5 {
		runWindow(t, c, m, 20, 10*time.Millisecond, 0)
	}
	for range 12 { // requests take 200ms, their callers have 100ms: the limit engages
		serve(t, c, m, 100, 200*time.Millisecond, 100*time.Millisecond)
	}
	limit := m.Limit()
	if limit < 8 {
		t.Fatalf("limit %d, want one engaged (at least the floor, 8)", limit)
	}
	now := c.Now()
	second := now.Add(time.Second)
	var open []Ticket
	admit := func(p priority.Priority, dl time.Time) Decision {
		tk, d := m.AdmitAt(now, Request{Deadline: dl, Priority: p})
		if d.Reason == Admitted {
			open = append(open, tk)
		}
		return d
	}
	quarter := max(limit/4, 1)
	for i := range quarter {
		if d := admit(priority.Sheddable, second); d.Reason != Admitted {
			t.Fatalf("sheddable %d of %d under a quarter of the limit: %+v", i, quarter, d)
		}
	}
	if d := admit(priority.Sheddable, second); d.Reason != ShedFirst || d.Limit != quarter {
		t.Fatalf("sheddable with a deadline at a quarter of the limit %d: %+v", limit, d)
	}
	for m.Inflight() < limit {
		if d := admit(priority.Default, time.Time{}); d.Reason != Admitted {
			t.Fatalf("default without a deadline under the limit: %+v", d)
		}
	}
	if d := admit(priority.Default, time.Time{}); d.Reason != ShedFirst {
		t.Fatalf("default without a deadline at the limit: %+v", d)
	}
	waiter, d := m.AdmitAt(now, Request{Deadline: second})
	if d.Reason != Queued {
		t.Fatalf("default with a deadline past the limit: %+v, want it to wait for a place", d)
	}
	if d := admit(priority.Critical, second); d.Reason != Admitted {
		t.Fatalf("critical with a deadline past the limit (critical work has the limit to itself): %+v", d)
	}
	if _, err := waiter.Wait(gone); err == nil {
		t.Fatal("the waiting default request did not leave")
	}
	for m.critical.Load() < limit {
		if d := admit(priority.Critical, time.Time{}); d.Reason != Admitted {
			t.Fatalf("critical without a deadline, %d critical in flight of %d: %+v", m.critical.Load(), limit, d)
		}
	}
	if d := admit(priority.Critical, time.Time{}); d.Reason != ShedFirst {
		t.Fatalf("critical without a deadline, the limit's worth of critical in flight: %+v", d)
	}
	if _, d := m.AdmitAt(now, Request{Deadline: second, Retry: true, Priority: priority.Critical}); d.Reason != ShedRetry {
		t.Fatalf("a critical retry past the limit: %+v", d)
	}
	for _, tk := range open {
		tk.DoneAt(now)
	}
	if m.Inflight() != 0 || m.critical.Load() != 0 {
		t.Errorf("after every end: %d in flight, %d critical", m.Inflight(), m.critical.Load())
	}
}

// arrival is one request of a scripted run.
type arrival struct {
	retry bool
	left  time.Duration // 0: no deadline
}

// scriptedRun drives m through a seeded overload: every millisecond 0 to
// 3 requests arrive (a third of them retries, a few without a deadline)
// and the oldest admitted request ends every 2 ms (a queue that grows), for
// 3 s. prio gives each arrival's priority; check, if not nil, is called
// before each decision with the request and the limit in force. It
// returns the decisions in order.
func scriptedRun(t *testing.T, c *clock, m *Method, prio func(arrival) priority.Priority, check func(arrival, Decision)) []Decision {
	t.Helper()
	rng := rand.New(rand.NewPCG(7, 11))
	var out []Decision
	var open []Ticket
	var waiting []waitingReq
	for step := range 3000 {
		now := c.Add(time.Millisecond)
		if step%2 == 0 && len(open) > 0 {
			open[0].DoneAt(now)
			open = open[1:]
		}
		var placed []Ticket
		placed, waiting = settle(waiting, now)
		open = append(open, placed...)
		for range rng.IntN(4) {
			a := arrival{retry: rng.IntN(3) == 0}
			if rng.IntN(8) != 0 {
				a.left = time.Duration(50+rng.IntN(950)) * time.Millisecond
			}
			tk, d := m.AdmitAt(now, Request{Deadline: within(now, a.left), Retry: a.retry, Priority: prio(a)})
			if check != nil {
				check(a, d)
			}
			out = append(out, d)
			switch d.Reason {
			case Admitted:
				open = append(open, tk)
			case Queued:
				waiting = append(waiting, waitingReq{tk, now.Add(a.left)})
			}
		}
	}
	for _, w := range waiting {
		_, _ = w.tk.Wait(gone)
	}
	for _, tk := range open {
		tk.DoneAt(c.Now())
	}
	return out
}

// The configurations the scripted runs use: a fixed limit, an adaptive one
// with and without admission.
var scriptedConfigs = []struct {
	name string
	c    Config
}{
	{"MaxConcurrency", Config{NoAdaptive: true, MaxConcurrency: 40}},
	{"adaptive", Config{}},
	{"adaptive, no admission", Config{NoAdmission: true}},
}

// TestEveryRequestCriticalIsShedAsNone: when every request claims
// critical, the Guard decides exactly as when none does (claiming it all
// round buys nothing), in a run that sheds both first attempts and
// retries.
func TestEveryRequestCriticalIsShedAsNone(t *testing.T) {
	for _, sc := range scriptedConfigs {
		t.Run(sc.name, func(t *testing.T) {
			run := func(p priority.Priority) ([]Decision, Stats) {
				c := newClock()
				cfg := sc.c
				g := New(cfg)
				d := scriptedRun(t, c, g.Method("/svc/M"), func(arrival) priority.Priority { return p }, nil)
				return d, g.Stats()
			}
			def, defStats := run(priority.Default)
			crit, critStats := run(priority.Critical)
			if defStats.ShedFirst == 0 || defStats.ShedRetry == 0 {
				t.Fatalf("the run sheds too little to tell: %+v", defStats)
			}
			if defStats != critStats {
				t.Errorf("stats: every request default %+v, every request critical %+v", defStats, critStats)
			}
			for i := range min(len(def), len(crit)) {
				if def[i] != crit[i] {
					t.Fatalf("decision %d: default %+v, critical %+v", i, def[i], crit[i])
				}
			}
		})
	}
}

// TestUnmarkedRequestsFollowTheRuleWithoutPriorities: requests of the
// default priority are decided by the rule the Guard had before
// priorities, checked against a model of it at every decision: a retry is
// shed from RetryShare of the limit in force, a first attempt at the limit
// (at an adaptive one only when admission cannot judge it; one it judges
// waits for a place there, or while others wait).
func TestUnmarkedRequestsFollowTheRuleWithoutPriorities(t *testing.T) {
	for _, sc := range scriptedConfigs {
		t.Run(sc.name, func(t *testing.T) {
			c := newClock()
			cfg := sc.c
			g := New(cfg)
			m := g.Method("/svc/M")
			checked := 0
			scriptedRun(t, c, m, func(arrival) priority.Priority { return priority.Default }, func(a arrival, d Decision) {
				if d.Reason == RefusedDeadline {
					return // admission: the same for every priority
				}
				limit := cfg.MaxConcurrency
				judged := a.left > 0 && !cfg.NoAdmission
				if !cfg.NoAdaptive {
					limit = int(m.Limit())
				}
				if d.Reason == Admitted {
					m.inflight.Add(-1) // the model looks at the count before this one
					defer m.inflight.Add(1)
				}
				n := int(m.Inflight())
				waiting := m.Waiting()
				if d.Reason == Queued {
					waiting-- // the model looks at the queue before this one
				}
				var want Reason
				switch {
				case limit < 0:
				case a.retry && n >= max(limit/2, 1):
					want = ShedRetry
				case !a.retry && n >= limit && (cfg.NoAdaptive || !judged):
					want = ShedFirst
				case !a.retry && judged && !cfg.NoAdaptive && (n >= limit || waiting > 0):
					want = Queued
				}
				if d.Reason != want {
					t.Fatalf("%+v with %d in flight at limit %d: %v, want %v", a, n, limit, d.Reason, want)
				}
				checked++
			})
			if st := g.Stats(); st.ShedFirst+st.ShedRetry == 0 {
				t.Fatalf("nothing shed: %+v", st)
			}
			t.Logf("%d decisions checked; %+v", checked, g.Stats())
		})
	}
}

// TestSheddableWorkIsShedBeforeALimitEngages: before any limit engages
// (an adaptive limit waits for evidence that the method fails to keep
// up), sheddable requests are shed once the requests in flight reach the
// concurrency that has the tolerated latency at the method's recent
// throughput: 1,000 requests a second taking 10 ms tolerate 20 ms (twice
// the baseline), so 20 in flight. Nothing else is shed there; a fresh
// method, which knows neither yet, sheds nothing.
func TestSheddableWorkIsShedBeforeALimitEngages(t *testing.T) {
	c := newClock()
	g := New(Config{})
	m := g.Method("/svc/M")
	now := c.Now()
	if _, d := m.AdmitAt(now, Request{Priority: priority.Sheddable}); d.Reason != Admitted {
		t.Fatalf("a fresh method sheds: %+v", d)
	}
	for range 10 {
		runWindow(t, c, m, 100, 10*time.Millisecond, 0)
	}
	if l := m.Limit(); l != -1 {
		t.Fatalf("limit %d engaged by a method that keeps up", l)
	}
	at := m.lim.little.Load()
	if at < 19 || at > 22 {
		t.Fatalf("sheddable requests shed from %d in flight, want about 20 (1,000/s × 20 ms)", at)
	}
	now = c.Now()
	var open []Ticket
	for m.Inflight() < at {
		tk, d := m.AdmitAt(now, Request{Deadline: now.Add(time.Second), Priority: priority.Sheddable})
		if d.Reason != Admitted {
			t.Fatalf("sheddable with %d in flight of %d: %+v", m.Inflight(), at, d)
		}
		open = append(open, tk)
	}
	if _, d := m.AdmitAt(now, Request{Deadline: now.Add(time.Second), Priority: priority.Sheddable}); d.Reason != ShedFirst || d.Limit != at || d.RetryAfter != DefaultRetryAfter {
		t.Fatalf("sheddable with %d in flight: %+v", at, d)
	}
	if _, d := m.AdmitAt(now, Request{Retry: true, Priority: priority.Sheddable}); d.Reason != ShedRetry || d.Limit != at {
		t.Fatalf("sheddable retry with %d in flight: %+v", at, d)
	}
	for _, p := range []priority.Priority{priority.Default, priority.Critical} {
		for _, retry := range []bool{false, true} {
			tk, d := m.AdmitAt(now, Request{Retry: retry, Priority: p})
			if d.Reason != Admitted {
				t.Fatalf("%v (retry %v) with %d in flight and no limit: %+v", p, retry, m.Inflight(), d)
			}
			open = append(open, tk)
		}
	}
	for _, tk := range open {
		tk.DoneAt(now)
	}
}
