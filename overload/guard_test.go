package overload

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// gone is the context of a caller that has left.
var gone = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// waitingReq is a request of a test run that waits for a place (Queued).
type waitingReq struct {
	tk  Ticket
	due time.Time // its deadline: its caller leaves then
}

// settle takes, in order, the waiting requests that were decided at or
// before now: those given a place are returned in admitted; those whose
// deadline is past leave. still is the rest.
func settle(waiting []waitingReq, now time.Time) (admitted []Ticket, still []waitingReq) {
	for _, w := range waiting {
		ctx := context.Background()
		if !w.tk.Ready() {
			if now.Before(w.due) {
				still = append(still, w)
				continue
			}
			ctx = gone
		}
		if d, err := w.tk.Wait(ctx); err == nil && d.Reason == Admitted {
			admitted = append(admitted, w.tk)
		}
	}
	return admitted, still
}

// clock is a test clock that moves only when told.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Unix(1_700_000_000, 0)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Add(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
	return c.t
}

// serve admits n first attempts at the clock's time, each with deadline
// left (0: none), and ends them all after lat; it returns how many were
// admitted. A request told to wait for a place (Queued) does not: its
// caller leaves at once. The clock ends lat later.
func serve(t *testing.T, c *clock, m *Method, n int, lat, left time.Duration) int {
	t.Helper()
	now := c.Now()
	var tickets []Ticket
	for range n {
		tk, d := m.AdmitAt(now, Request{Deadline: within(now, left)})
		if d.Reason == Queued {
			d, _ = tk.Wait(gone)
		}
		if d.Reason == Admitted {
			tickets = append(tickets, tk)
		}
	}
	end := c.Add(lat)
	for _, tk := range tickets {
		tk.DoneAt(end)
	}
	return len(tickets)
}

func TestBuckets(t *testing.T) {
	prev := time.Duration(0)
	for i := range numBuckets {
		ub := upperBound(i)
		if ub <= prev {
			t.Fatalf("bucket %d: upper bound %v not above %v", i, ub, prev)
		}
		// The bucket's own bound falls in it (it is inclusive), the next
		// nanosecond-step above the previous bound too.
		if i < numBuckets-1 {
			if got := bucketOf(ub - time.Nanosecond); got != i {
				t.Fatalf("bucketOf(%v) = %d, want %d", ub-time.Nanosecond, got, i)
			}
		}
		if got := bucketOf(prev); i > 0 && got != i {
			t.Fatalf("bucketOf(%v) = %d, want %d", prev, got, i)
		}
		prev = ub
	}
	if got := bucketOf(-time.Second); got != 0 {
		t.Errorf("bucketOf(-1s) = %d", got)
	}
	if got := bucketOf(math.MaxInt64); got != numBuckets-1 {
		t.Errorf("bucketOf(max) = %d", got)
	}
	// About 19% wide above the linear range.
	if ub, lb := upperBound(60), upperBound(59); float64(ub)/float64(lb) > 1.26 {
		t.Errorf("buckets too wide: %v / %v", ub, lb)
	}
}

func TestDefaults(t *testing.T) {
	for _, c := range []Config{{}, {Quantile: math.NaN(), Window: -1, MinSamples: -3, MinLimit: -1, Tolerance: math.Inf(1),
		DeadlineShare: 7, RetryShare: math.NaN(), LimitWindow: -1, RetryAfter: -1, MaxMethods: -1, MaxConcurrency: -5}} {
		s := c.settings()
		if s.quantile != DefaultQuantile || s.window != DefaultWindow || s.minSamples != DefaultMinSamples ||
			s.minLimit != DefaultMinLimit || s.tolerance != DefaultTolerance || s.deadlineShare != DefaultDeadlineShare ||
			s.retryShare != DefaultRetryShare || s.limitWindow != DefaultLimitWindow || s.retryAfter != DefaultRetryAfter ||
			s.maxMethods != DefaultMaxMethods || s.maxConc != 0 || !s.admission || !s.shedding || !s.adaptive {
			t.Errorf("settings of %+v: %+v", c, s)
		}
	}
	if s := (Config{DeadlineShare: -1}).settings(); s.deadlineShare != 0 {
		t.Errorf("negative DeadlineShare: %v", s.deadlineShare)
	}
}

