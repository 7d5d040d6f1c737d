package engine

import (
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stormguard/stormguard/internal/window"
)

// Per-endpoint accounting. A target is often several endpoints (a
// round_robin over the addresses a name resolves to); when one of them
// fails everything and the others serve, the failures say nothing about the
// target: a retry that goes to another endpoint is a fail-over, not added
// load on a failing service. The table below keeps each endpoint's recent
// outcomes so that the retry decision can tell the two apart.
const (
	epSlots      = 4                      // slots in an endpoint's window
	epSlotWidth  = time.Second            // so the window is the last 3 to 4 seconds
	epMinSeen    = 5                      // outcomes before an endpoint (or the rest) is judged
	epBadRatio   = 0.5                    // an endpoint failing at least this share is bad...
	epGoodRatio  = 0.1                    // ...when the other endpoints fail at most this share
	epMaxTracked = 256                    // endpoints tracked per target
	epIdle       = time.Minute            // an endpoint not seen for this long is forgotten
	epRejudge    = 100 * time.Millisecond // how long a judgement of the outliers stands
)

// Endpoints tracks the recent outcomes of one target's endpoints, keyed by
// the address the transport reports (one net.Addr per connection).
// Recording an outcome is lock-free for a known endpoint; judging, on the
// failure path, walks the table. The zero Endpoints is an empty table,
// ready to use; it is safe for concurrent use.
type Endpoints struct {
	// tab is the table's endpoints, replaced whole, under mu, when one
	// is added or forgotten (rarely: a new connection, an idle one):
	// recording an outcome and judging only read it.
	tab    atomic.Pointer[epTable]
	mu     sync.Mutex
	judged atomic.Pointer[judgement]
	// clearAt is when (UnixNano) the endpoints were last judged to have
	// no outlier, a judgement that stands until epRejudge later as judged
	// does (0: none stands); kept apart from judged, so that judging none
	// allocates nothing.
	clearAt atomic.Int64
	// nowhere is the time (UnixNano) until which attempts avoid nothing:
	// an attempt's picks all went to endpoints it avoids, so the transport has no
	// other endpoint to pick (their connections are down), and a retry
	// after a failure on an outlier is no fail-over. 0: none. A success on
	// an endpoint that is not an outlier ends it.
	nowhere atomic.Int64
	// lastFail is when (UnixNano) an endpoint of the table last failed an
	// attempt; 0: never. With no failure in the window there is no
	// outlier to judge.
	lastFail atomic.Int64
}

// judgement is the set of outliers as of a time, which stands until
// epRejudge later.
type judgement struct {
	at, until time.Time
	outliers  []net.Addr
}

// Current returns the endpoints attempts avoid: the outliers, judged
// again at most every epRejudge (two atomic loads on the success path),
// unless the transport has lately had nowhere else to send attempts. A
// table of one endpoint, or none, whose last judgement found no outliers
// has none: it is not judged again until it knows two.
func (t *Endpoints) Current(now time.Time) []net.Addr {
	if at, n := t.clearAt.Load(), now.UnixNano(); at != 0 && n >= at && n-at < int64(epRejudge) {
		return nil
	}
	j := t.judged.Load()
	if (j == nil || len(j.outliers) == 0) && t.seen() < 2 {
		return nil
	}
	if j != nil && now.Before(j.until) && !now.Before(j.at) {
		return t.avoidable(j.outliers, now)
	}
	return t.judge(now)
}

// judge judges the outliers now, and returns those attempts avoid.
func (t *Endpoints) judge(now time.Time) []net.Addr {
	if f := t.lastFail.Load(); f == 0 || now.UnixNano()-f >= int64(epSlots*epSlotWidth) {
		return nil // no failure in the window: no outlier (nothing to store: this is as quick)
	}
	var out []net.Addr
	if t.seen() >= 2 { // one endpoint (or none) has no others to compare with
		out = t.outliers(now)
	}
	if len(out) == 0 {
		t.clearAt.Store(now.UnixNano())
		t.judged.Store(nil)
		return nil
	}
	t.judged.Store(&judgement{at: now, until: now.Add(epRejudge), outliers: out})
	t.clearAt.Store(0)
	return t.avoidable(out, now)
}

// avoidable returns outliers, or none while the transport has nowhere else to send
// attempts (see nowhereElse).
func (t *Endpoints) avoidable(outliers []net.Addr, now time.Time) []net.Addr {
	if len(outliers) > 0 && t.nowhere.Load() > now.UnixNano() {
		return nil
	}
	return outliers
}

