package main

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// queueOrigin is an EchoService with a fixed capacity, as a real service
// with a worker pool has: Put requests wait in a FIFO queue for one of
// workers goroutines, each of which works service time per request. A full
// queue answers UNAVAILABLE at once. The handler does not watch its
// context: a queued request is worked even after its caller has left, as a
// handler that hands work to a pool and waits for it does.
//
// A worker schedules its requests on an absolute time line: a request's
// service starts when it was queued or when the worker's previous request
// ended, whichever is later, so that the origin's throughput is exactly
// workers ÷ service time however late the Go timer wakes a worker.
type queueOrigin struct {
	echov1.UnimplementedEchoServiceServer
	jobs    chan *queueJob
	service atomic.Int64 // ns per request
	stop    chan struct{}
	wg      sync.WaitGroup
	once    sync.Once

	arrived atomic.Int64 // Put requests that reached the handler
	full    atomic.Int64 // answered UNAVAILABLE: queue full
	worked  atomic.Int64 // requests worked
	wasted  atomic.Int64 // ... of which after their caller had left
}

type queueJob struct {
	ctx    context.Context
	queued time.Time
	done   chan struct{}
}

// newQueueOrigin starts workers workers behind a queue of queueLen.
func newQueueOrigin(workers, queueLen int, service time.Duration) *queueOrigin {
	o := &queueOrigin{jobs: make(chan *queueJob, queueLen), stop: make(chan struct{})}
	o.service.Store(int64(service))
	for range workers {
		o.wg.Add(1)
		go o.work()
	}
	return o
}

// setService changes the service time of the requests that start from now
// on.
func (o *queueOrigin) setService(d time.Duration) { o.service.Store(int64(d)) }

func (o *queueOrigin) work() {
	defer o.wg.Done()
	var busyUntil time.Time
	for {
		select {
		case j := <-o.jobs:
			// Service starts when the request and the worker are both
			// there: at the end of the previous request if this one was
			// already waiting, whenever the worker actually woke up.
			end := j.queued
			if busyUntil.After(end) {
				end = busyUntil
			}
			end = end.Add(time.Duration(o.service.Load()))
			if d := time.Until(end); d > 0 {
				t := time.NewTimer(d)
				select {
				case <-t.C:
				case <-o.stop:
					t.Stop()
					return // the handler answers "stopped"
				}
			}
			busyUntil = end
			o.worked.Add(1)
			if j.ctx.Err() != nil {
				o.wasted.Add(1)
			}
			close(j.done)
		case <-o.stop:
			return
		}
	}
}

// close stops the workers and releases every handler still waiting (they
// answer UNAVAILABLE). A second close does nothing.
func (o *queueOrigin) close() {
	o.once.Do(func() { close(o.stop) })
	o.wg.Wait()
}

// Register registers o as the EchoService of s.
func (o *queueOrigin) Register(s grpc.ServiceRegistrar) { echov1.RegisterEchoServiceServer(s, o) }

var errStopped = status.Error(codes.Unavailable, "origin: stopped")

// Put queues the request and waits for a worker to finish it, whatever
// happens to its context.
func (o *queueOrigin) Put(ctx context.Context, req *echov1.PutRequest) (*echov1.PutResponse, error) {
	o.arrived.Add(1)
	j := &queueJob{ctx: ctx, queued: time.Now(), done: make(chan struct{})}
	select {
	case <-o.stop:
		return nil, errStopped
	case o.jobs <- j:
	default:
		o.full.Add(1)
		return nil, status.Error(codes.Unavailable, "origin: queue full")
	}
	select {
	case <-j.done:
	case <-o.stop: // the lab is shutting the origin down; not the caller's context
		return nil, errStopped
	}
	return &echov1.PutResponse{RequestId: req.GetRequestId()}, nil
}