func TestHistoryQuantileAndExpiry(t *testing.T) {
	c := newClock()
	g := New(Config{NoShedding: true})
	m := g.Method("/svc/M")
	if _, ok := m.NeedAt(c.Now()); ok {
		t.Fatal("a need before any history")
	}
	// 19 latencies are too few; the 20th makes the history usable.
	serve(t, c, m, 19, 100*time.Millisecond, 0)
	if _, ok := m.NeedAt(c.Now()); ok {
		t.Fatal("a need from 19 latencies")
	}
	c.Add(100 * time.Millisecond) // past the recomputation interval
	serve(t, c, m, 1, 100*time.Millisecond, 0)
	c.Add(100 * time.Millisecond)
	// Nothing in flight: the drain term is one request's share of the
	// window, far below 100ms, so the need is small.
	need, ok := m.NeedAt(c.Now())
	if !ok || need >= 100*time.Millisecond {
		t.Fatalf("need with nothing in flight = %v, %v", need, ok)
	}
	// The quantile: 90 fast latencies and 10 slow; the 10th percentile is
	// fast.
	c2 := newClock()
	g2 := New(Config{NoShedding: true})
	m2 := g2.Method("/svc/M")
	serve(t, c2, m2, 10, 500*time.Millisecond, 0)
	serve(t, c2, m2, 90, 10*time.Millisecond, 0)
	c2.Add(100 * time.Millisecond)
	sum := summarize(m2.hist, g2.at(c2.Now()), 0.1, m2.born.Load())
	if sum.n != 100 || sum.q < 10*time.Millisecond || sum.q > 12*time.Millisecond {
		t.Fatalf("summary %+v: want 100 latencies, p10 ≈ 10ms", sum)
	}
	if sum := summarize(m2.hist, g2.at(c2.Now()), 0.95, m2.born.Load()); sum.q < 500*time.Millisecond || sum.q > 600*time.Millisecond {
		t.Fatalf("p95 = %v, want ≈ 500ms", sum.q)
	}
	// After a whole window without new latencies the history is empty.
	c2.Add(DefaultWindow)
	if sum := summarize(m2.hist, g2.at(c2.Now()), 0.1, m2.born.Load()); sum.n != 0 {
		t.Fatalf("%d latencies a window later", sum.n)
	}
	if _, ok := m2.NeedAt(c2.Now()); ok {
		t.Fatal("a need from an expired history")
	}
}

// fifo is a method at its capacity with a queue: open requests admitted
// in order, the oldest ending every gap (a throughput of 1/gap), each
// latency being the queue's length × gap.
type fifo struct {
	t    *testing.T
	c    *clock
	m    *Method
	open []Ticket
	left time.Duration // deadline of the requests; 0: none
	shed int           // refills refused; nil t: counted, not fatal
}

// fill admits n requests at once.
func (f *fifo) fill(n int) {
	now := f.c.Now()
	for range n {
		tk, d := f.m.AdmitAt(now, Request{Deadline: within(now, f.left)})
		if d.Reason != Admitted {
			if f.t != nil {
				f.t.Fatalf("refused while filling: %+v", d)
			}
			f.shed++
			continue
		}
		f.open = append(f.open, tk)
	}
}

// run works the queue for d: every gap the oldest request ends and
// arrivals new ones are admitted (1 keeps the queue's length, 2 grows it
// by one per gap).
func (f *fifo) run(d, gap time.Duration, arrivals int) {
	for end := f.c.Now().Add(d); f.c.Now().Before(end) && len(f.open) > 0; {
		now := f.c.Add(gap)
		f.open[0].DoneAt(now)
		f.open = f.open[1:]
		f.fill(arrivals)
	}
}

