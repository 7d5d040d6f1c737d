package overload

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/stormguard/stormguard/internal/cowmap"
	"github.com/stormguard/stormguard/internal/window"
	"github.com/stormguard/stormguard/priority"
)

// Reason says why a request was refused; the zero Reason means admitted.
type Reason uint8

const (
	// Admitted means the request may run. Report its end on the Ticket.
	Admitted Reason = iota
	// RefusedDeadline means the request's remaining deadline is shorter
	// than what the method needs now. The caller should not retry it with
	// the same deadline.
	RefusedDeadline
	// ShedRetry means a retry or hedge shed because the requests in flight
	// reached RetryShare of a concurrency limit. The caller should not
	// retry.
	ShedRetry
	// ShedFirst means a first attempt shed at a concurrency limit. The
	// caller may retry after Decision.RetryAfter.
	ShedFirst
	// Queued means a first attempt with a deadline waits for a place under
	// an engaged adaptive limit: call Ticket.Wait, which returns the
	// decision (admitted, or refused for its deadline), or gives up the
	// wait when the caller leaves.
	Queued
)

// String returns "admitted", "deadline", "shed_retry", "shed_first" or
// "queued".
func (r Reason) String() string {
	switch r {
	case Admitted:
		return "admitted"
	case RefusedDeadline:
		return "deadline"
	case ShedRetry:
		return "shed_retry"
	case ShedFirst:
		return "shed_first"
	case Queued:
		return "queued"
	}
	return "unknown"
}

// Decision is the outcome of Admit. The zero Decision admits.
type Decision struct {
	Reason Reason
	// Need is, for RefusedDeadline, what the method was expected to need.
	Need time.Duration
	// Limit is, for ShedRetry and ShedFirst, the concurrency limit that was
	// reached (for a retry, RetryShare of it; for a sheddable request, half
	// that; see Method.AdmitAt).
	Limit int64
	// RetryAfter is the pushback to send: ≥ 0, the caller may retry after
	// it; DoNotRetry (< 0), it should not retry.
	RetryAfter time.Duration
}

// DoNotRetry is the RetryAfter of refusals that the caller should not
// retry: -1 ms, as grpc-retry-pushback-ms says it (gRFC A6).
const DoNotRetry = -time.Millisecond

// Stats counts what a Guard decided. The zero value is no activity.
type Stats struct {
	Admitted        uint64
	RefusedDeadline uint64
	ShedRetry       uint64
	ShedFirst       uint64
	// Waited counts the requests that waited for a place (Queued); each
	// was then admitted, refused for its deadline, or left (Left: its
	// caller left first).
	Waited uint64
	Left   uint64
}

// Guard is a server's overload protection: deadline-aware admission and
// retry-aware shedding, per method. Create one with New; the zero Guard is
// not usable. A Guard is safe for concurrent use and must not be copied.
//
// The methods without a time read the monotonic clock; the At forms take
// the time from the caller (a simulator, or a caller that has just read
// the clock). Times a Guard is given should come from one clock: its time
// line starts at the first time it sees.
type Guard struct {
	s        settings
	origin   window.Origin // the Guard's time line starts at the first time it sees
	methods  cowmap.Map[string, *Method]
	other    *Method      // shared by methods beyond MaxMethods
	inflight atomic.Int64 // over all methods, when MaxConcurrency is set
	critical atomic.Int64 // ... of which critical

	admitted, refusedDeadline, shedRetry, shedFirst atomic.Uint64
	waited, left                                    atomic.Uint64
}

// New returns a Guard configured by c.
func New(c Config) *Guard {
	g := &Guard{s: c.settings()}
	g.other = g.newMethod()
	return g
}

// procEpoch is the origin of the offsets times are converted to: reading
// time.Since of a monotonic instant costs one clock read, time.Now two.
var procEpoch = time.Now()

// Stats returns a snapshot of the counters (each read atomically, not all
// at one instant).
func (g *Guard) Stats() Stats {
	return Stats{
		Admitted:        g.admitted.Load(),
		RefusedDeadline: g.refusedDeadline.Load(),
		ShedRetry:       g.shedRetry.Load(),
		ShedFirst:       g.shedFirst.Load(),
		Waited:          g.waited.Load(),
		Left:            g.left.Load(),
	}
}

// at returns t on the Guard's time line, in ns.
func (g *Guard) at(t time.Time) int64 { return g.origin.Since(int64(t.Sub(procEpoch))) }

