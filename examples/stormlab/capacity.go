package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/examples/internal/fleetsim"
	"github.com/stormguard/stormguard/internal/breakerrand"
)

// The capacity-drop model of "Implementing Retry Budgets to Prevent Retry
// Storms" (the same model as budget/capacity_test.go): 20 ticks of one
// second; 900 requests per tick; the upstream serves 1,000 attempts per
// tick, but only 200 in ticks 5-7; each request makes up to 3 attempts
// within its tick, and an attempt beyond the tick's capacity fails. The
// article reports a peak of 2,300 attempts per tick without a budget and
// 1,169 with its 10% budget, 15,900 requests served either way.
const (
	capTicks       = 20
	capRequests    = 900
	capCapacity    = 1000
	capLowCapacity = 200
	capLowFrom     = 5
	capLowTo       = 7
)

// capClient is one policy in the model: what it asks before each attempt
// and what it is told after. Nil hooks always allow.
type capClient struct {
	attempts int
	// request is called once per request, before its first attempt.
	request func()
	// mayRetry is called before each retry (budget, breaker state).
	mayRetry func() bool
	// admit is called before every attempt (breaker); done reports the
	// attempt's outcome.
	admit func() (done func(failed bool), ok bool)
	// failed is called after each failed attempt; true stops the request
	// (grpc-go's retry throttling counts the failure first).
	failed func() bool
	// succeeded is called after a request's successful attempt.
	succeeded func()
}

// capResult is what the model measured for one policy.
type capResult struct {
	perTick []int // upstream attempts per tick
	peak    int
	total   int
	served  int
}

// simulateCapacity runs the model; setTick moves the policy's injected
// clock to the start of each tick.
func simulateCapacity(c capClient, setTick func(int)) capResult {
	var r capResult
	for tick := range capTicks {
		setTick(tick)
		capacity := capCapacity
		if tick >= capLowFrom && tick <= capLowTo {
			capacity = capLowCapacity
		}
		used := 0
		for range capRequests {
			if c.request != nil {
				c.request()
			}
			for attempt := 1; attempt <= c.attempts; attempt++ {
				if attempt > 1 && c.mayRetry != nil && !c.mayRetry() {
					break
				}
				done := func(bool) {}
				if c.admit != nil {
					var ok bool
					if done, ok = c.admit(); !ok {
						break
					}
				}
				used++
				if used <= capacity {
					done(false)
					r.served++
					if c.succeeded != nil {
						c.succeeded()
					}
					break
				}
				done(true)
				if c.failed != nil && c.failed() {
					break
				}
			}
		}
		r.perTick = append(r.perTick, used)
		r.total += used
		r.peak = max(r.peak, used)
	}
	return r
}

// capPolicy builds p's client in the model, on a clock that setTick moves.
func capPolicy(p policy) (capClient, func(int)) {
	start := time.Unix(1_700_000_000, 0)
	var mu sync.Mutex // the clock is read by budget and breaker
	now := start
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	setTick := func(tick int) { mu.Lock(); defer mu.Unlock(); now = start.Add(time.Duration(tick) * time.Second) }
	c := capClient{attempts: maxAttempts}
	switch p.key {
	case noRetries:
		c.attempts = 1
	case naive, grpcRetry:
		// No backoff matters within a tick: grpc-go's retryPolicy is the
		// same 3 attempts as the suite without budget and breaker.
	case grpcThrottled:
		t := fleetsim.NewGRPCThrottle(10, 0.1) // the fleet simulator's transcription of grpc-go's throttle
		c.failed, c.succeeded = t.Throttle, t.SuccessfulRPC
	case suiteBudget, suiteDefaults:
		b := budget.New(budget.Config{})
		c.request = func() { b.DepositAt(clock()) }
		c.mayRetry = func() bool { return b.WithdrawAt(clock()) }
		if p.key == suiteDefaults {
			var bc breaker.Config
			breakerrand.Set(&bc, func() float64 { return 0 })
			br := breaker.New(bc)
			c.mayRetry = func() bool { return br.RetryAfterAt(clock()) <= 0 && b.WithdrawAt(clock()) }
			c.admit = func() (func(bool), bool) {
				t, err := br.AdmitAt(clock())
				return func(failed bool) { t.DoneAt(failed, clock()) }, err == nil
			}
		}
	}
	return c, setTick
}

// Scenario 7 (the capacity drop of "Implementing Retry Budgets to Prevent
// Retry Storms"): the upstream's capacity drops to a fifth for three ticks.
func capacityDrop(context.Context) (*Result, error) {
	res := &Result{
		ID: 7, Key: "capacity", Title: "Capacity drop (the retry-budget article's model, on an injected clock)",
		Setup: "20 ticks of 1 s, 900 requests per tick; the upstream serves 1,000 attempts per tick, only 200 in ticks 5-7; " +
			"up to 3 attempts per request within its tick. The budget and breaker are the real packages on a clock set to each tick.",
		cols:  []col{colPolicy, colPeak, colPeakAmpl, colOrigin, colAmpl, colServed},
		chart: "7 capacity drop\n(peak/tick ÷ 900)",
	}
	for _, p := range policies() {
		c, setTick := capPolicy(p)
		r := simulateCapacity(c, setTick)
		calls := capTicks * capRequests
		res.Rows = append(res.Rows, Row{
			Policy: p.key, Label: p.name, Calls: calls, Origin: r.total,
			Amplification: float64(r.total) / float64(calls),
			OK:            r.served, Served: r.served,
			Errors:            map[string]int{"Unavailable": calls - r.served},
			Peak:              r.peak,
			PeakAmplification: float64(r.peak) / capRequests,
			Chart:             float64(r.peak) / capRequests,
		})
		if p.key == naive || p.key == suiteDefaults {
			res.Notes = append(res.Notes, fmt.Sprintf("attempts per tick, %s: %v", p.name, r.perTick))
		}
	}
	return res, nil
}