func TestAdmissionRefusesDoomedWorkAndRecovers(t *testing.T) {
	c := newClock()
	g := New(Config{NoShedding: true})
	m := g.Method("/svc/M")
	// A standing queue of 100 at 200/s: every request waits 500ms.
	q := &fifo{t: t, c: c, m: m}
	q.fill(100)
	q.run(1500*time.Millisecond, 5*time.Millisecond, 1)
	need, ok := m.NeedAt(c.Now())
	if !ok || need < 450*time.Millisecond || need > 600*time.Millisecond {
		t.Fatalf("need = %v, %v; want ≈ 505ms", need, ok)
	}
	now := c.Now()
	if _, d := m.AdmitAt(now, Request{Deadline: now.Add(100 * time.Millisecond)}); d.Reason != RefusedDeadline || d.RetryAfter >= 0 || d.Need < 450*time.Millisecond {
		t.Fatalf("100ms left: %+v, want RefusedDeadline, do not retry", d)
	}
	if tk, d := m.AdmitAt(now, Request{Deadline: now.Add(2 * time.Second)}); d.Reason != Admitted {
		t.Fatalf("2s left: %+v, want admitted", d)
	} else {
		tk.DoneAt(now)
	}
	if tk, d := m.AdmitAt(now, Request{}); d.Reason != Admitted {
		t.Fatalf("no deadline: %+v, want admitted", d)
	} else {
		tk.DoneAt(now)
	}
	// Not fooled by its own refusals: they teach it nothing, so refusing
	// many does not lower the need...
	for range 50 {
		if _, d := m.AdmitAt(now, Request{Deadline: now.Add(50 * time.Millisecond)}); d.Reason != RefusedDeadline {
			t.Fatalf("50ms left: %+v", d)
		}
	}
	if n2, _ := m.NeedAt(c.Now()); n2 < need-10*time.Millisecond {
		t.Fatalf("need fell from %v to %v after refusals", need, n2)
	}
	// ...and once the backlog has drained (nothing admitted meanwhile),
	// requests are admitted again at once, although the recent latencies
	// (500ms) are all still in the window.
	q.run(time.Second, 5*time.Millisecond, 0)
	now = c.Now()
	if n2, ok := m.NeedAt(c.Now()); !ok || n2 > 10*time.Millisecond {
		t.Fatalf("need after the drain = %v, %v", n2, ok)
	}
	if tk, d := m.AdmitAt(now, Request{Deadline: now.Add(100 * time.Millisecond)}); d.Reason != Admitted {
		t.Fatalf("after the drain, 100ms left: %+v, want admitted", d)
	} else {
		tk.DoneAt(now)
	}
	if st := g.Stats(); st.RefusedDeadline != 51 || st.ShedFirst+st.ShedRetry != 0 {
		t.Errorf("stats %+v", st)
	}
}

func TestAdmissionIgnoresBurstsItAbsorbs(t *testing.T) {
	c := newClock()
	g := New(Config{NoShedding: true})
	m := g.Method("/svc/M")
	// A method that answers in 2ms whatever the load: 100 per 100ms.
	for range 10 {
		serve(t, c, m, 10, 2*time.Millisecond, time.Second)
		c.Add(8 * time.Millisecond)
	}
	// A burst of 500 in flight at once: the drain estimate is large, but
	// the method's recent latencies say 2ms; a 50ms deadline is admitted.
	now := c.Now()
	var open []Ticket
	for range 500 {
		tk, d := m.AdmitAt(now, Request{Deadline: now.Add(50 * time.Millisecond)})
		if d.Reason != Admitted {
			t.Fatalf("burst refused: %+v", d)
		}
		open = append(open, tk)
	}
	for _, tk := range open {
		tk.DoneAt(now.Add(2 * time.Millisecond))
	}
}

// runWindow runs one limiter window of m: n first attempts arriving at the
// clock's time with deadline left (0: none), all ending after lat, then
// the clock moves to the end of the window (100ms after its start).
func runWindow(t *testing.T, c *clock, m *Method, n int, lat, left time.Duration) int {
	t.Helper()
	admitted := serve(t, c, m, n, lat, left)
	if lat < DefaultLimitWindow {
		c.Add(DefaultLimitWindow - lat)
	}
	return admitted
}

