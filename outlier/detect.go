package outlier

import (
	"math"
	"slices"
	"time"
)

// The fixed parts of "clearly above the rest": an endpoint is ejected only
// when its failure ratio exceeds the others' by at least minGap, and a
// one-sided Fisher exact test puts the chance of a gap that large, were
// failures spread evenly, at or below alpha (shared among the windows
// tried).
const (
	minGap = 0.2
	alpha  = 1e-6
)

// evaluate folds the new outcomes into the windows, un-ejects and ejects,
// and tells the child. An evaluation poked by Done (tick false) is skipped
// when the last one was less than Interval/100 ago. It reports whether the
// timer should keep running (outcomes in the window, or an ejection).
func (b *outlierBalancer) evaluate(tick bool) (active bool) {
	b.childMu.Lock()
	defer b.childMu.Unlock()
	lc := b.cfg.Load()
	if b.isClosed() || lc == nil {
		return false
	}
	cfg := lc.cfg
	now := b.clk.Now()
	b.mu.Lock()
	if !tick && !b.lastEval.IsZero() && now.Sub(b.lastEval) < cfg.Interval/100 {
		b.mu.Unlock()
		return true
	}
	b.lastEval = now
	if b.origin.IsZero() {
		b.origin = now
	}
	t := b.at(now)
	eps := b.eps.Values()
	for _, ep := range eps {
		ok, fail := ep.ok.Swap(0), ep.fail.Swap(0)
		if ep.ejected.Load() {
			continue // requests that were in flight when it was ejected
		}
		ep.win.Add(t, kindOK, int64(ok))
		ep.win.Add(t, kindFail, int64(fail))
	}
	changed, active := b.decide(now, cfg, eps)
	b.mu.Unlock()
	b.deliver(changed)
	return active
}

// at returns now on the windows' time line. b.mu is held.
func (b *outlierBalancer) at(now time.Time) int64 { return int64(now.Sub(b.origin)) }

// decide un-ejects endpoints whose time is up (or all of them, when no other
// endpoint is connected) and ejects the outliers, within the caps. It
// returns the endpoints that changed, and whether the timer should keep
// running. b.mu is held.
func (b *outlierBalancer) decide(now time.Time, cfg Config, eps []*endpoint) (changed []*endpoint, active bool) {
	ready := b.readyEndpoints(len(eps))
	changed, ejected := b.release(now, cfg, eps, ready)
	decayTimes(now, cfg, eps)
	w := newWindows(eps)
	w.sum(eps, b.at(now))
	active = ejected > 0 || w.busy()
	maxEjected := maxEjections(len(eps), cfg)
	if ejected >= maxEjected && !b.met.countsOverflow() {
		return changed, active
	}
	var buf [2]candidate // the usual few, without allocating
	cands := w.appendOutliers(buf[:0], cfg, eps)
	changed, n := b.ejectOutliers(now, eps, ready, cands, max(maxEjected-ejected, 0), changed)
	b.met.record(n, len(cands)-n)
	return changed, active || n > 0
}

// readyEndpoints returns the endpoints that have a READY SubConn. b.mu is
// held.
func (b *outlierBalancer) readyEndpoints(n int) map[*endpoint]bool {
	ready := make(map[*endpoint]bool, n)
	for sc := range b.subs {
		if ep := sc.ep.Load(); ep != nil && sc.ready.Load() {
			ready[ep] = true
		}
	}
	return ready
}

// release un-ejects the endpoints whose ejection time is up, or every
// ejected endpoint when none of the others is connected. It returns those
// it un-ejected and how many stay ejected. b.mu is held.
func (b *outlierBalancer) release(now time.Time, cfg Config, eps []*endpoint, ready map[*endpoint]bool) (changed []*endpoint, ejected int) {
	readyIn := 0
	for _, ep := range eps {
		if ep.ejected.Load() {
			if now.Sub(ep.ejectedAt) >= ejectionTime(cfg, ep.times) {
				b.uneject(ep, now)
				changed = append(changed, ep)
			} else {
				ejected++
			}
		}
		if !ep.ejected.Load() && ready[ep] {
			readyIn++
		}
	}
	if ejected > 0 && readyIn == 0 {
		// Nothing left to send to: ejected endpoints are better than none.
		for _, ep := range eps {
			if ep.ejected.Load() {
				b.uneject(ep, now)
				changed = append(changed, ep)
			}
		}
		ejected = 0
	}
	return changed, ejected
}

// decayTimes lowers the ejection multiplier of each endpoint that is not
// ejected by one per BaseEjectionTime since it last changed. b.mu is held.
func decayTimes(now time.Time, cfg Config, eps []*endpoint) {
	for _, ep := range eps {
		if !ep.ejected.Load() && ep.times > 0 {
			if k := int(now.Sub(ep.since) / cfg.BaseEjectionTime); k > 0 {
				ep.times = max(0, ep.times-k)
				ep.since = ep.since.Add(time.Duration(k) * cfg.BaseEjectionTime)
			}
		}
	}
}

