package outlier

import (
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// decideBefore is decide as it was before it was split (commit 2c9f5c3),
// kept to check that the split one decides the same.
func (b *outlierBalancer) decideBefore(now time.Time, cfg Config, eps []*endpoint) (changed []*endpoint, active bool) {
	ready := make(map[*endpoint]bool, len(eps))
	for sc := range b.subs {
		if ep := sc.ep.Load(); ep != nil && sc.ready.Load() {
			ready[ep] = true
		}
	}
	ejected, readyIn := 0, 0
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
	for _, ep := range eps {
		if !ep.ejected.Load() && ep.times > 0 {
			if k := int(now.Sub(ep.since) / cfg.BaseEjectionTime); k > 0 {
				ep.times = max(0, ep.times-k)
				ep.since = ep.since.Add(time.Duration(k) * cfg.BaseEjectionTime)
			}
		}
	}

	// The windows to compare over: the last 1, 2, 4, ... buckets, then all.
	nb := 0
	if len(eps) > 0 {
		nb = len(eps[0].buckets)
	}
	var ladder []int
	for w := 1; w < nb; w *= 2 {
		ladder = append(ladder, w)
	}
	ladder = append(ladder, nb)
	sums := make([][]counts, len(eps))
	total := make([]counts, len(ladder))
	for i, ep := range eps {
		if ep.ejected.Load() {
			continue
		}
		sums[i] = make([]counts, len(ladder))
		var acc counts
		li := 0
		for w := 1; w <= nb && li < len(ladder); w++ {
			c := ep.buckets[((b.head-w+1)%nb+nb)%nb]
			acc.ok, acc.fail = satAdd(acc.ok, c.ok), satAdd(acc.fail, c.fail)
			if w == ladder[li] {
				sums[i][li] = acc
				total[li].ok, total[li].fail = satAdd(total[li].ok, acc.ok), satAdd(total[li].fail, acc.fail)
				li++
			}
		}
	}
	active = ejected > 0 || (nb > 0 && total[len(ladder)-1] != counts{})

	maxEjected := maxEjections(len(eps), cfg)
	if ejected >= maxEjected {
		return changed, active
	}
	type candidate struct {
		ep    *endpoint
		ratio float64
	}
	var cands []candidate
	// Each endpoint is judged on the most recent window with enough
	// requests; older, longer windows may only add evidence for what the
	// recent one shows. The significance level is shared among the windows.
	level := alpha / float64(len(ladder))
	for i, ep := range eps {
		if sums[i] == nil {
			continue
		}
		for li := range ladder {
			own := sums[i][li]
			ni := int(own.ok) + int(own.fail)
			fr, nr := int(total[li].fail)-int(own.fail), int(total[li].ok)+int(total[li].fail)-ni
			if ni < cfg.MinRequests || nr < cfg.MinRequests {
				continue
			}
			if !standsOut(int(own.fail), ni, fr, nr, cfg.FailureRatio) {
				break
			}
			if fisherTail(int(own.fail), ni, int(total[li].fail), ni+nr, level) <= level {
				cands = append(cands, candidate{ep, float64(own.fail) / float64(ni)})
				break
			}
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
	for _, c := range cands {
		if ejected >= maxEjected {
			break
		}
		// Never eject the last connected endpoint.
		others := 0
		for _, ep := range eps {
			if ep != c.ep && !ep.ejected.Load() && ready[ep] {
				others++
			}
		}
		if others == 0 {
			continue
		}
		b.eject(c.ep, now)
		changed = append(changed, c.ep)
		ejected++
		active = true
	}
	return changed, active
}

// decideState draws a balancer state for decide: up to 8 endpoints with
// random buckets (some failing much more than the others), ejections,
// multipliers and READY SubConns, and a Config with small thresholds.
func decideState(rt *rapid.T, now time.Time) (*outlierBalancer, Config, []*endpoint) {
	cfg := Config{
		MinRequests:        rapid.IntRange(1, 30).Draw(rt, "minRequests"),
		MaxEjectionPercent: rapid.IntRange(0, 100).Draw(rt, "maxEjectionPercent"),
		FailureRatio:       float64(rapid.IntRange(1, 10).Draw(rt, "ratio10")) / 10,
		BaseEjectionTime:   time.Duration(rapid.IntRange(1, 10).Draw(rt, "base")) * time.Second,
		MaxEjectionTime:    time.Duration(rapid.IntRange(0, 60).Draw(rt, "maxTime")) * time.Second,
	}.withDefaults()
	nb := rapid.IntRange(1, 20).Draw(rt, "buckets")
	b := &outlierBalancer{subs: map[*subConn]struct{}{}, head: rapid.IntRange(0, nb-1).Draw(rt, "head")}
	eps := make([]*endpoint, rapid.IntRange(0, 8).Draw(rt, "endpoints"))
	for i := range eps {
		ep := &endpoint{buckets: make([]counts, nb)}
		pFail := rapid.SampledFrom([]int{0, 5, 50, 100}).Draw(rt, "pFail")
		for j := range ep.buckets {
			n := rapid.IntRange(0, 40).Draw(rt, "n")
			f := n * pFail / 100
			ep.buckets[j] = counts{ok: uint32(n - f), fail: uint32(f)}
		}
		if rapid.Bool().Draw(rt, "ejected") {
			ep.ejected.Store(true)
			ep.ejectedAt = now.Add(-time.Duration(rapid.IntRange(0, 120).Draw(rt, "ejectedAgo")) * time.Second)
		}
		ep.times = rapid.IntRange(0, 5).Draw(rt, "times")
		ep.since = now.Add(-time.Duration(rapid.IntRange(0, 60).Draw(rt, "sinceAgo")) * time.Second)
		for range rapid.IntRange(0, 2).Draw(rt, "subConns") {
			sc := &subConn{}
			sc.ep.Store(ep)
			sc.ready.Store(rapid.Bool().Draw(rt, "ready"))
			b.subs[sc] = struct{}{}
		}
		eps[i] = ep
	}
	if rapid.Bool().Draw(rt, "unlinked") {
		b.subs[&subConn{}] = struct{}{}
	}
	return b, cfg, eps
}

// cloneState is a deep copy of a state drawn by decideState.
func cloneState(b *outlierBalancer, eps []*endpoint) (*outlierBalancer, []*endpoint) {
	c := &outlierBalancer{subs: map[*subConn]struct{}{}, head: b.head}
	m := map[*endpoint]*endpoint{}
	out := make([]*endpoint, len(eps))
	for i, ep := range eps {
		e := &endpoint{buckets: slices.Clone(ep.buckets), ejectedAt: ep.ejectedAt, times: ep.times, since: ep.since, ejections: ep.ejections}
		e.ejected.Store(ep.ejected.Load())
		m[ep], out[i] = e, e
	}
	for sc := range b.subs {
		n := &subConn{}
		if ep := sc.ep.Load(); ep != nil {
			n.ep.Store(m[ep])
		}
		n.ready.Store(sc.ready.Load())
		c.subs[n] = struct{}{}
	}
	return c, out
}

// TestDecideSplitDecidesTheSame checks that decide, split into small
// functions, returns what decideBefore returns and leaves the endpoints in
// the same state, on random states.
func TestDecideSplitDecidesTheSame(t *testing.T) {
	now := time.Unix(1e9, 0)
	rapid.Check(t, func(rt *rapid.T) {
		b1, cfg, eps1 := decideState(rt, now)
		b2, eps2 := cloneState(b1, eps1)
		ch1, act1 := b1.decideBefore(now, cfg, eps1)
		ch2, act2 := b2.decide(now, cfg, eps2)
		if act1 != act2 {
			rt.Fatalf("active: before %v, split %v", act1, act2)
		}
		idx := func(eps, ch []*endpoint) []int {
			var out []int
			for _, c := range ch {
				out = append(out, slices.Index(eps, c))
			}
			return out
		}
		if a, b := idx(eps1, ch1), idx(eps2, ch2); !slices.Equal(a, b) {
			rt.Fatalf("changed: before %v, split %v", a, b)
		}
		for i := range eps1 {
			e1, e2 := eps1[i], eps2[i]
			if e1.ejected.Load() != e2.ejected.Load() || e1.times != e2.times || !e1.since.Equal(e2.since) ||
				!e1.ejectedAt.Equal(e2.ejectedAt) || e1.ejections != e2.ejections || !slices.Equal(e1.buckets, e2.buckets) {
				rt.Fatalf("endpoint %d: before %+v, split %+v", i, e1, e2)
			}
		}
	})
}