// TestLimiterEngagesOnAStandingQueueOnly: a limit engages on a queue that
// grows, not on a pause, a burst, or windows in which some requests are
// fast.
func TestLimiterEngagesOnAStandingQueueOnly(t *testing.T) {
	c := newClock()
	g := New(Config{NoAdmission: true})
	m := g.Method("/svc/M")
	for range 10 {
		runWindow(t, c, m, 20, 10*time.Millisecond, 0)
	}
	if l := m.Limit(); l != -1 {
		t.Fatalf("limit %d at steady latency", l)
	}
	// One slow window (a pause): no limit.
	runWindow(t, c, m, 20, 80*time.Millisecond, 0)
	runWindow(t, c, m, 20, 10*time.Millisecond, 0)
	runWindow(t, c, m, 20, 10*time.Millisecond, 0)
	if l := m.Limit(); l != -1 {
		t.Fatalf("limit %d after one slow window", l)
	}
	// A window in which a few requests still answer fast: its minimum is
	// low, so it is no standing queue.
	for range 3 {
		now := c.Now()
		var tk []Ticket
		for range 20 {
			k, _ := m.AdmitAt(now, Request{})
			tk = append(tk, k)
		}
		tk[0].DoneAt(now.Add(10 * time.Millisecond))
		for _, k := range tk[1:] {
			k.DoneAt(now.Add(90 * time.Millisecond))
		}
		c.Add(100 * time.Millisecond)
	}
	if l := m.Limit(); l != -1 {
		t.Fatalf("limit %d for windows with fast requests", l)
	}
	// A queue that grows: one request ends every 2 ms (500/s) and two
	// arrive, so that every request waits for those ahead of it. Once its
	// growth shows over growthWindows windows: engaged at the concurrency
	// that has 2 × the baseline at the throughput of the window (0.5/ms ×
	// 20 ms = 10; the baseline has learned a little of the queue's first
	// windows, before its growth showed: up to 15), below the peak.
	q := &fifo{c: c, m: m}
	q.fill(20)
	for m.Limit() == -1 && len(q.open) < 2000 {
		q.run(2*time.Millisecond, 2*time.Millisecond, 2)
	}
	l := m.Limit()
	if l < 10 || l > 16 {
		t.Fatalf("limit %d with a growing queue (%d in flight), want 10 to 15", l, len(q.open))
	}
	t.Logf("engaged at %d, %d in flight", l, len(q.open))
	// Engaged: beyond the limit, first attempts are shed. (The queue's
	// backlog ends first: a backlog that drains leaves the limit as it is.)
	now := c.Now()
	for _, tk := range q.open {
		tk.DoneAt(now)
	}
	if m.Limit() != l {
		t.Fatalf("limit %d after the backlog drained, was %d", m.Limit(), l)
	}
	var open []Ticket
	shed := 0
	for range 60 {
		tk, d := m.AdmitAt(now, Request{})
		switch d.Reason {
		case Admitted:
			open = append(open, tk)
		case ShedFirst:
			shed++
			if d.RetryAfter != DefaultRetryAfter || d.Limit != l {
				t.Errorf("shed first: %+v", d)
			}
		default:
			t.Fatalf("unexpected %+v", d)
		}
	}
	if int64(len(open)) != l || shed != 60-int(l) {
		t.Fatalf("admitted %d, shed %d at limit %d", len(open), shed, l)
	}
	// Latency back to normal and few in flight: the limit lets go.
	end := c.Add(10 * time.Millisecond)
	for _, tk := range open {
		tk.DoneAt(end)
	}
	c.Add(90 * time.Millisecond)
	for range 3 {
		runWindow(t, c, m, 4, 10*time.Millisecond, 0)
		runWindow(t, c, m, 4, 10*time.Millisecond, 0)
		runWindow(t, c, m, 4, 10*time.Millisecond, 0)
	}
	if l := m.Limit(); l != -1 {
		t.Fatalf("limit %d after the overload", l)
	}
}

// slowGrowth works q for d as a queue that grows slowly: one request ends
// every 2 ms (500/s) and, per 8 ms, five arrive: one more than end.
func slowGrowth(q *fifo, d time.Duration) {
	for end := q.c.Now().Add(d); q.c.Now().Before(end) && len(q.open) > 0; {
		q.run(2*time.Millisecond, 2*time.Millisecond, 2)
		q.run(6*time.Millisecond, 2*time.Millisecond, 1)
	}
}

