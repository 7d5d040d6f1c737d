package fleetsim

import "math"

// The kinds of event.
const (
	evArrive   uint8 = iota // a closed-loop worker's next call is due: idx = client
	evSend                  // a retry is due: idx = call
	evReply                 // an attempt's reply reaches its client: idx = call
	evDone                  // a worker finished a request: idx = call, aux = backend
	evDeadline              // a call's deadline: idx = call
)

// event is one thing due at a virtual time. Events at the same time run
// in the order they were scheduled (seq).
type event struct {
	at   int64
	seq  uint64
	idx  int32
	gen  uint32
	aux  int32
	kind uint8
}

func (a *event) before(b *event) bool {
	return a.at < b.at || (a.at == b.at && a.seq < b.seq)
}

// queue is a binary min-heap of events.
type queue struct {
	ev  []event
	seq uint64
}

func (q *queue) push(e event) {
	q.seq++
	e.seq = q.seq
	q.ev = append(q.ev, e)
	i := len(q.ev) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !q.ev[i].before(&q.ev[p]) {
			break
		}
		q.ev[i], q.ev[p] = q.ev[p], q.ev[i]
		i = p
	}
}

func (q *queue) pop() event {
	top := q.ev[0]
	n := len(q.ev) - 1
	q.ev[0] = q.ev[n]
	q.ev = q.ev[:n]
	i := 0
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && q.ev[r].before(&q.ev[l]) {
			m = r
		}
		if !q.ev[m].before(&q.ev[i]) {
			break
		}
		q.ev[i], q.ev[m] = q.ev[m], q.ev[i]
		i = m
	}
	return top
}

// top returns when the next event is due (MaxInt64: none).
func (q *queue) top() int64 {
	if len(q.ev) == 0 {
		return math.MaxInt64
	}
	return q.ev[0].at
}
