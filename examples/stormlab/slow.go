package main

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"

	"github.com/stormguard/stormguard/internal/origin"
)

// Scenario 5 (from "Reliability is not retry=3"): a slow dependency and the
// work it does for callers who already left.
func slowDependency(ctx context.Context) (*Result, error) {
	const (
		callers = 40
		work    = 200 * time.Millisecond
	)
	res := &Result{
		ID: 5, Key: "slow", Title: "Slow dependency",
		Setup: "40 concurrent callers; the origin works 200 ms per request and does not watch its context; " +
			"caller deadlines 2 s, then 100 ms. wasted = origin work finished after its caller had left.",
		cols: []col{colVariant, colPolicy, colOrigin, colAmpl, colOK, colErrors, colP50, colMax, colWasted},
	}
	for _, deadline := range []time.Duration{2 * time.Second, 100 * time.Millisecond} {
		variant := fmt.Sprintf("deadline %v", deadline)
		for _, p := range policies() {
			row, err := slowRow(ctx, p, callers, deadline, origin.Reply{Delay: work, IgnoreCancel: true})
			if err != nil {
				return nil, fmt.Errorf("%s, %s: %w", res.Title, p.name, err)
			}
			row.Variant = variant
			res.Rows = append(res.Rows, row)
		}
	}
	// What does stop the waste: an origin that watches its context, which
	// every row's deadline already cancels (grpc sends it as grpc-timeout).
	p := policy{suiteDefaults, "stormguard defaults"}
	row, err := slowRow(ctx, p, callers, 100*time.Millisecond, origin.Reply{Delay: work})
	if err != nil {
		return nil, fmt.Errorf("%s, origin watching its context: %w", res.Title, err)
	}
	row.Variant = "deadline 100ms"
	row.Label = "stormguard defaults, origin watches ctx"
	row.Policy = "suite-origin-watches-ctx"
	res.Rows = append(res.Rows, row)
	return res, nil
}

// slowRow runs one row of the slow-dependency scenario: every attempt gets
// reply. It waits for the origin's handlers to finish before it counts the
// wasted work.
func slowRow(ctx context.Context, p policy, callers int, deadline time.Duration, reply origin.Reply) (Row, error) {
	e := newEnv(p)
	defer e.close()
	o := origin.New(func(origin.Call) origin.Reply { return reply })
	client, err := e.oneHop(o, grpc.WaitForHandlers(true))
	if err != nil {
		return Row{}, err
	}
	out := wave(ctx, callers, deadline, put(client))
	e.close() // waits for the handlers still working for callers who left
	row := out.row(p, o.Total())
	wasted := o.Wasted()
	row.Wasted = &wasted
	return row, nil
}