// TestLimiterLetsDeadlinesTolerateSlowness: a method whose queue grows is
// limited only once its latency takes more than DeadlineShare (half) of
// what its callers have left, or, when DeadlineShare is negative, more
// than Tolerance × its baseline.
func TestLimiterLetsDeadlinesTolerateSlowness(t *testing.T) {
	for _, c := range []struct {
		name  string
		share float64
		left  time.Duration
		limit bool
	}{
		// The queue's latency grows from 40 to about 240 ms in 800 ms.
		{"1s deadlines", 0, time.Second, false},
		{"60ms deadlines", 0, 60 * time.Millisecond, true},
		{"DeadlineShare -1", -1, time.Second, true},
	} {
		clk := newClock()
		m := New(Config{NoAdmission: true, DeadlineShare: c.share}).Method("/svc/M")
		for range 10 {
			runWindow(t, clk, m, 20, 10*time.Millisecond, c.left)
		}
		q := &fifo{c: clk, m: m, left: c.left}
		q.fill(20)
		slowGrowth(q, 800*time.Millisecond)
		if l := m.Limit(); (l != -1) != c.limit {
			t.Errorf("%s: limit %d with %d in flight", c.name, l, len(q.open))
		}
	}
}

// TestLimiterShrinksToTheFloor: while every request takes twice what its
// caller waits, the limit halves each window down to the floor.
func TestLimiterShrinksToTheFloor(t *testing.T) {
	c := newClock()
	m := New(Config{NoAdmission: true, MinLimit: 3}).Method("/svc/M")
	for range 5 {
		runWindow(t, c, m, 20, 10*time.Millisecond, 0)
	}
	// Every admitted request keeps taking 200ms, and its caller has
	// 100ms: the limit halves each window (the gradient is clamped at
	// 0.5) down to the floor.
	var limits []int64
	for range 12 {
		serve(t, c, m, 100, 200*time.Millisecond, 100*time.Millisecond)
		limits = append(limits, m.Limit())
	}
	for i := 1; i < len(limits); i++ {
		if limits[i-1] != -1 && limits[i] > limits[i-1] {
			t.Fatalf("limit grew while overloaded: %v", limits)
		}
	}
	if last := limits[len(limits)-1]; last != 3 {
		t.Fatalf("limits %v, want the floor 3 at the end", limits)
	}
}

func TestRetriesShedFirst(t *testing.T) {
	c := newClock()
	g := New(Config{NoAdmission: true, NoAdaptive: true, MaxConcurrency: 10})
	m := g.Method("/svc/M")
	now := c.Now()
	var open []Ticket
	admit := func(retry bool) Decision {
		tk, d := m.AdmitAt(now, Request{Retry: retry})
		if d.Reason == Admitted {
			open = append(open, tk)
		}
		return d
	}
	// Up to 5 in flight (half of 10) retries are admitted like anything.
	for i := range 5 {
		if d := admit(i%2 == 0); d.Reason != Admitted {
			t.Fatalf("request %d: %+v", i, d)
		}
	}
	// From 5 on, retries are shed (do not retry), first attempts admitted.
	for range 3 {
		if d := admit(true); d.Reason != ShedRetry || d.RetryAfter >= 0 || d.Limit != 5 {
			t.Fatalf("retry at 5+: %+v", d)
		}
	}
	for i := 5; i < 10; i++ {
		if d := admit(false); d.Reason != Admitted {
			t.Fatalf("first attempt %d: %+v", i, d)
		}
	}
	// At 10, first attempts too, with a pushback to retry after.
	if d := admit(false); d.Reason != ShedFirst || d.RetryAfter != DefaultRetryAfter {
		t.Fatalf("first attempt at 10: %+v", d)
	}
	// Ending requests makes room, in the same order.
	for _, tk := range open[:6] {
		tk.DoneAt(now)
	}
	open = open[6:]
	if d := admit(true); d.Reason != Admitted {
		t.Fatalf("retry at 4 in flight: %+v", d)
	}
	if st := g.Stats(); st.ShedRetry != 3 || st.ShedFirst != 1 || st.Admitted != 11 {
		t.Errorf("stats %+v", st)
	}
	for _, tk := range open {
		tk.DoneAt(now)
	}
	if n := m.Inflight(); n != 0 {
		t.Errorf("%d in flight after all ended", n)
	}
}

func TestOffSwitches(t *testing.T) {
	c := newClock()
	g := New(Config{NoAdmission: true, NoShedding: true, MaxConcurrency: 1})
	m := g.Method("/svc/M")
	now := c.Now()
	for range 100 {
		if _, d := m.AdmitAt(now, Request{Deadline: now.Add(time.Nanosecond), Retry: true}); d.Reason != Admitted {
			t.Fatalf("refused with both off: %+v", d)
		}
	}
	var zero Ticket
	zero.Done()
	zero.DoneAt(now)
}

