package overload

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// gate is where the first attempts of a method wait for a place under its
// engaged adaptive limit (see Method.AdmitAt), in order of
// arrival, critical ones ahead of the others: a queue the server holds,
// not its handler, so that a request whose caller leaves is not worked,
// and one that can no longer end in time is refused instead of started.
// A waiting request holds no place in flight.
type gate struct {
	mu    sync.Mutex
	lists [2]waitList  // 0: default, 1: critical
	n     atomic.Int64 // waiting requests, both lists
	ncrit atomic.Int64 // ... of which critical
}

// waitList is a FIFO of waiting requests, linked through the waiters.
type waitList struct{ head, tail *waiter }

// waiter is one waiting request. Its decision is written once, under the
// gate's lock, before done is closed.
type waiter struct {
	prev, next *waiter
	due        int64 // ns on the Guard's time line: its deadline
	critical   bool
	listed     bool // in its list; under the gate's lock
	done       chan struct{}
	d          Decision
	at         int64 // ns: when it was decided
}

func (l *waitList) push(w *waiter) {
	w.prev, w.next = l.tail, nil
	if l.tail != nil {
		l.tail.next = w
	} else {
		l.head = w
	}
	l.tail = w
	w.listed = true
}

func (l *waitList) remove(w *waiter) {
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		l.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		l.tail = w.prev
	}
	w.prev, w.next, w.listed = nil, nil, false
}

// wait queues a request of m arriving at t with its deadline due.
func (m *Method) wait(t, due int64, critical bool) Ticket {
	w := &waiter{due: due, critical: critical, done: make(chan struct{})}
	m.g.waited.Add(1)
	m.gate.mu.Lock()
	m.gate.lists[boolIndex(critical)].push(w)
	m.gate.count(w, 1)
	m.gate.mu.Unlock()
	m.dispatch(t) // a place may be free: the limit may have grown
	return Ticket{m: m, start: t, due: int64(none), critical: critical, w: w}
}

func boolIndex(b bool) int {
	if b {
		return 1
	}
	return 0
}

// dispatch gives the places free under m's limit at t to the waiting
// requests, critical ones first, each in its order of arrival: a critical
// request while the critical requests in flight are fewer than the limit,
// another while all of them are. A request that can no longer end by its
// deadline (its deadline has passed, or what the method needs now, see
// placeNeed, is more than it has left) is refused instead, without a
// place. Once no limit is engaged,
// every waiting request is decided.
func (m *Method) dispatch(t int64) {
	if m.gate.n.Load() == 0 {
		return
	}
	m.gate.mu.Lock()
	defer m.gate.mu.Unlock()
	for {
		limit := m.lim.limit.Load()
		var w *waiter
		switch {
		case m.gate.lists[1].head != nil && m.critical.Load() < limit:
			w = m.gate.lists[1].head
		case m.gate.lists[0].head != nil && m.inflight.Load() < limit:
			w = m.gate.lists[0].head
		default:
			return
		}
		m.gate.lists[boolIndex(w.critical)].remove(w)
		m.gate.count(w, -1)
		w.at = t
		if need, ok := m.placeNeed(t); w.due <= t || (ok && w.due-t < int64(need)) {
			if m.lim.meetable(w.due-t, &m.g.s) {
				m.lim.miss()
			}
			m.g.refusedDeadline.Add(1)
			w.d = Decision{Reason: RefusedDeadline, Need: need, RetryAfter: DoNotRetry}
		} else {
			n := m.inflight.Add(1)
			if w.critical {
				m.critical.Add(1)
			}
			m.lim.arrived(n, w.due-t, true)
			m.g.admitted.Add(1)
		}
		close(w.done)
	}
}

// placeNeed is what a request given a place at t needs: the requests in
// flight, which the limit keeps the method busy with, and it end at the
// rate requests ended lately (see queueNeed). false: not enough history.
func (m *Method) placeNeed(t int64) (time.Duration, bool) {
	if _, ok := m.needAt(t, 0); !ok {
		return 0, false
	}
	return m.queueNeed(m.inflight.Load()), true
}

// leave takes w out of its list if it is still waiting, and reports
// whether it was.
func (m *Method) leave(w *waiter) bool {
	m.gate.mu.Lock()
	defer m.gate.mu.Unlock()
	if !w.listed {
		return false
	}
	m.gate.lists[boolIndex(w.critical)].remove(w)
	m.gate.count(w, -1)
	return true
}

// count adds d to the gate's counts of waiting requests of w's class.
func (g *gate) count(w *waiter, d int64) {
	g.n.Add(d)
	if w.critical {
		g.ncrit.Add(d)
	}
}

