package overload

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stormguard/stormguard/priority"
)

// engaged returns a method of a fresh Guard whose adaptive limit is
// engaged (requests of 200ms whose callers have 100ms), on c, and the
// limit.
func engaged(t *testing.T, c *clock, cfg Config) (*Method, int64) {
	t.Helper()
	m := New(cfg).Method("/svc/M")
	for range 5 {
		runWindow(t, c, m, 20, 10*time.Millisecond, 0)
	}
	for range 12 {
		serve(t, c, m, 100, 200*time.Millisecond, 100*time.Millisecond)
	}
	l := m.Limit()
	if l == -1 {
		t.Fatal("no limit engaged")
	}
	return m, l
}

// fill admits n first attempts of priority p with 10 s deadlines at now,
// all of which must be admitted, and returns them.
func fill(t *testing.T, m *Method, now time.Time, n int64, p priority.Priority) []Ticket {
	t.Helper()
	var open []Ticket
	for range n {
		tk, d := m.AdmitAt(now, Request{Deadline: now.Add(10 * time.Second), Priority: p})
		if d.Reason != Admitted {
			t.Fatalf("%v under the limit: %+v", p, d)
		}
		open = append(open, tk)
	}
	return open
}

// TestAWaitingRequestThatCannotEndInTimeIsNotStarted: a first attempt
// waits at the limit; by the time a place frees, less of its deadline is
// left than the method needs then (the requests in flight, and it, at the
// rate requests end): it is refused for its deadline instead of being
// started, and the place goes to the next one that can still end in time.
func TestAWaitingRequestThatCannotEndInTimeIsNotStarted(t *testing.T) {
	c := newClock()
	m, _ := engaged(t, c, Config{MinLimit: 3})
	// The limit's worth in flight, one ending every 20ms (50/s) for a
	// second, so that the method's recent rate is known.
	var open []Ticket
	refill := func() {
		for m.Inflight() < m.Limit() {
			now := c.Now()
			tk, d := m.AdmitAt(now, Request{Deadline: now.Add(10 * time.Second)})
			if d.Reason != Admitted {
				t.Fatalf("under the limit: %+v", d)
			}
			open = append(open, tk)
		}
	}
	refill()
	for range 50 {
		open[0].DoneAt(c.Add(20 * time.Millisecond))
		open = open[1:]
		refill()
	}
	now := c.Now()
	need, ok := m.placeNeed(m.g.at(now))
	arrival, _ := m.NeedAt(now)
	if !ok || need < 40*time.Millisecond || arrival-need > 200*time.Millisecond {
		t.Fatalf("what a request given a place needs: %v, %v (on arrival: %v); want at least two ends' worth", need, ok, arrival)
	}
	// Both wait; the first has just what it needs on arrival, the second
	// seconds. When a place frees 250ms later, the first has less left
	// than a request given a place needs.
	short, d1 := m.AdmitAt(now, Request{Deadline: now.Add(arrival + 10*time.Millisecond)})
	long, d2 := m.AdmitAt(now, Request{Deadline: now.Add(5 * time.Second)})
	if d1.Reason != Queued || d2.Reason != Queued {
		t.Fatalf("at the limit: %+v, %+v; want both queued", d1, d2)
	}
	open[0].DoneAt(now.Add(250 * time.Millisecond))
	open = open[1:]
	if !short.Ready() || !long.Ready() {
		t.Fatalf("decided: %v, %v; want both", short.Ready(), long.Ready())
	}
	if d, err := short.Wait(context.Background()); err != nil || d.Reason != RefusedDeadline || d.RetryAfter != DoNotRetry {
		t.Fatalf("the request with %v left: %+v, %v; want refused for its deadline, do not retry", arrival-240*time.Millisecond, d, err)
	}
	if d, err := long.Wait(context.Background()); err != nil || d.Reason != Admitted {
		t.Fatalf("the request with seconds left: %+v, %v; want admitted", d, err)
	}
	open = append(open, long)
	for _, tk := range open {
		tk.DoneAt(now.Add(300 * time.Millisecond))
	}
	if m.Inflight() != 0 || m.Waiting() != 0 {
		t.Errorf("%d in flight, %d waiting; want none", m.Inflight(), m.Waiting())
	}
}