func TestMaxMethods(t *testing.T) {
	g := New(Config{MaxMethods: 3})
	a, b, c := g.Method("a"), g.Method("b"), g.Method("c")
	if a == b || b == c || a == c || g.Method("a") != a {
		t.Fatal("methods not kept apart")
	}
	d, e := g.Method("d"), g.Method("e")
	if d != e || d != g.other || d == a {
		t.Fatal("methods beyond MaxMethods do not share one state")
	}
	if n := g.methods.Len(); n != 3 {
		t.Fatalf("%d methods kept", n)
	}
}

func TestConcurrentUse(t *testing.T) {
	g := New(Config{MaxMethods: 4})
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				m := g.Method(fmt.Sprint("/svc/M", (w+i)%6))
				tk, _ := m.Admit(Request{Deadline: deadlineIf(time.Now().Add(time.Second), i%3 != 0), Retry: i%5 == 0})
				tk.Done()
				_, _ = m.Need()
				_ = m.Limit()
			}
		}()
	}
	wg.Wait()
	for _, name := range []string{"/svc/M0", "/svc/M1", "/svc/M5"} {
		if n := g.Method(name).Inflight(); n != 0 {
			t.Errorf("%s: %d in flight", name, n)
		}
	}
}

func TestIsRetry(t *testing.T) {
	for _, c := range []struct {
		v    []string
		want bool
	}{
		{nil, false},
		{[]string{"0"}, false},
		{[]string{"000"}, false},
		{[]string{"1"}, true},
		{[]string{"2"}, true},
		{[]string{""}, true},
		{[]string{"-1"}, true},
		{[]string{"x"}, true},
		{[]string{"0", "0"}, true},
		{[]string{"00000000000"}, true}, // 11 digits
		{[]string{"99999999999999999999"}, true},
	} {
		if got := IsRetry(c.v); got != c.want {
			t.Errorf("IsRetry(%q) = %v, want %v", c.v, got, c.want)
		}
	}
}

func FuzzIsRetry(f *testing.F) {
	for _, s := range []string{"", "0", "1", "00", "-0", " 1", "１"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := IsRetry([]string{s})
		zeros := len(s) > 0 && len(s) <= 10
		for i := 0; i < len(s); i++ {
			zeros = zeros && s[i] == '0'
		}
		if got == zeros {
			t.Errorf("IsRetry(%q) = %v", s, got)
		}
	})
}

// TestLimiterIgnoresAPause: the whole server pauses (a long GC
// or CPU throttling) for 2s: requests keep arriving, none ends, then the backlog
// ends in order, 2ms apart. The requests that waited through the pause are
// slow, but those that arrived at its end are not: that is no standing
// queue, and no limit engages, so nothing is shed after the pause.
func TestLimiterIgnoresAPause(t *testing.T) {
	c := newClock()
	g := New(Config{NoAdmission: true})
	m := g.Method("/svc/M")
	// Steady: one request every 7ms (140/s), 20ms each, 400ms deadlines.
	type req struct {
		t   Ticket
		end time.Time
	}
	var open []req
	step := func(d time.Duration) {
		now := c.Add(d)
		for len(open) > 0 && !open[0].end.After(now) {
			open[0].t.DoneAt(open[0].end)
			open = open[1:]
		}
	}
	arrive := func(lat time.Duration) {
		now := c.Now()
		tk, d := m.AdmitAt(now, Request{Deadline: now.Add(400 * time.Millisecond)})
		if d.Reason != Admitted {
			t.Fatalf("at %v: %+v (limit %d, %d in flight)", now, d, m.Limit(), m.Inflight())
		}
		open = append(open, req{tk, now.Add(lat)})
	}
	for range 300 {
		arrive(20 * time.Millisecond)
		step(7 * time.Millisecond)
	}
	// The pause: 500ms of arrivals, nothing ends.
	pauseEnd := c.Now().Add(2 * time.Second)
	for c.Now().Before(pauseEnd) {
		now := c.Now()
		tk, d := m.AdmitAt(now, Request{Deadline: now.Add(400 * time.Millisecond)})
		if d.Reason != Admitted {
			t.Fatalf("during the pause: %+v", d)
		}
		open = append(open, req{tk, time.Time{}})
		c.Add(7 * time.Millisecond)
	}
	// After it, the backlog ends in order, 2ms apart, while new requests
	// keep arriving (and are served in 20ms).
	for i := range open {
		if open[i].end.IsZero() || open[i].end.Before(pauseEnd) {
			open[i].end = pauseEnd.Add(time.Duration(i+1) * 2 * time.Millisecond)
		}
	}
	for range 300 {
		arrive(20 * time.Millisecond)
		step(7 * time.Millisecond)
	}
	if st := g.Stats(); st.ShedFirst+st.ShedRetry != 0 {
		t.Errorf("shed after a pause: %+v", st)
	}
}