// queues reports whether a first attempt of m with a deadline that
// admission let through waits for a place: an adaptive limit is engaged,
// and its class's place is taken (a critical request: the critical
// requests in flight fill the limit; another: all of them do) or others
// of its class, or ahead of it, wait.
func (m *Method) queues(critical bool) bool {
	limit := m.lim.limit.Load()
	if limit == unlimited {
		return false
	}
	if critical {
		return m.gate.ncrit.Load() > 0 || m.critical.Load() >= limit
	}
	return m.gate.n.Load() > 0 || m.inflight.Load() >= limit
}

// releaseGlobal gives back the place under MaxConcurrency that a waiting
// request took before it waited (see limits), when it will not run.
func (t *Ticket) releaseGlobal() {
	if !t.global {
		return
	}
	t.m.g.inflight.Add(-1)
	if t.critical {
		t.m.g.critical.Add(-1)
	}
	t.global = false
}

// Waiting returns the requests of m that wait for a place.
func (m *Method) Waiting() int64 { return m.gate.n.Load() }

// Ready reports whether a request admitted with Decision.Reason Queued has
// been decided (Wait then returns at once), or was not queued.
func (t *Ticket) Ready() bool {
	if t.w == nil {
		return true
	}
	select {
	case <-t.w.done:
		return true
	default:
		return false
	}
}

// Wait waits, for a request whose Decision was Queued, until it is given
// a place or refused, or ctx is done (its caller left), and returns the
// decision: Admitted, the request runs now and reports its end on t as
// any admitted request does; RefusedDeadline, it could no longer end by
// its deadline, and is not run. When ctx is done first, Wait returns its
// error: the request leaves the queue, is not run, and t ignores reports;
// a place it had been given at that instant is freed. For a request
// admitted at once, Wait returns the zero Decision (admitted) at once.
func (t *Ticket) Wait(ctx context.Context) (Decision, error) {
	w := t.w
	if w == nil {
		return Decision{}, nil
	}
	select {
	case <-w.done:
	case <-ctx.Done():
		if t.leave(errors.Is(ctx.Err(), context.DeadlineExceeded)) {
			return Decision{}, ctx.Err()
		}
		<-w.done // decided meanwhile
	}
	d := t.decided()
	if err := ctx.Err(); err != nil && d.Reason == Admitted {
		t.gone(t.m.g.clock())
		return Decision{}, err
	}
	return d, nil
}

// WaitAt is Wait at time now for a caller that drives the Guard on its
// own clock (a simulator) and leaves at the request's deadline: it never
// blocks. A request decided by now gets its decision, as from Wait. One
// that still waits gets Queued and keeps its place in the queue (ask again
// once the method reports an end: a place may have freed then), unless
// its deadline has passed at now: then it leaves, as Wait does when its
// context's deadline passes, and WaitAt returns
// context.DeadlineExceeded; so does a request given a place whose
// deadline has passed at now, and the place is freed. For a request
// admitted at once, WaitAt returns the zero Decision (admitted) at once.
func (t *Ticket) WaitAt(now time.Time) (Decision, error) {
	w := t.w
	if w == nil {
		return Decision{}, nil
	}
	at := t.m.g.at(now)
	late := at >= w.due
	if !t.Ready() {
		if !late {
			return Decision{Reason: Queued}, nil
		}
		if t.leave(true) {
			return Decision{}, context.DeadlineExceeded
		}
		<-w.done // decided meanwhile
	}
	d := t.decided()
	if late && d.Reason == Admitted {
		t.gone(at)
		return Decision{}, context.DeadlineExceeded
	}
	return d, nil
}

// leave takes the waiting request out of the queue, its caller gone (at
// its deadline, when deadline says so), and reports whether it was still
// waiting; if it was, t ignores reports from then on.
func (t *Ticket) leave(deadline bool) bool {
	w := t.w
	if !t.m.leave(w) {
		return false
	}
	t.m.g.left.Add(1)
	t.releaseGlobal()
	if deadline && t.m.lim.meetable(w.due-t.start, &t.m.g.s) {
		t.m.lim.miss() // its caller missed a deadline the method meets when not overloaded
	}
	*t = Ticket{}
	return true
}

// decided returns the decision made on the request that waited: a
// refusal's Ticket ignores reports; an admitted one's runs from when it
// was given its place.
func (t *Ticket) decided() Decision {
	w := t.w
	t.w = nil
	if w.d.Reason != Admitted {
		t.releaseGlobal()
		*t = Ticket{}
		return w.d
	}
	t.start = w.at
	t.due = t.m.dueOf(w.at, w.due-w.at)
	return Decision{}
}

// gone frees, at at (ns on the Guard's time line), the place given to a
// request whose caller had left when it learned of it: nothing ran.
func (t *Ticket) gone(at int64) {
	t.m.g.left.Add(1)
	t.discard(at)
	*t = Ticket{}
}