// TestAPlaceGivenAsTheCallerLeavesIsFreed: a waiting request is given a
// place at the instant its caller leaves; Wait reports the caller gone,
// and the place goes back: nothing is left in flight.
func TestAPlaceGivenAsTheCallerLeavesIsFreed(t *testing.T) {
	c := newClock()
	m, limit := engaged(t, c, Config{MinLimit: 3})
	now := c.Now()
	open := fill(t, m, now, limit, priority.Default)
	w, d := m.AdmitAt(now, Request{Deadline: now.Add(10 * time.Second)})
	if d.Reason != Queued {
		t.Fatalf("at the limit: %+v", d)
	}
	open[0].DoneAt(now.Add(10 * time.Millisecond)) // its place is given to w
	if !w.Ready() {
		t.Fatal("no place given")
	}
	if _, err := w.Wait(gone); err == nil {
		t.Fatal("Wait did not report the caller gone")
	}
	w.DoneAt(now) // ignored: it did not run
	for _, tk := range open[1:] {
		tk.DoneAt(now.Add(20 * time.Millisecond))
	}
	if m.Inflight() != 0 || m.Waiting() != 0 {
		t.Errorf("%d in flight, %d waiting; want none", m.Inflight(), m.Waiting())
	}
}

// TestCriticalRequestsWaitAheadOfTheOthers: at a limit filled by critical
// requests, both a default and a critical first attempt wait; the first
// place freed goes to the critical one, though it came second.
func TestCriticalRequestsWaitAheadOfTheOthers(t *testing.T) {
	c := newClock()
	m, limit := engaged(t, c, Config{MinLimit: 3})
	now := c.Now()
	open := fill(t, m, now, limit, priority.Critical)
	def, d1 := m.AdmitAt(now, Request{Deadline: now.Add(10 * time.Second)})
	crit, d2 := m.AdmitAt(now, Request{Deadline: now.Add(10 * time.Second), Priority: priority.Critical})
	if d1.Reason != Queued || d2.Reason != Queued {
		t.Fatalf("at the limit: default %+v, critical %+v; want both queued", d1, d2)
	}
	open[0].DoneAt(now.Add(10 * time.Millisecond))
	open = open[1:]
	if !crit.Ready() || def.Ready() {
		t.Fatalf("ready: critical %v, default %v; want the critical one only", crit.Ready(), def.Ready())
	}
	if d, err := crit.Wait(context.Background()); err != nil || d.Reason != Admitted {
		t.Fatalf("critical: %+v, %v", d, err)
	}
	open = append(open, crit)
	if _, err := def.Wait(gone); err == nil {
		t.Fatal("the default request did not leave")
	}
	for _, tk := range open {
		tk.DoneAt(now.Add(20 * time.Millisecond))
	}
	if m.Inflight() != 0 || m.critical.Load() != 0 || m.Waiting() != 0 {
		t.Errorf("%d in flight (%d critical), %d waiting; want none", m.Inflight(), m.critical.Load(), m.Waiting())
	}
}

// TestTheGateUnderConcurrentUse: goroutines (four times the limit) admit,
// wait, leave and end
// requests of one method at once while its limit is engaged; every
// request that waited is accounted for once (admitted, refused or left),
// and nothing is left in flight or waiting at the end (run with -race).
func TestTheGateUnderConcurrentUse(t *testing.T) {
	c := newClock()
	m, limit := engaged(t, c, Config{MinLimit: 3})
	g := m.g
	before := g.Stats()
	var wg sync.WaitGroup
	for w := range 4 * limit { // four times the limit, so that some wait
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 3))
			for range 100 {
				now := c.Now()
				tk, d := m.AdmitAt(now, Request{Deadline: now.Add(time.Second)})
				if d.Reason == Queued {
					ctx, cancel := context.WithCancel(context.Background())
					if rng.IntN(3) == 0 {
						cancel() // its caller leaves
					} else {
						time.AfterFunc(time.Duration(rng.IntN(200))*time.Microsecond, cancel)
					}
					d, _ = tk.Wait(ctx)
					cancel()
				}
				if d.Reason == Admitted {
					time.Sleep(time.Duration(rng.IntN(100)) * time.Microsecond) // it runs
					tk.DoneAt(c.Add(time.Microsecond))
				}
			}
		}()
	}
	wg.Wait()
	st := g.Stats()
	if m.Inflight() != 0 || m.Waiting() != 0 {
		t.Errorf("%d in flight, %d waiting after the run", m.Inflight(), m.Waiting())
	}
	if st.Waited == before.Waited || st.Left == before.Left || st.Waited-before.Waited == st.Left-before.Left {
		t.Fatalf("too little waited to tell: %+v, before the run %+v", st, before)
	}
	t.Logf("%+v", st)
}

