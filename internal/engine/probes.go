package engine

import (
	"sync/atomic"
	"time"
)

// Probes is a route's state for the tries of retry loops outside the
// client (a client library's own retries, a loop in the caller's code)
// that its budget or breaker refuses: the route is locked when they are
// refused while the target has served nothing lately, and then lets one
// through now and then as a probe that nobody pays for (see probeDue),
// until a call of the route succeeds (Heal). The zero value is unlocked
// and has never healed; it is safe for concurrent use.
type Probes struct {
	locked  atomic.Int64 // when (UnixNano, the client's clock) it was locked; 0: it is not
	last    atomic.Int64 // when the last probe was sent (or the lock began)
	refused atomic.Int64 // tries refused since then
	seen    atomic.Int64 // when an attempt of the route last failed while it was locked
	healed  atomic.Int64 // when the last lock ended: the calls remembered until then are forgotten
}

// A locked route sends a probe every probeEvery while the tries it
// refuses arrive at probeRate a second or more, every probeSparse
// otherwise (see probeDue).
const (
	probeEvery  = 500 * time.Millisecond
	probeRate   = 10
	probeSparse = 4 * time.Second
)

// probeDue reports whether a try that came back, refused at now, is sent
// as a probe. A route that is not locked is locked now if its target has
// not served lately (served false). A locked route sends a probe
// probeEvery after the last, while the tries it refuses arrive at
// probeRate a second or more (workers stuck in a library's loop, a
// poller: a probe costs them at most a fifth of what they would send),
// and probeSparse after it otherwise (a quiet client: the longest a
// breaker waits before its half-open probe). No probe is sent within that
// time of another attempt's failure (a new call's first attempt): the
// client knows, without one, that the target still fails.
func (g *Probes) probeDue(now time.Time, served bool) bool {
	n := now.UnixNano()
	if g.locked.Load() == 0 {
		if !served && g.locked.CompareAndSwap(0, n) {
			g.last.Store(n)
			g.refused.Store(0)
		}
		return false
	}
	refused := g.refused.Add(1)
	last := g.last.Load()
	elapsed := time.Duration(n - last)
	wait := probeEvery
	if float64(refused) < probeRate*elapsed.Seconds() {
		wait = probeSparse
	}
	if elapsed < wait || time.Duration(n-g.seen.Load()) < wait {
		return false
	}
	if !g.last.CompareAndSwap(last, n) {
		return false // another try is the probe
	}
	g.refused.Store(0)
	return true
}

// failed notes that an attempt of the route failed at now.
func (g *Probes) failed(now time.Time) {
	if g.locked.Load() != 0 {
		g.seen.Store(now.UnixNano())
	}
}

// Lock locks the route at now, as a try refused while its target has not
// served lately does (see probeDue), if it is not locked: for tests that
// drive a route's lock without refusing tries.
func (g *Probes) Lock(now time.Time) { g.probeDue(now, false) }

// Locked reports whether the route is locked: one atomic load.
func (g *Probes) Locked() bool { return g.locked.Load() != 0 }

// Heal ends the route's lock, if any: a call of it succeeded at now, so
// its target serves. The calls remembered until now no longer come back
// (see Healed): the next try of each is a call of its own.
func (g *Probes) Heal(now time.Time) {
	if g.locked.Swap(0) != 0 {
		g.healed.Store(now.UnixNano())
	}
}

// Healed returns when (UnixNano) the route's last lock ended; 0: never. A
// try remembered until then no longer comes back.
func (g *Probes) Healed() int64 { return g.healed.Load() }