// clock returns the monotonic clock's time on the Guard's time line.
func (g *Guard) clock() int64 { return g.origin.Since(int64(time.Since(procEpoch))) }

// Method is the state of one method: its latency history, requests in
// flight and adaptive limit. Get it with Guard.Method (the zero Method is
// not usable); it is safe for concurrent use.
type Method struct {
	g *Guard
	// born is when the method saw its first request, on the Guard's time
	// line; unborn until then.
	born     atomic.Int64
	inflight atomic.Int64
	critical atomic.Int64    // ... of which critical
	hist     *window.Counter // handler latencies, by histogram bucket
	lim      limiter
	gate     gate // first attempts waiting for a place under the limit
	// The admission estimate, recomputed at most every window/16.
	next   atomic.Int64  // ns: when to recompute
	need   atomic.Int64  // ns: the quantile; -1 when the history is too thin
	perReq atomic.Uint64 // float64 bits: ns of time line per completion in the window
	// recentPerReq is perReq over the window's recent part (see summary),
	// or perReq when that part has too few ends to say.
	recentPerReq atomic.Uint64
}

// unborn is the birth time of a method that has seen no request.
const unborn = math.MinInt64

func (g *Guard) newMethod() *Method {
	m := &Method{g: g, hist: newHistory(g.s.window)}
	m.born.Store(unborn)
	m.lim.init()
	m.need.Store(-1)
	return m
}

// begin starts m's time at t, the time of its first request: its history
// covers no time before, and its first limit window starts then.
func (m *Method) begin(t int64) {
	if m.born.Load() == unborn && m.born.CompareAndSwap(unborn, t) {
		m.lim.start.Store(t)
	}
}

// Method returns the state of the named method (a gRPC full method name,
// or any key), creating it on first use. Beyond MaxMethods names, every
// new name gets one shared state. It takes no lock and does not allocate
// once the method exists.
func (g *Guard) Method(name string) *Method {
	if m, ok := g.methods.Load(name); ok {
		return m
	}
	if g.methods.Len() >= g.s.maxMethods {
		return g.other
	}
	return g.methods.LoadOrCreate(name, func(string) *Method { return g.newMethod() })
}

// Ticket is an admitted request (or, Queued, one that waits: see Wait,
// and report its end only once Wait has admitted it). Report its end once: with Done (or
// DoneAt) when it completed (it succeeded, or its handler finished however
// late), with Abandon when it ended before it completed because its caller
// left or its deadline passed while it ran, and with Discard when it
// failed on its own, which says nothing of how long the method needs (often
// at once: a full pool, a bad argument). The zero Ticket (a refusal's)
// ignores reports. A Ticket is a small value; reporting twice through
// copies of it counts the request's end twice.
type Ticket struct {
	m        *Method
	start    int64
	due      int64 // ns; an end after it missed a deadline that counts; none
	global   bool
	critical bool    // a critical request (counted apart, see AdmitAt)
	w        *waiter // a request that waits for a place (Queued), until Wait
}

// Request is what admission knows of a request. The zero Request is a
// first attempt of default priority with no deadline.
type Request struct {
	// Deadline is the request's deadline (zero: none). A deadline more
	// than MaxDeadline away counts as none.
	Deadline time.Time
	// Retry: the request carries grpc-previous-rpc-attempts > 0 (a retry
	// or a hedge).
	Retry bool
	// Priority is the request's priority (package priority).
	Priority priority.Priority
}

// AdmitAt decides on request r of m, which arrives at now. An admitted
// request must report its end on the Ticket.
//
// At a concurrency limit (adaptive, or MaxConcurrency) requests are shed in
// this order, each class at its own threshold of the limit L:
//
//   - sheddable requests (a Priority below priority.Default, retries or not) from
//     RetryShare/2 of L (a quarter by default), whether or not they carry
//     a deadline: their callers said they may be dropped. While no
//     adaptive limit is engaged, they are shed once the requests in flight
//     reach the concurrency that has the method's tolerated latency (the
//     larger of Tolerance × its baseline and DeadlineShare of its callers'
//     deadlines) at its throughput in the last LimitWindow (Little's law;
//     at least MinLimit): where a limit would engage, without waiting for
//     the evidence a limit needs, so that sheddable work never queues the
//     method's other requests beyond the latency it tolerates. A burst
//     that doubles the method's usual concurrency may shed them;
//   - retries and hedges of the other priorities, critical included, from
//     RetryShare of L (half by default);
//   - default first attempts at L (at an adaptive limit only when
//     admission cannot judge them, see Admit);
//   - critical first attempts (a Priority above priority.Default) when the critical
//     requests in flight alone reach L (at an adaptive limit, under the
//     same condition as default ones). The requests in flight may then
//     pass MaxConcurrency, up to twice it; when every request is critical,
//     the Guard sheds exactly as when none is.
//
// A shed first attempt gets ShedFirst, a shed retry ShedRetry, whatever
// its priority. Admission refuses a request of any priority whose
// deadline cannot be met.
func (m *Method) AdmitAt(now time.Time, r Request) (Ticket, Decision) {
	return m.admit(m.g.at(now), r.Deadline.Sub(now), !r.Deadline.IsZero(), r.Retry, r.Priority)
}