// TestAWaiterGivesBackItsPlaceUnderMaxConcurrency: with MaxConcurrency
// beside the adaptive limit, a first attempt takes its place under the
// fixed limit before it waits for one under the adaptive limit; whether
// its caller leaves or it is refused for its deadline when a place frees,
// it gives the fixed limit's place back: nothing is held once every
// request has ended.
func TestAWaiterGivesBackItsPlaceUnderMaxConcurrency(t *testing.T) {
	for _, critical := range []bool{false, true} {
		c := newClock()
		m, limit := engaged(t, c, Config{MinLimit: 3, MaxConcurrency: 1000})
		p := priority.Default
		if critical {
			p = priority.Critical
		}
		now := c.Now()
		open := fill(t, m, now, limit, p)
		leaver, d1 := m.AdmitAt(now, Request{Deadline: now.Add(10 * time.Second), Priority: p})
		doomed, d2 := m.AdmitAt(now, Request{Deadline: now.Add(20 * time.Millisecond), Priority: p})
		if d1.Reason != Queued || d2.Reason != Queued {
			t.Fatalf("critical %v: at the limit: %+v, %+v; want both queued", critical, d1, d2)
		}
		if _, err := leaver.Wait(gone); err == nil {
			t.Fatalf("critical %v: the caller that left still waits", critical)
		}
		open[0].DoneAt(now.Add(time.Second)) // the doomed one is decided then: refused
		if d, _ := doomed.Wait(context.Background()); d.Reason != RefusedDeadline {
			t.Fatalf("critical %v: the request whose deadline passed: %+v", critical, d)
		}
		for _, tk := range open[1:] {
			tk.DoneAt(now.Add(time.Second))
		}
		if n, k := m.g.inflight.Load(), m.g.critical.Load(); n != 0 || k != 0 {
			t.Errorf("critical %v: %d places (%d critical) still held under MaxConcurrency", critical, n, k)
		}
	}
}

// TestWaitAtOnTheGuardsClock: a simulator drives the queue with explicit
// times. A waiting request polled before a place frees still waits
// (Queued) and keeps its place in the queue; once an end that a Ticket
// reports with DiscardAt frees a place, WaitAt admits it, at that time;
// one whose deadline passes while it waits leaves at WaitAt (the caller
// gone: DeadlineExceeded) and is never given a place; one given a place
// whose deadline has passed when it learns so frees it.
func TestWaitAtOnTheGuardsClock(t *testing.T) {
	c := newClock()
	m, limit := engaged(t, c, Config{MinLimit: 3})
	now := c.Now()
	open := fill(t, m, now, limit, priority.Default)
	first, d1 := m.AdmitAt(now, Request{Deadline: now.Add(10 * time.Second)})
	leaver, d2 := m.AdmitAt(now, Request{Deadline: now.Add(time.Second)})
	late, d3 := m.AdmitAt(now, Request{Deadline: now.Add(2 * time.Second)})
	if d1.Reason != Queued || d2.Reason != Queued || d3.Reason != Queued {
		t.Fatalf("at the limit: %+v, %+v, %+v; want all queued", d1, d2, d3)
	}
	if d, err := first.WaitAt(now.Add(100 * time.Millisecond)); err != nil || d.Reason != Queued {
		t.Fatalf("polled before a place frees: %+v, %v; want still queued", d, err)
	}
	if d, err := leaver.WaitAt(now.Add(time.Second)); !errors.Is(err, context.DeadlineExceeded) || d.Reason != Admitted {
		t.Fatalf("polled at its deadline: %+v, %v; want gone (DeadlineExceeded)", d, err)
	}
	if m.Waiting() != 2 {
		t.Fatalf("%d waiting; want the two whose callers wait", m.Waiting())
	}
	// A failed request's place, freed on the Guard's clock, goes to the
	// first in the queue then; the one that left gets none.
	freed := now.Add(1500 * time.Millisecond)
	open[0].DiscardAt(freed)
	open = open[1:]
	if d, err := first.WaitAt(freed); err != nil || d.Reason != Admitted {
		t.Fatalf("given the freed place: %+v, %v; want admitted", d, err)
	}
	if first.start != m.g.at(freed) {
		t.Fatalf("it runs from %d; want %d, when its place freed", first.start, m.g.at(freed))
	}
	open = append(open, first)
	open[0].DoneAt(freed.Add(time.Millisecond)) // its place goes to late
	open = open[1:]
	if !late.Ready() {
		t.Fatal("no place given to the last one")
	}
	if _, err := late.WaitAt(now.Add(2 * time.Second)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a place learned of after its deadline: %v; want DeadlineExceeded", err)
	}
	for _, tk := range open {
		tk.DoneAt(now.Add(3 * time.Second))
	}
	if m.Inflight() != 0 || m.Waiting() != 0 {
		t.Errorf("%d in flight, %d waiting; want none", m.Inflight(), m.Waiting())
	}
	if st := m.g.Stats(); st.Left < 2 {
		t.Errorf("%d left; want the two whose callers left", st.Left)
	}
}
