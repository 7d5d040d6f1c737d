package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"google.golang.org/grpc"

	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// The long-tail scenario's shape.
const (
	tailCalls   = 500
	tailWorkers = 10
	tailSlowPct = 0.05
	tailFast    = time.Millisecond
	tailSlow    = 300 * time.Millisecond
)

// slowAttempts makes a seeded 5% of attempts (by request id and attempt)
// take tailSlow and the others tailFast. A slow attempt stops when its
// caller cancels it.
func slowAttempts(seed uint64) origin.Script {
	return func(c origin.Call) origin.Reply {
		if uniform(seed, c.RequestID, c.Attempt) < tailSlowPct {
			return origin.Reply{Delay: tailSlow}
		}
		return origin.Reply{Delay: tailFast}
	}
}

// Scenario 8 (the long tail of "Implementing Retry Budgets to Prevent
// Retry Storms"): hedging.
func longTail(ctx context.Context) (*Result, error) {
	res := &Result{
		ID: 8, Key: "tail", Title: "Long tail: hedging",
		Setup: fmt.Sprintf("%d Get calls from %d workers; %.0f%% of attempts (seeded) take %v, the rest %v. "+
			"Get has adaptive hedging in the demo proto: the suite's rows hedge (NoHedging() turns it off); "+
			"grpc-go's retryPolicy does not hedge. ampl. is the load on the origin.",
			tailCalls, tailWorkers, tailSlowPct*100, tailSlow, tailFast),
		cols:  []col{colPolicy, colOrigin, colAmpl, colOK, colP50, colP99, colMax, colErrors},
		chart: "8 long tail\n(load)",
	}
	type run struct {
		p     policy
		opts  []grpc.CallOption
		label string
	}
	runs := []run{}
	for _, p := range policies() {
		runs = append(runs, run{p: p, label: p.name})
	}
	runs = append(runs, run{
		p: policy{suiteDefaults, "stormguard defaults"}, opts: []grpc.CallOption{interceptor.NoHedging()},
		label: "stormguard defaults, NoHedging()",
	})
	for _, r := range runs {
		row, err := tailRow(ctx, r.p, r.opts...)
		if err != nil {
			return nil, fmt.Errorf("%s, %s: %w", res.Title, r.label, err)
		}
		row.Label = r.label
		if r.opts != nil {
			row.Policy = "suite-nohedging"
			row.Chart = 0
		}
		res.Rows = append(res.Rows, row)
	}
	return res, nil
}

// tailRow runs tailCalls Gets through p from tailWorkers goroutines.
func tailRow(ctx context.Context, p policy, opts ...grpc.CallOption) (Row, error) {
	e := newEnv(p)
	defer e.close()
	o := origin.New(slowAttempts(labSeed))
	client, err := e.oneHop(o)
	if err != nil {
		return Row{}, err
	}
	out := pool(ctx, tailCalls, tailWorkers, callTimeout, func(ctx context.Context, i int) error {
		_, err := client.Get(ctx, &echov1.GetRequest{RequestId: strconv.Itoa(i), Key: "k"}, opts...)
		return err
	})
	return out.row(p, o.Total()), nil
}
