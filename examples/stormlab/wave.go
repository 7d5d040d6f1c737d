package main

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/examples/internal/fleetsim"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
)

// callTimeout bounds every call the lab makes, but the chain's.
const callTimeout = 10 * time.Second

// chainTimeout bounds the chain's calls. The chain's counts are the model's
// only while no call runs out of time, and without a budget a call at depth
// 4 makes 120 RPCs one after the other (3 + 9 + 27 + 81), with backoffs
// between: under the race detector, with two CPU-bound processes beside
// it, the slowest took more than 10 s, and the rows lost a tenth of their
// requests to the deadline.
const chainTimeout = time.Minute

// outcome is what the callers of one row saw.
type outcome struct {
	calls   int
	ok      int
	errors  map[string]int
	refused map[string]int
	lat     []time.Duration // sorted
}

// record adds one call's result.
func (o *outcome) record(err error, d time.Duration) {
	o.calls++
	o.lat = append(o.lat, d)
	if err == nil {
		o.ok++
		return
	}
	if o.errors == nil {
		o.errors = map[string]int{}
	}
	o.errors[status.Code(err).String()]++
	if r := interceptor.RefusedBy(err); r != "" {
		if o.refused == nil {
			o.refused = map[string]int{}
		}
		o.refused[string(r)]++
	}
}

// quantile returns the q-quantile of the latencies (nearest rank).
func (o *outcome) quantile(q float64) time.Duration {
	if len(o.lat) == 0 {
		return 0
	}
	i := int(q * float64(len(o.lat)))
	return o.lat[min(i, len(o.lat)-1)]
}

// row fills a table row from the outcome and the origin's count.
func (o *outcome) row(p policy, seen int) Row {
	slices.Sort(o.lat)
	r := Row{
		Policy: p.key, Label: p.name, Calls: o.calls, Origin: seen,
		OK: o.ok, Errors: o.errors, Refused: o.refused,
		P50ms: millis(o.quantile(0.50)), P99ms: millis(o.quantile(0.99)), P999ms: millis(o.quantile(0.999)),
	}
	if len(o.lat) > 0 {
		r.MaxMs = millis(o.lat[len(o.lat)-1])
	}
	if o.calls > 0 {
		r.Amplification = float64(seen) / float64(o.calls)
	}
	r.Chart = r.Amplification
	return r
}

// wave makes n calls at once, call(ctx, i) for i in [0, n), each with its
// own timeout, and returns what they saw.
func wave(ctx context.Context, n int, timeout time.Duration, call func(ctx context.Context, i int) error) *outcome {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		out   outcome
		start = make(chan struct{})
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			cctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			t := time.Now()
			err := call(cctx, i)
			d := time.Since(t)
			mu.Lock()
			out.record(err, d)
			mu.Unlock()
		}()
	}
	close(start)
	wg.Wait()
	return &out
}

// pool makes calls calls from workers concurrent workers, each call with
// its own timeout, and returns what they saw.
func pool(ctx context.Context, calls, workers int, timeout time.Duration, call func(context.Context, int) error) *outcome {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		out  outcome
		next atomic.Int64
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= calls || ctx.Err() != nil {
					return
				}
				cctx, cancel := context.WithTimeout(ctx, timeout)
				t := time.Now()
				err := call(cctx, i)
				d := time.Since(t)
				cancel()
				mu.Lock()
				out.record(err, d)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return &out
}

// inStepWait bounds how long inStep holds a first attempt.
const inStepWait = 2 * time.Second

// inStep holds the first attempt of each request until n first attempts
// have arrived (or inStepWait has passed), then answers as s says. So every
// caller's first attempt is in flight before any answer comes back, as in
// the articles' waves, whatever the order the goroutines ran in: the
// counts then depend only on the policies, not on scheduling.
func inStep(n int, s origin.Script) origin.Script {
	var arrived atomic.Int64
	all := make(chan struct{})
	return func(c origin.Call) origin.Reply {
		if c.Attempt == 1 {
			if arrived.Add(1) == int64(n) {
				close(all)
			}
			t := time.NewTimer(inStepWait)
			defer t.Stop()
			select {
			case <-all:
			case <-t.C:
			}
		}
		return s(c)
	}
}

// uniform returns a number in [0, 1) fixed by the seed, the request id and
// the attempt: the lab's seeded random choice, the same in every run and
// whatever order the attempts arrive in. It is the fleet simulator's
// (fleetsim.LabUniform), so that the simulator's cells shared with the lab
// fail the same attempts of the same calls.
func uniform(seed uint64, id string, attempt int) float64 {
	return fleetsim.LabUniform(seed, id, attempt)
}

// failWithProbability fails each attempt with Unavailable with probability
// p, chosen by uniform.
func failWithProbability(seed uint64, p float64) origin.Script {
	return func(c origin.Call) origin.Reply {
		if uniform(seed, c.RequestID, c.Attempt) < p {
			return origin.Reply{Code: codes.Unavailable, Message: "origin: unlucky attempt"}
		}
		return origin.Reply{}
	}
}