// TestDiscardTeachesNothing: an overloaded method that also answers many
// requests "busy" at once (Discard) still shows its standing queue, to
// admission and to the limiter alike.
func TestDiscardTeachesNothing(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  Config
		left time.Duration
	}{
		{"admission", Config{NoShedding: true}, 600 * time.Millisecond},
		// The limiter needs an overload, not only a slow method: the
		// callers here have 400ms, less than the queue makes them wait.
		{"shedding", Config{NoAdmission: true}, 400 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			clk := newClock()
			m := New(c.cfg).Method("/svc/M")
			q := &fifo{c: clk, m: m, left: c.left}
			q.fill(100)
			for range 400 { // 2s of a standing queue of 100 at 200/s...
				q.run(5*time.Millisecond, 5*time.Millisecond, 1)
				now := clk.Now()
				for range 3 { // ...with three fast failures per request served
					if tk, d := m.AdmitAt(now, Request{Deadline: now.Add(time.Hour)}); d.Reason == Admitted {
						tk.Discard()
					}
				}
			}
			if c.cfg.NoShedding {
				if need, ok := m.NeedAt(clk.Now()); !ok || need < 450*time.Millisecond {
					t.Errorf("need = %v, %v; want ≈ 500ms: the fast failures were learned", need, ok)
				}
			} else if q.shed == 0 {
				t.Error("nothing shed: the fast failures hid the standing queue")
			}
		})
	}
	var zero Ticket
	zero.Discard()
}

// TestMemoryBound: a method's state has a fixed size, 3 KiB: what
// making one allocates, its history included; traffic allocates nothing
// more. TotalAlloc counts what every goroutine of the process allocates,
// so the size is the least of a few measurements: what else runs only adds.
func TestMemoryBound(t *testing.T) {
	g := New(Config{})
	const n = 100
	ms := make([]*Method, n)
	size := uint64(math.MaxUint64)
	for range 5 {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for i := range ms {
			ms[i] = g.newMethod()
		}
		runtime.ReadMemStats(&after)
		size = min(size, (after.TotalAlloc-before.TotalAlloc)/n)
	}
	if size > 3<<10 {
		t.Errorf("a method takes %d bytes", size)
	} else {
		t.Logf("a method takes %d bytes; %d methods at most %d KiB", size, DefaultMaxMethods, int(size)*DefaultMaxMethods>>10)
	}
	c := newClock()
	m := ms[0]
	if a := testing.AllocsPerRun(1000, func() {
		now := c.Add(time.Millisecond)
		tk, _ := m.AdmitAt(now, Request{Deadline: now.Add(time.Second)})
		tk.DoneAt(now.Add(time.Duration(len(ms)) * time.Microsecond))
	}); a != 0 {
		t.Errorf("a request allocates %v times", a)
	}
}

// TestMaxConcurrencyIsExact: many goroutines racing for 8 places never
// hold more than 8.
func TestMaxConcurrencyIsExact(t *testing.T) {
	g := New(Config{NoAdmission: true, NoAdaptive: true, MaxConcurrency: 8})
	m := g.Method("/svc/M")
	var held, most atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 2000 {
				tk, d := m.Admit(Request{})
				if d.Reason != Admitted {
					continue
				}
				n := held.Add(1)
				for {
					p := most.Load()
					if n <= p || most.CompareAndSwap(p, n) {
						break
					}
				}
				runtime.Gosched() // hold it a little
				held.Add(-1)
				tk.Done()
			}
		}()
	}
	wg.Wait()
	if most.Load() > 8 {
		t.Errorf("%d held at once, limit 8", most.Load())
	}
}