// epNowhere is how long, at most, attempts avoid nothing after one found
// no other endpoint to go to (see nowhereElse).
const epNowhere = time.Second

// nowhereElse notes that an attempt's picks all went to endpoints it
// avoids: the transport has no other endpoint to pick. For epNowhere, or until an
// endpoint other than the outliers serves, attempts avoid nothing (their
// re-picks would go to the same endpoints) and a retry after a failure on
// an outlier is no fail-over: the budget pays for it.
func (t *Endpoints) nowhereElse(now time.Time) {
	t.nowhere.Store(now.Add(epNowhere).UnixNano())
}

// endpoint is one endpoint's recent outcomes: successes (kind epOK) and
// failures (kind epFail) over epSlots slots of epSlotWidth.
type endpoint struct {
	addr net.Addr
	w    *window.Counter
	// lastFail is when (UnixNano) the endpoint last failed an attempt; 0:
	// never.
	lastFail atomic.Int64
}

// The kinds an endpoint's window counts.
const (
	epOK   = 0
	epFail = 1
)

func newEndpoint(addr net.Addr) *endpoint {
	return &endpoint{addr: addr, w: window.New(epSlots, 2, epSlotWidth)}
}

// Record counts one outcome of an attempt sent to addr at now.
func (t *Endpoints) Record(addr net.Addr, failed bool, now time.Time) {
	if addr == nil {
		return
	}
	e := t.lookup(addr)
	if e == nil {
		if e = t.add(addr, now); e == nil {
			return
		}
	}
	kind := epOK
	if failed {
		kind = epFail
	}
	e.w.Add(now.UnixNano(), kind, 1)
	if failed {
		e.lastFail.Store(now.UnixNano())
		if now.UnixNano() > t.lastFail.Load() {
			t.lastFail.Store(now.UnixNano())
		}
	}
	if !failed && t.nowhere.Load() != 0 {
		// An endpoint that is not an outlier serves: the transport has somewhere
		// else to send attempts again.
		if j := t.judged.Load(); j == nil || !slices.Contains(j.outliers, addr) {
			t.nowhere.Store(0)
		}
	}
}

// counts returns the outcomes in the window ending at now.
func (e *endpoint) counts(now time.Time) (ok, fail int64) {
	return e.w.Counts(now.UnixNano())
}

// epTable is a table's endpoints as of one change. A slice is walked
// faster than a map (a client whose calls come less often than epRejudge
// judges its endpoints on every call), and a small one searched faster.
type epTable struct {
	list []*endpoint
	// byAddr finds an endpoint of a table of more than epScan; nil for
	// a smaller one, whose list is searched (the same equality: an
	// address is its connection's, compared as an interface).
	byAddr map[net.Addr]*endpoint
}

// epScan is how many endpoints a table holds at most for lookup to walk
// them.
const epScan = 8

// endpoints returns the table's endpoints; the slice is not to be
// changed.
func (t *Endpoints) endpoints() []*endpoint {
	if tb := t.tab.Load(); tb != nil {
		return tb.list
	}
	return nil
}

// seen returns how many endpoints the table holds.
func (t *Endpoints) seen() int { return len(t.endpoints()) }

// lookup returns the endpoint addr, or nil when the table has none.
func (t *Endpoints) lookup(addr net.Addr) *endpoint {
	tb := t.tab.Load()
	switch {
	case tb == nil:
		return nil
	case tb.byAddr != nil:
		return tb.byAddr[addr]
	}
	for _, e := range tb.list {
		if e.addr == addr {
			return e
		}
	}
	return nil
}

// add adds the endpoint addr to the table at now and returns it (once:
// concurrent adds of one address share one endpoint), or nil when the
// table is full of endpoints seen within epIdle.
func (t *Endpoints) add(addr net.Addr, now time.Time) *endpoint {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := t.lookup(addr); e != nil {
		return e
	}
	if t.seen() >= epMaxTracked {
		t.sweep(now)
		if t.seen() >= epMaxTracked {
			return nil
		}
	}
	e := newEndpoint(addr)
	t.store(append(slices.Clip(t.endpoints()), e))
	return e
}

// sweep forgets endpoints not seen for epIdle. t.mu must be held.
func (t *Endpoints) sweep(now time.Time) {
	limit := now.Add(-epIdle).UnixNano()
	var kept []*endpoint
	for _, e := range t.endpoints() {
		if last, ok := e.w.Latest(); ok && last >= limit {
			kept = append(kept, e)
		}
	}
	t.store(kept)
}