// Admit is AdmitAt now (on the monotonic clock).
func (m *Method) Admit(r Request) (Ticket, Decision) {
	now := time.Now()
	return m.admit(m.g.at(now), r.Deadline.Sub(now), !r.Deadline.IsZero(), r.Retry, r.Priority)
}

// admit is AdmitAt at t (ns on the time line), with left to the
// deadline.
func (m *Method) admit(t int64, left time.Duration, hasDeadline, retry bool, p priority.Priority) (Ticket, Decision) {
	g := m.g
	s := &g.s
	m.begin(t)
	if left > s.maxDeadline {
		hasDeadline = false // a claim the Guard does not believe
	}
	limiting := s.shedding && s.adaptive
	inflight := m.inflight.Load()
	if s.admission && hasDeadline {
		if need, ok := m.needAt(t, inflight); ok && left < need {
			if limiting && m.lim.meetable(int64(left), s) {
				m.lim.miss()
			}
			g.refusedDeadline.Add(1)
			return Ticket{}, Decision{Reason: RefusedDeadline, Need: need, RetryAfter: DoNotRetry}
		}
	}
	critical := p > priority.Default
	global := false
	if s.shedding {
		d, shed, took := m.limits(inflight, hasDeadline, retry, p)
		if shed {
			return Ticket{}, d
		}
		global = took
	}
	if limiting && s.admission && hasDeadline && !retry && p >= priority.Default && m.queues(critical) {
		tk := m.wait(t, t+int64(left), critical)
		tk.global = global
		return tk, Decision{Reason: Queued}
	}
	n := m.inflight.Add(1)
	if critical {
		m.critical.Add(1)
	}
	if limiting {
		m.lim.arrived(n, int64(left), hasDeadline)
	}
	g.admitted.Add(1)
	due := int64(none)
	if hasDeadline {
		due = m.dueOf(t, int64(left))
	}
	return Ticket{m: m, start: t, due: due, global: global, critical: critical}, Decision{}
}

// dueOf is the due time of a request admitted at t with left ns to its
// deadline: when its end misses a deadline that counts (one the method
// meets when not overloaded, see limiter.meetable), and none otherwise.
func (m *Method) dueOf(t, left int64) int64 {
	if s := &m.g.s; s.shedding && s.adaptive && m.lim.meetable(left, s) {
		return t + left
	}
	return int64(none)
}

// limits applies the concurrency limits to a request of priority p that
// admission let through, with inflight requests of m in flight: it
// returns the Decision that sheds it (shed), or whether it took a place
// under MaxConcurrency (global).
func (m *Method) limits(inflight int64, hasDeadline, retry bool, p priority.Priority) (d Decision, shed, global bool) {
	g := m.g
	s := &g.s
	sheddable := p < priority.Default
	critical := p > priority.Default
	// A critical first attempt counts the critical requests in flight
	// (its own class), the others every request in flight.
	alone := critical && !retry
	// An adaptive limit sheds default and critical first attempts only
	// when admission cannot judge them (no deadline, or admission off):
	// admission refuses those that would miss their deadline, and the
	// others would be served in time, as without the Guard.
	if s.adaptive && (retry || sheddable || !hasDeadline || !s.admission) {
		if limit := m.lim.limit.Load(); limit != unlimited {
			n := inflight
			if alone {
				n = m.critical.Load()
			}
			if d, shed := g.shed(n, limit, retry, sheddable); shed {
				return d, true, false
			}
		} else if at := m.lim.little.Load(); sheddable && at > 0 && inflight >= at {
			// No limit yet: sheddable work is kept from making the
			// backlog longer than the latency the method tolerates,
			// without waiting for the evidence a limit needs.
			return g.refuse(retry, at), true, false
		}
	}
	if s.maxConc <= 0 {
		return Decision{}, false, false
	}
	// Exact: a place is taken only if it is free (for a critical first
	// attempt, a place among the critical ones).
	count, other := &g.inflight, &g.critical
	if alone {
		count, other = other, count
	}
	for {
		n := count.Load()
		if d, shed := g.shed(n, s.maxConc, retry, sheddable); shed {
			return d, true, false
		}
		if count.CompareAndSwap(n, n+1) {
			break
		}
	}
	if critical {
		// A critical first attempt is one more of every request in
		// flight; a critical retry one more of the critical ones.
		other.Add(1)
	}
	return Decision{}, false, true
}