// windows holds the outcomes of the endpoints that are not ejected,
// summed over each window they are compared on.
type windows struct {
	buckets int        // the whole window's length
	ladder  []int      // the windows' lengths in buckets, shortest first
	sums    [][]counts // by endpoint, then window; nil for an ejected one
	total   []counts   // by window, over every endpoint not ejected
}

// ladder returns the windows to compare over: the last 1, 2, 4, ...
// buckets of nb, then all nb.
func ladder(nb int) []int {
	var l []int
	for w := 1; w < nb; w *= 2 {
		l = append(l, w)
	}
	return append(l, nb)
}

// newWindows returns empty windows for eps, whose endpoints share one
// ring length. It is small enough to be inlined, so that its slices stay
// on decide's stack when they are small.
func newWindows(eps []*endpoint) windows {
	nb := 0
	if len(eps) > 0 {
		nb = eps[0].win.Slots()
	}
	l := ladder(nb)
	return windows{buckets: nb, ladder: l, sums: make([][]counts, len(eps)), total: make([]counts, len(l))}
}

// sum sums the buckets of the endpoints that are not ejected, in the
// window ending at t, over every window. b.mu is held.
func (w *windows) sum(eps []*endpoint, t int64) {
	for i, ep := range eps {
		if !ep.ejected.Load() {
			w.add(i, ep, t)
		}
	}
}

// add sums ep's buckets, in the window ending at t, over every window
// into w.sums[i], and adds them to w.total.
func (w *windows) add(i int, ep *endpoint, t int64) {
	ladder, total := w.ladder, w.total
	sums := make([]counts, len(ladder))
	var acc [2]int64
	from := 0
	for li, n := range ladder {
		ep.win.Sum(t, from, n, acc[:]) // the buckets a longer window adds
		from = n
		sums[li] = counts{ok: sat32(acc[kindOK]), fail: sat32(acc[kindFail])}
		total[li].ok = sat32(int64(total[li].ok) + acc[kindOK])
		total[li].fail = sat32(int64(total[li].fail) + acc[kindFail])
	}
	w.sums[i] = sums
}

// sat32 returns n, or math.MaxUint32 if n is more.
func sat32(n int64) uint32 { return uint32(min(n, math.MaxUint32)) }

// busy reports whether the whole window holds any outcome.
func (w *windows) busy() bool {
	return w.buckets > 0 && w.total[len(w.total)-1] != counts{}
}

// candidate is an endpoint that stands out, with its failure ratio over
// the window that showed it.
type candidate struct {
	ep    *endpoint
	ratio float64
}

// appendOutliers appends to cands the endpoints whose failures stand out
// from the others', and sorts cands by failure ratio, highest first (in
// eps order among equals).
func (w *windows) appendOutliers(cands []candidate, cfg Config, eps []*endpoint) []candidate {
	// The significance level is shared among the windows.
	level := alpha / float64(len(w.ladder))
	for i, ep := range eps {
		if w.sums[i] == nil {
			continue
		}
		if ratio, ok := w.outlierRatio(i, cfg, level); ok {
			cands = append(cands, candidate{ep, ratio})
		}
	}
	slices.SortStableFunc(cands, func(a, b candidate) int {
		switch {
		case a.ratio > b.ratio:
			return -1
		case a.ratio < b.ratio:
			return 1
		}
		return 0
	})
	return cands
}

// outlierRatio reports whether the i-th endpoint stands out, and its
// failure ratio if so. It is judged on the most recent window with enough
// requests; older, longer windows may only add evidence for what the
// recent one shows.
func (w *windows) outlierRatio(i int, cfg Config, level float64) (ratio float64, out bool) {
	for li := range w.ladder {
		own, all := w.sums[i][li], w.total[li]
		ni := int(own.ok) + int(own.fail)
		fr, nr := int(all.fail)-int(own.fail), int(all.ok)+int(all.fail)-ni
		if ni < cfg.MinRequests || nr < cfg.MinRequests {
			continue
		}
		if !standsOut(int(own.fail), ni, fr, nr, cfg.FailureRatio) {
			return 0, false
		}
		if fisherTail(int(own.fail), ni, int(all.fail), ni+nr, level) <= level {
			return float64(own.fail) / float64(ni), true
		}
	}
	return 0, false
}

