package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/clock"
	"github.com/stormguard/stormguard/internal/origin"
)

// Scenario 6 (from "Retry Budget" and "Implementing Retry Budgets to
// Prevent Retry Storms"): failures that are independent of load, at five
// rates.
func independentFailures(ctx context.Context) (*Result, error) {
	const calls = 2000
	rates := []float64{0.05, 0.3, 0.5, 0.7, 0.9}
	res := &Result{
		ID: 6, Key: "independent", Title: "Independent failures",
		Setup: fmt.Sprintf("%d calls one after the other per row; each attempt fails with UNAVAILABLE with probability p "+
			"(a seeded choice per request and attempt). The suite's budget and breaker run on a virtual clock, "+
			"1 ms per call, so the counts do not depend on the machine's speed.", calls),
		cols:  []col{colVariant, colPolicy, colOrigin, colAmpl, colOK, colErrors, colRefused, colWouldRefuse},
		chart: "6 independent\n%s",
	}
	type job struct {
		rate float64
		p    policy
		row  Row
		err  error
	}
	var jobs []*job
	for _, rate := range rates {
		for _, p := range withShadow() {
			jobs = append(jobs, &job{rate: rate, p: p})
		}
	}
	// The rows are independent (own origin, clients and clock) and each
	// makes its calls in sequence, so they can run side by side: the
	// counts are the same as one by one, only sooner.
	var wg sync.WaitGroup
	sem := make(chan struct{}, 6)
	for _, j := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			j.row, j.err = independentRow(ctx, j.p, j.rate, calls)
			j.row.Variant = fmt.Sprintf("p=%g", j.rate)
		}()
	}
	wg.Wait()
	for _, j := range jobs {
		if j.err != nil {
			return nil, fmt.Errorf("%s, p=%g, %s: %w", res.Title, j.rate, j.p.name, j.err)
		}
		res.Rows = append(res.Rows, j.row)
	}
	return res, nil
}

// virtualClock is the suite's clock in scenario 6: it stands at start plus
// the number of calls made so far, in milliseconds.
type virtualClock struct {
	start time.Time
	calls atomic.Int64
}

func (c *virtualClock) now() time.Time {
	return c.start.Add(time.Duration(c.calls.Load()) * time.Millisecond)
}

// independentRow makes calls sequential Puts through p against an origin
// that fails each attempt with probability rate.
func independentRow(ctx context.Context, p policy, rate float64, calls int) (Row, error) {
	clk := &virtualClock{start: time.Now()}
	e := newEnv(p, clock.ClientOption(clk.now, nil).(interceptor.ClientOption))
	defer e.close()
	o := origin.New(failWithProbability(labSeed, rate))
	client, err := e.oneHop(o)
	if err != nil {
		return Row{}, err
	}
	call := put(client)
	var out outcome
	for i := range calls {
		if ctx.Err() != nil {
			return Row{}, ctx.Err()
		}
		clk.calls.Store(int64(i))
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		t := time.Now()
		err := call(cctx, i)
		out.record(err, time.Since(t))
		cancel()
	}
	row := out.row(p, o.Total())
	row.WouldRefuse = e.wouldRefuse()
	return row, nil
}
