package overload

import (
	"context"
	"testing"
	"time"
)

// poolModel is a method served by a pool of workers behind a FIFO queue,
// whose handler does not watch its context: an admitted request is worked
// in its turn, however late, and reported Done when its work ends, as the
// server interceptor reports a handler that returned a response. It runs
// on explicit time, one millisecond at a time.
type poolModel struct {
	m       *Method // nil: no protection, every request is queued
	busy    []modelReq
	queue   []modelReq // in the handler's queue
	waiting []modelReq // in the Guard's (Queued)
	arrived int
	refused int
	left    int // waited, and left at their deadline
	worked  int // requests whose work ended
	wasted  int // ... after their caller's deadline
	ok      int // ... in time
}

type modelReq struct {
	tk       Ticket
	deadline time.Time
	end      time.Time // when its work ends; zero while queued
}

// poolShape is a load on a pool: workers working service per request
// (slow from the trigger's start to its end), rate requests a second each
// with deadline, for length.
type poolShape struct {
	workers       int
	service, slow time.Duration
	from, to      time.Duration // the trigger, from the start
	rate          int
	deadline      time.Duration
	length        time.Duration
}

// run runs the shape from start and returns the model.
func (s poolShape) run(start time.Time, m *Method) *poolModel {
	p := &poolModel{m: m, busy: make([]modelReq, s.workers)}
	interval := time.Second / time.Duration(s.rate)
	next := time.Duration(0)
	for at := time.Duration(0); at < s.length+s.deadline; at += time.Millisecond {
		now := start.Add(at)
		for i := range p.busy { // work that ends now
			if r := p.busy[i]; !r.end.IsZero() && !r.end.After(now) {
				p.ended(r)
				p.busy[i] = modelReq{}
			}
		}
		p.waited(now)
		for ; next <= at && next < s.length; next += interval { // arrivals
			p.arrive(now, now.Add(s.deadline))
		}
		service := s.service
		if at >= s.from && at < s.to {
			service = s.slow
		}
		for i := range p.busy { // idle workers take the oldest request
			if p.busy[i].end.IsZero() && len(p.queue) > 0 {
				r := p.queue[0]
				p.queue = p.queue[1:]
				r.end = now.Add(service)
				p.busy[i] = r
			}
		}
	}
	return p
}

func (p *poolModel) arrive(now, deadline time.Time) {
	p.arrived++
	r := modelReq{deadline: deadline}
	if p.m != nil {
		tk, d := p.m.AdmitAt(now, Request{Deadline: deadline})
		switch d.Reason {
		case Admitted:
		case Queued:
			p.waiting = append(p.waiting, modelReq{tk: tk, deadline: deadline})
			return
		default:
			p.refused++
			return
		}
		r.tk = tk
	}
	p.queue = append(p.queue, r)
}

// waited hands the waiting requests that the Guard decided to the
// handler's queue, in order, and takes those whose deadline passed out of
// the Guard's queue: their callers leave.
func (p *poolModel) waited(now time.Time) {
	k := 0
	for _, r := range p.waiting {
		ctx := context.Background()
		if !r.tk.Ready() {
			if now.Before(r.deadline) {
				p.waiting[k] = r
				k++
				continue
			}
			ctx = gone // its caller leaves
		}
		d, err := r.tk.Wait(ctx)
		switch {
		case err != nil:
			p.left++
		case d.Reason == Admitted:
			p.queue = append(p.queue, r)
		default:
			p.refused++
		}
	}
	p.waiting = p.waiting[:k]
}

func (p *poolModel) ended(r modelReq) {
	p.worked++
	if r.end.After(r.deadline) {
		p.wasted++
	} else {
		p.ok++
	}
	r.tk.DoneAt(r.end)
}

func (p *poolModel) wasteShare() float64 { return float64(p.wasted) / float64(max(p.worked, 1)) }

// TestAdmissionWastesLittle: a pool whose handler does not watch its
// context, overloaded (twice its capacity for 6 s; a capacity drop to a
// third for 2 s; a drop to half for 10 s, and for 1 s with deadlines of
// ten service times), its callers' deadlines known:
// the work done for callers who had already left is at most 5% of the
// work done, and at least as many requests succeed as without the
// protection.
func TestAdmissionWastesLittle(t *testing.T) {
	for _, c := range []struct {
		name string
		s    poolShape
	}{
		{"twice the capacity", poolShape{workers: 4, service: 40 * time.Millisecond, rate: 200, deadline: time.Second, length: 6 * time.Second}},
		{"a third for 2s", poolShape{workers: 4, service: 20 * time.Millisecond, slow: 64 * time.Millisecond,
			from: 2 * time.Second, to: 4 * time.Second, rate: 140, deadline: time.Second, length: 10 * time.Second}},
		{"half for 10s", poolShape{workers: 4, service: 20 * time.Millisecond, slow: 40 * time.Millisecond,
			from: 2 * time.Second, to: 12 * time.Second, rate: 180, deadline: 250 * time.Millisecond, length: 16 * time.Second}},
		{"half for 1s, 200ms deadlines", poolShape{workers: 4, service: 20 * time.Millisecond, slow: 40 * time.Millisecond,
			from: 2 * time.Second, to: 3 * time.Second, rate: 180, deadline: 200 * time.Millisecond, length: 6 * time.Second}},
	} {
		t.Run(c.name, func(t *testing.T) {
			clk := newClock()
			bare := c.s.run(clk.Now(), nil)
			got := c.s.run(clk.Now(), New(Config{}).Method("/svc/M"))
			t.Logf("unprotected: %d ok, %d worked, %d wasted (%.1f%%); protected: %d ok, %d worked, %d wasted (%.1f%%), %d refused or left",
				bare.ok, bare.worked, bare.wasted, 100*bare.wasteShare(), got.ok, got.worked, got.wasted, 100*got.wasteShare(), got.refused+got.left)
			if got.wasteShare() > 0.05 {
				t.Errorf("wasted %d of %d worked (%.1f%%), want at most 5%%", got.wasted, got.worked, 100*got.wasteShare())
			}
			if got.ok < bare.ok {
				t.Errorf("%d ok, fewer than the %d without protection", got.ok, bare.ok)
			}
		})
	}
}