// store makes list the table's endpoints. t.mu must be held.
func (t *Endpoints) store(list []*endpoint) {
	tb := &epTable{list: list}
	if len(list) > epScan {
		tb.byAddr = make(map[net.Addr]*endpoint, len(list))
		for _, e := range list {
			tb.byAddr[e.addr] = e
		}
	}
	t.tab.Store(tb)
}

// outliers returns the endpoints that fail while the rest of the target
// serves: each has failed at least epBadRatio of its recent attempts
// (with at least epMinSeen), while all the other endpoints together have
// failed at most epGoodRatio of theirs (with at least epMinSeen). With
// failures spread evenly (independent failures, a failing target) there
// are none.
func (t *Endpoints) outliers(now time.Time) []net.Addr {
	type seen struct {
		addr     net.Addr
		ok, fail int64
	}
	var buf [8]seen
	all := buf[:0]
	var totalOK, totalFail int64
	for _, e := range t.endpoints() {
		ok, fail := e.counts(now)
		if ok+fail > 0 {
			all = append(all, seen{e.addr, ok, fail})
			totalOK += ok
			totalFail += fail
		}
	}
	var out []net.Addr
	for _, s := range all {
		if s.ok+s.fail < epMinSeen || float64(s.fail) < epBadRatio*float64(s.ok+s.fail) {
			continue
		}
		restOK, restFail := totalOK-s.ok, totalFail-s.fail
		if rest := restOK + restFail; rest >= epMinSeen && float64(restFail) <= epGoodRatio*float64(rest) {
			out = append(out, s.addr)
		}
	}
	return out
}

// EndpointCount is one endpoint's outcomes in the table's window, and
// whether attempts avoid it.
type EndpointCount struct {
	Addr       net.Addr
	OK, Failed int64
	Avoided    bool // it fails while the others serve: attempts go elsewhere
}

// Snapshot returns the endpoints seen in the window ending now, sorted by
// address.
func (t *Endpoints) Snapshot(now time.Time) []EndpointCount {
	avoided := t.Current(now)
	var out []EndpointCount
	for _, e := range t.endpoints() {
		ok, fail := e.counts(now)
		if ok+fail > 0 {
			out = append(out, EndpointCount{Addr: e.addr, OK: ok, Failed: fail, Avoided: slices.Contains(avoided, e.addr)})
		}
	}
	slices.SortFunc(out, func(a, b EndpointCount) int { return strings.Compare(a.Addr.String(), b.Addr.String()) })
	return out
}

// totals returns the outcomes of all the target's endpoints in the window
// ending now; known is false when no endpoint has been seen.
func (t *Endpoints) totals(now time.Time) (ok, fail int64, known bool) {
	if t.seen() == 0 {
		return 0, 0, false
	}
	for _, e := range t.endpoints() {
		o, f := e.counts(now)
		ok += o
		fail += f
	}
	return ok, fail, true
}

// servedRecently reports whether an endpoint of the target answered an
// attempt with success in the newest two slots of its window (the last
// one to two seconds); known is false while no endpoint has been seen.
func (t *Endpoints) servedRecently(now time.Time) (served, known bool) {
	if t.seen() == 0 {
		return false, false
	}
	var into [1]int64
	for _, e := range t.endpoints() {
		if e.w.Sum(now.UnixNano(), 0, 2, into[:]); into[0] > 0 {
			break
		}
	}
	return into[0] > 0, true
}

// epFailedMemory is how long failedLately takes an endpoint that failed
// an attempt for failing: the budget's JudgeWindow, over which a client
// that calls every few seconds still meets each of a few endpoints.
const epFailedMemory = 10 * time.Second

// failedLately appends to avoid the endpoints that failed an attempt
// within epFailedMemory of now, and reports whether every endpoint the
// table knows is in the result.
func (t *Endpoints) failedLately(avoid []net.Addr, now time.Time) (_ []net.Addr, all bool) {
	all = true
	for _, e := range t.endpoints() {
		if slices.Contains(avoid, e.addr) {
			continue
		}
		if f := e.lastFail.Load(); f != 0 && now.UnixNano()-f < int64(epFailedMemory) {
			avoid = append(avoid, e.addr)
		} else {
			all = false
		}
	}
	return avoid, all
}

// known returns the endpoints seen.
func (t *Endpoints) known() []net.Addr {
	var out []net.Addr
	for _, e := range t.endpoints() {
		out = append(out, e.addr)
	}
	return out
}

// countsOf returns the outcomes of the endpoint addr in the window ending
// now (none for an endpoint not seen).
func (t *Endpoints) countsOf(addr net.Addr, now time.Time) (ok, fail int64) {
	if e := t.lookup(addr); e != nil {
		return e.counts(now)
	}
	return 0, 0
}