// shed decides whether a request is shed at limit with n requests (for a
// critical first attempt, n critical ones) in flight: a sheddable request
// from half of RetryShare of it, a retry or hedge from RetryShare of it,
// a first attempt at it.
func (g *Guard) shed(n, limit int64, retry, sheddable bool) (Decision, bool) {
	at := limit
	switch {
	case sheddable:
		at = max(int64(float64(limit)*g.s.retryShare/2), 1)
	case retry:
		at = max(int64(float64(limit)*g.s.retryShare), 1)
	}
	if n < at {
		return Decision{}, false
	}
	return g.refuse(retry, at), true
}

// refuse counts and returns the Decision that sheds a request (a retry or
// a first attempt) at the threshold at.
func (g *Guard) refuse(retry bool, at int64) Decision {
	if retry {
		g.shedRetry.Add(1)
		return Decision{Reason: ShedRetry, Limit: at, RetryAfter: DoNotRetry}
	}
	g.shedFirst.Add(1)
	return Decision{Reason: ShedFirst, Limit: at, RetryAfter: g.s.retryAfter}
}

// needAt returns what a request of m arriving at t (ns) is expected to
// need. While every request of the method waits in a queue (the last limit
// window's least completed latency was beyond Tolerance × its baseline),
// that is the time the inflight requests ahead of it and itself need to
// end at the rate requests ended lately (Little's law), with a margin of
// queueMargin: the queue is where the time goes, and a request admitted
// at its deadline's edge would be worked for a caller who has left.
// Otherwise it is the smaller of two estimates: the Quantile of the
// latencies that ended in the window, and that drain time at the rate of
// the whole window. The first alone would keep refusing once the backlog
// has drained (refused requests teach it nothing); the second alone would
// refuse during a burst that the method absorbs. false: not enough
// history.
func (m *Method) needAt(t, inflight int64) (time.Duration, bool) {
	if next := m.next.Load(); t >= next && m.next.CompareAndSwap(next, t+int64(m.g.s.window/16)) {
		m.recompute(t)
	}
	need := m.need.Load()
	if need < 0 {
		return 0, false
	}
	if m.lim.queued.Load() {
		return m.queueNeed(inflight), true
	}
	drain := float64(inflight+1) * math.Float64frombits(m.perReq.Load())
	return time.Duration(min(float64(need), drain)), true
}

// queueNeed is what a request of m needs when the requests in flight
// before it, and it, wait in a queue: the time they need to end at the
// rate requests ended lately, with a margin of queueMargin.
func (m *Method) queueNeed(inflight int64) time.Duration {
	drain := float64(inflight+1) * math.Float64frombits(m.recentPerReq.Load())
	return time.Duration(drain * (1 + queueMargin))
}

// queueMargin is the share of a queued request's expected drain time that
// admission adds to it, so that the queue it admits into stands short of
// its callers' deadlines, not at them: the rate of ends varies, and a
// request that ends just after its caller left was worked for nobody.
const queueMargin = 0.25

// minRecentEnds is the least number of ends in the history's recent part
// for its rate to stand for the method's (see recompute).
const minRecentEnds = 5

// recompute refreshes the admission estimate from the history at t.
func (m *Method) recompute(t int64) {
	s := &m.g.s
	sum := summarize(m.hist, t, s.quantile, m.born.Load())
	if sum.n < s.minSamples {
		m.need.Store(-1)
		return
	}
	perReq := float64(sum.span) / float64(sum.n)
	m.perReq.Store(math.Float64bits(perReq))
	if sum.recent >= minRecentEnds {
		perReq = float64(sum.recentSpan) / float64(sum.recent)
	}
	m.recentPerReq.Store(math.Float64bits(perReq))
	m.need.Store(int64(sum.q))
}