// Do no harm: an adaptive limit sheds first attempts only when admission
// cannot judge them. A first attempt with a deadline, while admission is
// on, waits for a place under the limit instead (Queued): queued behind
// the limit it may still be served in time, as without the Guard, and its
// caller may leave while it waits, without the method working for it.
// Without a deadline, or with admission off, the limit sheds it; retries
// are shed either way.
func TestAnAdaptiveLimitQueuesFirstAttemptsWithADeadline(t *testing.T) {
	for _, admission := range []bool{true, false} {
		c := newClock()
		g := New(Config{NoAdmission: !admission, MinLimit: 3})
		m := g.Method("/svc/M")
		for range 5 {
			runWindow(t, c, m, 20, 10*time.Millisecond, 0)
		}
		for range 12 { // requests take 200ms, their callers have 100ms: the limit engages
			serve(t, c, m, 100, 200*time.Millisecond, 100*time.Millisecond)
		}
		limit := m.Limit()
		if limit == -1 {
			t.Fatal("no limit engaged")
		}
		before := g.Stats()
		now := c.Now()
		var open []Ticket
		for range limit {
			tk, d := m.AdmitAt(now, Request{Deadline: now.Add(time.Second)})
			if d.Reason != Admitted {
				t.Fatalf("admission %v: first attempt under the limit: %+v", admission, d)
			}
			open = append(open, tk)
		}
		tk, d := m.AdmitAt(now, Request{Deadline: now.Add(time.Second)})
		if admission && d.Reason != Queued {
			t.Errorf("admission on: a first attempt with a second left at the limit: %+v, want queued", d)
		}
		if !admission && d.Reason != ShedFirst {
			t.Errorf("admission off: a first attempt past the limit is not shed: %+v", d)
		}
		if _, d := m.AdmitAt(now, Request{}); d.Reason != ShedFirst {
			t.Errorf("admission %v: a first attempt without a deadline past the limit: %+v", admission, d)
		}
		// A deadline beyond MaxDeadline is no deadline: it buys nothing.
		if _, d := m.AdmitAt(now, Request{Deadline: now.Add(time.Hour)}); d.Reason != ShedFirst {
			t.Errorf("admission %v: a first attempt claiming an hour past the limit: %+v", admission, d)
		}
		if _, d := m.AdmitAt(now, Request{Deadline: now.Add(time.Second), Retry: true}); d.Reason != ShedRetry {
			t.Errorf("admission %v: a retry past the limit: %+v", admission, d)
		}
		if d.Reason == Queued {
			// Another waits behind it, and its caller leaves: it is gone.
			leaver, d2 := m.AdmitAt(now, Request{Deadline: now.Add(time.Second)})
			if d2.Reason != Queued || m.Waiting() != 2 {
				t.Fatalf("a second first attempt at the limit: %+v, %d waiting", d2, m.Waiting())
			}
			if _, err := leaver.Wait(gone); err == nil || m.Waiting() != 1 {
				t.Fatalf("a caller that left still waits: %v, %d waiting", err, m.Waiting())
			}
			if tk.Ready() {
				t.Fatal("given a place while the limit is full")
			}
			// One in flight ends: the first in the queue gets its place.
			open[0].DoneAt(now.Add(10 * time.Millisecond))
			open = open[1:]
			if !tk.Ready() {
				t.Fatal("no place given when one was freed")
			}
			if d, err := tk.Wait(context.Background()); err != nil || d.Reason != Admitted {
				t.Fatalf("the waiting request: %+v, %v; want admitted", d, err)
			}
			open = append(open, tk)
			st := g.Stats()
			if st.Waited-before.Waited != 2 || st.Left-before.Left != 1 {
				t.Errorf("stats %+v (before: %+v): want 2 more waited, 1 more left", st, before)
			}
		}
		for _, tk := range open {
			tk.DoneAt(now)
		}
		if m.Inflight() != 0 || m.Waiting() != 0 {
			t.Errorf("after every end: %d in flight, %d waiting", m.Inflight(), m.Waiting())
		}
	}
}

// within is the deadline left after now: none when left ≤ 0.
func within(now time.Time, left time.Duration) time.Time {
	if left <= 0 {
		return time.Time{}
	}
	return now.Add(left)
}

// deadlineIf is dl when has, else none.
func deadlineIf(dl time.Time, has bool) time.Time {
	if !has {
		return time.Time{}
	}
	return dl
}