// ejectOutliers ejects the candidates in order, at most room of them, and
// never the last connected endpoint. It returns changed with those it
// ejected appended, and how many. b.mu is held.
func (b *outlierBalancer) ejectOutliers(now time.Time, eps []*endpoint, ready map[*endpoint]bool, cands []candidate, room int, changed []*endpoint) ([]*endpoint, int) {
	n := 0
	for _, c := range cands {
		if n >= room {
			break
		}
		if !othersConnected(c.ep, eps, ready) {
			continue
		}
		b.eject(c.ep, now)
		changed = append(changed, c.ep)
		n++
	}
	return changed, n
}

// othersConnected reports whether an endpoint other than ep is connected
// and not ejected.
func othersConnected(ep *endpoint, eps []*endpoint, ready map[*endpoint]bool) bool {
	for _, o := range eps {
		if o != ep && !o.ejected.Load() && ready[o] {
			return true
		}
	}
	return false
}

// ejectionTime is how long the times-th ejection in a row lasts.
func ejectionTime(cfg Config, times int) time.Duration {
	limit := max(cfg.BaseEjectionTime, cfg.MaxEjectionTime)
	if times <= 0 {
		return cfg.BaseEjectionTime
	}
	if cfg.BaseEjectionTime > 0 && time.Duration(times) > limit/cfg.BaseEjectionTime {
		return limit
	}
	return min(cfg.BaseEjectionTime*time.Duration(times), limit)
}

// eject marks ep ejected. b.mu is held.
func (b *outlierBalancer) eject(ep *endpoint, now time.Time) {
	ep.ejected.Store(true)
	ep.times++
	ep.ejections++
	ep.ejectedAt, ep.since = now, now
	ep.win.Reset()
}

// uneject returns ep, with fresh counters. b.mu is held.
func (b *outlierBalancer) uneject(ep *endpoint, now time.Time) {
	ep.ejected.Store(false)
	ep.since = now
	ep.win.Reset()
	ep.ok.Store(0)
	ep.fail.Store(0)
}

// standsOut reports whether an endpoint with fi failures of ni requests
// looks like an outlier beside the others' fr failures of nr: its ratio is
// at least ratio, and at least minGap above theirs. Whether that is more
// than chance is fisherTail's to say.
func standsOut(fi, ni, fr, nr int, ratio float64) bool {
	if ni <= 0 || nr <= 0 {
		return false
	}
	ri, rr := float64(fi)/float64(ni), float64(fr)/float64(nr)
	const eps = 1e-9 // 1.0 - 0.8 is 0.19999999999999996
	return ri >= ratio && ri-rr >= minGap-eps
}

// fisherTail returns P(X ≥ x) for X hypergeometric: x of the n requests of
// one endpoint are among the k failures of all N requests, were the
// failures spread at random (a one-sided Fisher exact test). It stops
// summing once the sum exceeds level (the answer is then "more than
// level"), so its cost is small either way.
func fisherTail(x, n, k, N int, level float64) float64 {
	if x <= 0 {
		return 1
	}
	if x > n || x > k || n > N || k > N {
		return 0
	}
	// log C(k, i) + log C(N-k, n-i) - log C(N, n), for i = x, x+1, ...
	base := -lchoose(N, n)
	sum := 0.0
	for i := x; i <= min(k, n); i++ {
		if n-i > N-k {
			continue
		}
		term := math.Exp(lchoose(k, i) + lchoose(N-k, n-i) + base)
		sum += term
		if sum > level {
			return sum
		}
		if term < sum*1e-12 {
			break
		}
	}
	return sum
}

// lchoose returns log C(n, k).
func lchoose(n, k int) float64 {
	a, _ := math.Lgamma(float64(n) + 1)
	b, _ := math.Lgamma(float64(k) + 1)
	c, _ := math.Lgamma(float64(n-k) + 1)
	return a - b - c
}

// enforceCapsLocked un-ejects endpoints, most recently ejected first, while
// more are ejected than the caps allow for the current endpoint set (after
// a resolver update). b.mu is held.
func (b *outlierBalancer) enforceCapsLocked(cfg Config) []*endpoint {
	eps := b.eps.Values()
	var ejected []*endpoint
	for _, ep := range eps {
		if ep.ejected.Load() {
			ejected = append(ejected, ep)
		}
	}
	maxEjected := maxEjections(len(eps), cfg)
	if len(ejected) <= maxEjected {
		return nil
	}
	slices.SortFunc(ejected, func(a, b *endpoint) int { return b.ejectedAt.Compare(a.ejectedAt) })
	now := b.clk.Now()
	out := ejected[:len(ejected)-maxEjected]
	for _, ep := range out {
		b.uneject(ep, now)
	}
	return out
}

// maxEjections is how many of n endpoints may be ejected at once: the
// percentage of cfg, at least one when n ≥ 2, never all.
func maxEjections(n int, cfg Config) int {
	if n < 2 {
		return 0
	}
	return min(max(1, n*cfg.MaxEjectionPercent/100), n-1)
}