// Done reports, now (on the monotonic clock), that the admitted request
// completed: its place in flight is freed and its latency is learned.
func (t Ticket) Done() {
	if t.m != nil && t.w == nil {
		t.end(t.m.g.clock(), true)
	}
}

// DoneAt is Done at time now.
func (t Ticket) DoneAt(now time.Time) {
	if t.m != nil && t.w == nil {
		t.end(t.m.g.at(now), true)
	}
}

// Abandon reports the end of the admitted request, now (on the monotonic
// clock): see AbandonAt.
func (t Ticket) Abandon() {
	if t.m != nil && t.w == nil {
		t.end(t.m.g.clock(), false)
	}
}

// AbandonAt reports, at time now, that the admitted
// request ended before it completed: its caller left (a cancellation) or
// its deadline passed while it ran. Its place in flight is freed, and what
// it proves is learned: that the method needs more than the time it ran.
// Admission learns that time as a lower bound of what the method needs
// (it then refuses less, never more); the adaptive limit learns nothing
// from it unless even that time exceeds the latency it tolerates, and
// never takes it for the method's usual latency, so that calls cancelled
// at once do not make a method look fast and its normal latency look like
// a queue. A deadline it missed counts as one the method failed; a
// cancellation does not.
func (t Ticket) AbandonAt(now time.Time) {
	if t.m != nil && t.w == nil {
		t.end(t.m.g.at(now), false)
	}
}

// end reports the end of the admitted request at end (ns on the time
// line): completed, or cut short.
func (t Ticket) end(end int64, completed bool) {
	m := t.m
	g := m.g
	d := max(end-t.start, 0)
	inflight := t.release()
	if g.s.shedding && g.s.adaptive {
		if end >= t.due {
			m.lim.miss()
		}
		m.lim.observe(end, d, completed, &g.s, inflight, m.gate.n.Load() > 0)
		m.dispatch(end) // its place, and any the limit freed
	}
	if !g.s.admission {
		return
	}
	m.hist.Add(end, bucketOf(time.Duration(d)), 1)
	if next := m.next.Load(); end >= next && m.next.CompareAndSwap(next, end+int64(g.s.window/16)) {
		m.recompute(end)
	}
}

// Discard reports the end of the admitted request without learning from
// it: its place in flight is freed. A request that failed fast on its own
// says nothing of what the method needs; learning its latency would make
// an overloaded method that answers "busy" at once look fast.
func (t Ticket) Discard() {
	if t.m != nil && t.w == nil {
		t.discard(t.m.g.clock())
	}
}

// DiscardAt is Discard at time now: the place it frees may go to a
// request that waits for one (see Ticket.Wait), which is then given it at
// now.
func (t Ticket) DiscardAt(now time.Time) {
	if t.m != nil && t.w == nil {
		t.discard(t.m.g.at(now))
	}
}

// discard frees the request's place in flight at at (ns on the time
// line) without learning from it.
func (t Ticket) discard(at int64) {
	t.release()
	t.m.dispatch(at)
}

// release frees the request's place in flight and returns how many of its
// method are left.
func (t Ticket) release() int64 {
	if t.global {
		t.m.g.inflight.Add(-1)
	}
	if t.critical {
		if t.global {
			t.m.g.critical.Add(-1)
		}
		t.m.critical.Add(-1)
	}
	return t.m.inflight.Add(-1)
}

// Limit returns m's adaptive concurrency limit, or -1 when none is
// engaged.
func (m *Method) Limit() int64 {
	if l := m.lim.limit.Load(); l != unlimited {
		return l
	}
	return -1
}

// Inflight returns the admitted requests of m that have not ended.
func (m *Method) Inflight() int64 { return m.inflight.Load() }

// Need returns what admission expects a request of m arriving now (on the
// monotonic clock) to need, and false when m's history is too thin to
// refuse anything.
func (m *Method) Need() (time.Duration, bool) {
	return m.needAt(m.g.clock(), m.inflight.Load())
}

// NeedAt is Need at time now.
func (m *Method) NeedAt(now time.Time) (time.Duration, bool) {
	return m.needAt(m.g.at(now), m.inflight.Load())
}
