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

// tailShape is a long tail: calls Gets from tailWorkers workers, a
// seeded share slowPct of the attempts (by request id and attempt)
// taking slow, the others fast.
type tailShape struct {
	calls      int
	slowPct    float64
	slow, fast time.Duration
}

// The long-tail scenario's shapes: the article's (5% at 300 ms, the p99
// judged) and the 1% at 100× the others' time of "The Tail at Scale" (the
// p99.9 judged). The latter's handlers take 10 ms and 1 s, the paper's
// order of magnitude (a p99.9 of 1,800 ms), so that its callers see the
// slow attempts 100× slower than the rest: with 1 ms and 100 ms, gRPC's
// time on loopback (about 1 ms more per attempt) made the rest take 2 ms,
// and the slow ones 50× that.
var (
	tailArticle = tailShape{calls: 500, slowPct: 0.05, slow: tailSlow, fast: tailFast}
	tailScale   = tailShape{calls: 5000, slowPct: 0.01, slow: time.Second, fast: 10 * time.Millisecond}
)

const (
	tailWorkers = 10
	tailFast    = time.Millisecond
	tailSlow    = 300 * time.Millisecond // tailArticle's
	// tailScaleVariant names the rows of tailScale.
	tailScaleVariant = "1% × 100"
	// The bounds on tailScale: hedging cuts the p99.9 at least
	// minTailCut-fold, for at most maxTailScaleLoad the calls at the origin.
	minTailCut       = 10.0
	maxTailScaleLoad = 1.02
)

// slowAttempts makes a seeded share of attempts (by request id and
// attempt) take s.slow and the others s.fast. A slow attempt stops when
// its caller cancels it.
func (s tailShape) slowAttempts(seed uint64) origin.Script {
	return func(c origin.Call) origin.Reply {
		if uniform(seed, c.RequestID, c.Attempt) < s.slowPct {
			return origin.Reply{Delay: s.slow}
		}
		return origin.Reply{Delay: s.fast}
	}
}

// Scenario 8 (the long tail of "Implementing Retry Budgets to Prevent
// Retry Storms"): hedging.
func longTail(ctx context.Context) (*Result, error) {
	res := &Result{
		ID: 8, Key: "tail", Title: "Long tail: hedging",
		Setup: fmt.Sprintf("%d Get calls from %d workers; %.0f%% of attempts (seeded) take %v, the rest %v "+
			"(variant %s: %d calls, %.0f%% of attempts take %v, the rest %v, the p99.9 judged). "+
			"Get has adaptive hedging in the demo proto: the suite's rows hedge (NoHedging() turns it off); "+
			"grpc-go's retryPolicy does not hedge. ampl. is the load on the origin.",
			tailArticle.calls, tailWorkers, tailArticle.slowPct*100, tailArticle.slow, tailFast,
			tailScaleVariant, tailScale.calls, tailScale.slowPct*100, tailScale.slow, tailScale.fast),
		cols:  []col{colVariant, colPolicy, colOrigin, colAmpl, colOK, colP50, colP99, colP999, colMax, colErrors},
		chart: "8 long tail\n(load)",
	}
	type run struct {
		s       tailShape
		variant string
		p       policy
		opts    []grpc.CallOption
		label   string
	}
	runs := []run{}
	for _, p := range policies() {
		runs = append(runs, run{s: tailArticle, p: p, label: p.name})
	}
	noHedging := func(s tailShape, variant string) run {
		return run{s: s, variant: variant, p: policy{suiteDefaults, "stormguard defaults"}, opts: []grpc.CallOption{interceptor.NoHedging()},
			label: "stormguard defaults, NoHedging()"}
	}
	runs = append(runs, noHedging(tailArticle, ""),
		run{s: tailScale, variant: tailScaleVariant, p: policy{suiteDefaults, "stormguard defaults"}, label: "stormguard defaults"},
		noHedging(tailScale, tailScaleVariant))
	for _, r := range runs {
		row, err := tailRow(ctx, r.s, r.p, r.opts...)
		if err != nil {
			return nil, fmt.Errorf("%s, %s: %w", res.Title, r.label, err)
		}
		row.Label, row.Variant = r.label, r.variant
		if r.opts != nil {
			row.Policy = suiteNoHedging
		}
		if r.opts != nil || r.variant != "" {
			row.Chart = 0
		}
		res.Rows = append(res.Rows, row)
	}
	return res, nil
}

// suiteNoHedging is the policy key of the long-tail rows with
// interceptor.NoHedging().
const suiteNoHedging policyKey = "suite-nohedging"

// tailRow runs s's calls as Gets through p from tailWorkers goroutines.
func tailRow(ctx context.Context, s tailShape, p policy, opts ...grpc.CallOption) (Row, error) {
	e := newEnv(p)
	defer e.close()
	o := origin.New(s.slowAttempts(labSeed))
	client, err := e.oneHop(o)
	if err != nil {
		return Row{}, err
	}
	out := pool(ctx, s.calls, tailWorkers, callTimeout, func(ctx context.Context, i int) error {
		_, err := client.Get(ctx, &echov1.GetRequest{RequestId: strconv.Itoa(i), Key: "k"}, opts...)
		return err
	})
	return out.row(p, o.Total()), nil
}
