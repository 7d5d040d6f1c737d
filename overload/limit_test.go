package overload

import (
	"math/rand/v2"
	"sort"
	"testing"
	"time"
)

// stream drives a method on a test clock with requests that arrive when
// told and end, completed (Done) or cut short (Abandon), a given time
// after they arrived.
type stream struct {
	c    *clock
	m    *Method
	open []streamed
	shed int // arrivals refused
}

type streamed struct {
	tk  Ticket
	end time.Time
	cut bool
}

// arrive admits, at the clock's time, a first attempt with deadline left
// (0: none) that ends lat later, cut short if cut.
func (s *stream) arrive(lat, left time.Duration, cut bool) {
	now := s.c.Now()
	tk, d := s.m.AdmitAt(now, Request{Deadline: within(now, left)})
	if d.Reason != Admitted {
		s.shed++
		return
	}
	s.open = append(s.open, streamed{tk, now.Add(lat), cut})
}

// advance moves the clock by d, ending in order the requests due by then.
func (s *stream) advance(d time.Duration) {
	now := s.c.Add(d)
	sort.SliceStable(s.open, func(i, j int) bool { return s.open[i].end.Before(s.open[j].end) })
	k := 0
	for ; k < len(s.open) && !s.open[k].end.After(now); k++ {
		if r := s.open[k]; r.cut {
			r.tk.AbandonAt(r.end)
		} else {
			r.tk.DoneAt(r.end)
		}
	}
	s.open = s.open[k:]
}

// TestLimiterDoesNotLimitASlowerMethod: a method that becomes five times
// slower for good (10 ms, then 50 ms, creeping to 56 ms over the next
// 600 ms) at the same arrival rate keeps up: nothing queues, every request
// is served. More requests are in flight (a step, and a creep that raises
// them window after window; at 1,000 and at 10,000 a second, arriving at
// random), and the
// latency is beyond Tolerance × the baseline, but that is no overload: no
// limit engages and nothing is shed, for callers without a deadline
// (which a limit would shed) or with one.
func TestLimiterDoesNotLimitASlowerMethod(t *testing.T) {
	for _, c := range []struct {
		name    string
		perMs   int
		left    time.Duration
		seconds int
	}{
		{"1000/s, no deadline", 1, 0, 10},
		{"1000/s, 1s deadlines", 1, time.Second, 10},
		{"10000/s, no deadline", 10, 0, 3},
	} {
		clk := newClock()
		g := New(Config{})
		m := g.Method("/svc/M")
		s := &stream{c: clk, m: m}
		rng := rand.New(rand.NewPCG(1, 2))
		for ms := range 3000 + c.seconds*1000 {
			lat := 10 * time.Millisecond
			if ms >= 3000 { // 50 ms, then 1 ms more per 100 ms for 600 ms
				lat = 50*time.Millisecond + time.Duration(min(ms-3000, 600)/100)*time.Millisecond
			}
			for range rng.IntN(2*c.perMs + 1) { // perMs on average
				s.arrive(lat, c.left, false)
			}
			s.advance(time.Millisecond)
			if l := m.Limit(); l != -1 {
				t.Fatalf("%s: limit %d at %d ms, %d in flight", c.name, l, ms, m.Inflight())
			}
		}
		if st := g.Stats(); s.shed != 0 || st.ShedFirst+st.ShedRetry+st.RefusedDeadline != 0 {
			t.Errorf("%s: %d refused: %+v", c.name, s.shed, st)
		}
	}
}

// TestAbandonTeachesOnlyWhatItProves: a request cut short after 1 ms (its
// caller cancelled it) proves only that the method takes longer than
// 1 ms. One a millisecond for 2 s beside requests that complete in 10 ms
// does not make 10 ms look slow afterwards: a load that rises twentyfold,
// served in 15 ms (1.5 × the method's latency, within Tolerance), engages
// no limit.
// Requests cut short after 100 ms (a method that hangs, its callers giving
// up) prove that it takes longer than the tolerated 20 ms, and the 1 ms
// cancellations beside them do not hide it: the same rising load engages
// a limit.
func TestAbandonTeachesOnlyWhatItProves(t *testing.T) {
	for _, c := range []struct {
		name string
		lat  time.Duration // of the rising load
		cut  bool          // and whether it is cut short: then a limit engages
	}{
		{"completed in 15ms", 15 * time.Millisecond, false},
		{"cut short at 100ms", 100 * time.Millisecond, true},
	} {
		clk := newClock()
		g := New(Config{})
		m := g.Method("/svc/M")
		s := &stream{c: clk, m: m}
		for range 2000 { // 2 s at 10 ms
			s.arrive(10*time.Millisecond, 0, false)
			s.advance(time.Millisecond)
		}
		for range 2000 { // 2 s of the same, and as many cancelled after 1 ms
			s.arrive(10*time.Millisecond, 0, false)
			s.arrive(time.Millisecond, 0, true)
			s.advance(time.Millisecond)
		}
		// A load that rises from 1 to 21 requests a ms over 1.2 s, then
		// stays; cancellations go on beside requests cut short, and
		// stop before requests that complete.
		engaged := false
		for ms := range 2000 {
			for range 1 + min(ms, 1200)/60 {
				s.arrive(c.lat, 0, c.cut)
			}
			if c.cut {
				s.arrive(time.Millisecond, 0, true)
			}
			s.advance(time.Millisecond)
			engaged = engaged || m.Limit() != -1
		}
		if c.cut != engaged {
			t.Errorf("%s: limit engaged %v, want %v (%d in flight)", c.name, engaged, c.cut, m.Inflight())
		}
	}
}

// TestALimitWithNoDeadlineAtStakeLetsGo: a queue of callers without
// deadlines grows (arrivals outpace the method) and a limit engages; then
// the arrivals fall to what the method keeps up with, at five times its
// old latency. No caller's deadline was at stake: the limit grows while
// the method keeps up, and lets go once it no longer binds, instead of
// shedding first attempts of a method that is only slower until its
// baseline has learned the new latency.
func TestALimitWithNoDeadlineAtStakeLetsGo(t *testing.T) {
	c := newClock()
	g := New(Config{})
	m := g.Method("/svc/M")
	for range 10 {
		runWindow(t, c, m, 20, 10*time.Millisecond, 0)
	}
	q := &fifo{c: c, m: m}
	q.fill(20)
	for m.Limit() == -1 && len(q.open) < 2000 {
		q.run(2*time.Millisecond, 2*time.Millisecond, 2)
	}
	if m.Limit() == -1 {
		t.Fatal("no limit for a growing queue")
	}
	now := c.Now()
	for _, tk := range q.open {
		tk.DoneAt(now)
	}
	s := &stream{c: c, m: m}
	var shedLate int
	for ms := 0; ms < 3000; ms += 2 { // one every 2 ms, 50 ms each: 25 in flight
		before := s.shed
		s.arrive(50*time.Millisecond, 0, false)
		s.advance(2 * time.Millisecond)
		if ms >= 2000 {
			shedLate += s.shed - before
		}
	}
	if l := m.Limit(); l != -1 || shedLate != 0 {
		t.Errorf("limit %d, %d first attempts shed in the last second (%d in all)", l, shedLate, s.shed)
	}
}
