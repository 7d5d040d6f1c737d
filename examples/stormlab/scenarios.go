package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"

	"github.com/stormguard/stormguard/examples/internal/fleetsim"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// labSeed seeds every random choice of the lab that decides an outcome
// (which attempts fail or are slow), so that runs are comparable.
const labSeed = fleetsim.LabSeed

// scenario is one experiment of the lab.
type scenario struct {
	id    int
	key   string
	quick bool // part of -quick
	run   func(context.Context) (*Result, error)
}

// scenarios returns the lab's scenarios, in order.
func scenarios() []scenario {
	return []scenario{
		{1, "outage", true, outage},
		{2, "flaky", true, flaky},
		{3, "twice", true, failsTwice},
		{4, "chain", true, chainOfThree},
		{5, "slow", false, slowDependency},
		{6, "independent", false, independentFailures},
		{7, "capacity", true, capacityDrop},
		{8, "tail", false, longTail},
		{9, "backend-dead", true, backendDead},
		{10, "metastable", false, metastable},
		{11, "blip", false, overloadBlip},
		{12, "fleet", false, fleet},
		{13, "priority", false, priorities},
		{14, "overload-mixed", false, overloadMixed},
	}
}

// waveCols are the columns of the wave scenarios (1-4).
func waveCols() []col {
	return []col{colPolicy, colOrigin, colAmpl, colOK, colErrors, colRefused, colWouldRefuse, colMax}
}

// put is the call every wave scenario makes: Put is IDEMPOTENT in the
// demo proto, so every retrying policy may retry it, and it has no hedging
// policy.
func put(c echov1.EchoServiceClient) func(context.Context, int) error {
	return func(ctx context.Context, i int) error {
		_, err := c.Put(ctx, &echov1.PutRequest{RequestId: strconv.Itoa(i)})
		return err
	}
}

// waveRow runs one policy's row of a one-hop wave: callers concurrent
// calls against an origin that answers as script says, the first attempts
// held in step.
func waveRow(ctx context.Context, p policy, callers int, script origin.Script) (Row, error) {
	e := newEnv(p)
	defer e.close()
	o := origin.New(inStep(callers, script))
	client, err := e.oneHop(o)
	if err != nil {
		return Row{}, err
	}
	out := wave(ctx, callers, callTimeout, put(client))
	row := out.row(p, o.Total())
	row.WouldRefuse = e.wouldRefuse()
	return row, nil
}

// waveScenario runs every policy through waveRow.
func waveScenario(ctx context.Context, res *Result, callers int, script func() origin.Script) (*Result, error) {
	res.cols = waveCols()
	for _, p := range withShadow() {
		row, err := waveRow(ctx, p, callers, script())
		if err != nil {
			return nil, fmt.Errorf("%s, %s: %w", res.Title, p.name, err)
		}
		res.Rows = append(res.Rows, row)
	}
	return res, nil
}

// Scenario 1 (from "Retries can make an outage worse: designing a retry
// budget" and "Reliability is not retry=3"): the origin is down. A second
// wave of callers follows the first through the same clients: a breaker
// that opened on the first keeps the second away from the origin.
func outage(ctx context.Context) (*Result, error) {
	const callers = 50
	res := &Result{
		ID: 1, Key: "outage", Title: "Outage, one hop",
		Setup: "50 concurrent callers; the origin answers UNAVAILABLE to everything. " +
			"Wave 2: 50 more callers right after, through the same clients.",
		cols:  append([]col{colVariant}, waveCols()...),
		chart: "1 outage %s",
	}
	for _, p := range withShadow() {
		rows, err := func() ([]Row, error) {
			e := newEnv(p)
			defer e.close()
			o := origin.New(inStep(callers, origin.Always(codes.Unavailable)))
			client, err := e.oneHop(o)
			if err != nil {
				return nil, err
			}
			first := wave(ctx, callers, callTimeout, put(client)).row(p, o.Total())
			first.Variant = "wave 1"
			first.WouldRefuse = e.wouldRefuse()
			seen := o.Total()
			o.SetScript(origin.Always(codes.Unavailable)) // no holding: wave 2 may send nothing at all
			second := wave(ctx, callers, callTimeout, func(ctx context.Context, i int) error {
				return put(client)(ctx, callers+i)
			}).row(p, o.Total()-seen)
			second.Variant = "wave 2"
			second.WouldRefuse = minus(e.wouldRefuse(), first.WouldRefuse)
			return []Row{first, second}, nil
		}()
		if err != nil {
			return nil, fmt.Errorf("%s, %s: %w", res.Title, p.name, err)
		}
		res.Rows = append(res.Rows, rows...)
	}
	sortByVariant(res)
	return res, nil
}

// Scenario 2 (from "Retries can make an outage worse"): a few requests fail
// once.
func flaky(ctx context.Context) (*Result, error) {
	return waveScenario(ctx, &Result{
		ID: 2, Key: "flaky", Title: "Flaky",
		Setup: "50 concurrent callers; 5 of them fail once with UNAVAILABLE, then succeed.",
		chart: "2 flaky",
	}, 50, func() origin.Script {
		return func(c origin.Call) origin.Reply {
			if n, _ := strconv.Atoi(c.RequestID); n < 5 && c.Attempt == 1 {
				return origin.Reply{Code: codes.Unavailable, Message: "origin: flaky"}
			}
			return origin.Reply{}
		}
	})
}

// Scenario 3 (from "Retries can make an outage worse"): every request needs
// two retries.
func failsTwice(ctx context.Context) (*Result, error) {
	return waveScenario(ctx, &Result{
		ID: 3, Key: "twice", Title: "Fails twice",
		Setup: "50 concurrent callers; every request fails twice with UNAVAILABLE, then succeeds.",
		chart: "3 fails twice",
	}, 50, func() origin.Script { return origin.FailFirst(2, codes.Unavailable) })
}

// Scenario 4 (from "Retries can make an outage worse"): the 810-for-10
// chain, and one hop deeper.
func chainOfThree(ctx context.Context) (*Result, error) {
	const callers = 10
	res := &Result{
		ID: 4, Key: "chain", Title: "Chain of services, dead origin",
		Setup: "10 concurrent callers → A → B → C (→ D) → origin, which answers UNAVAILABLE to everything; " +
			"every hop runs the row's client and server side.",
		cols:  append([]col{colVariant}, waveCols()...),
		chart: "4 chain %s",
	}
	for _, hops := range []int{3, 4} {
		for _, p := range withShadow() {
			row, err := func() (Row, error) {
				e := newEnv(p)
				defer e.close()
				o := origin.New(inStep(callers, origin.Always(codes.Unavailable)))
				top, err := e.chain(o, hops)
				if err != nil {
					return Row{}, err
				}
				out := wave(ctx, callers, chainTimeout, put(top))
				row := out.row(p, o.Total())
				row.WouldRefuse = e.wouldRefuse()
				return row, nil
			}()
			if err != nil {
				return nil, fmt.Errorf("%s, %d hops, %s: %w", res.Title, hops, p.name, err)
			}
			row.Variant = fmt.Sprintf("depth %d", hops)
			res.Rows = append(res.Rows, row)
		}
	}
	return res, nil
}

// minus returns a's counts less b's, leaving out those that are 0 (nil if
// a is).
func minus(a, b map[string]int) map[string]int {
	if a == nil {
		return nil
	}
	out := map[string]int{}
	for k, v := range a {
		if d := v - b[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// sortByVariant groups a result's rows by variant, keeping the policy
// order within each.
func sortByVariant(res *Result) {
	slices.SortStableFunc(res.Rows, func(a, b Row) int { return strings.Compare(a.Variant, b.Variant) })
}

// selectScenarios parses -scenario (numbers or keys, comma-separated).
func selectScenarios(spec string, quick bool) ([]scenario, error) {
	all := scenarios()
	var out []scenario
	if spec == "" {
		for _, s := range all {
			if !quick || s.quick {
				out = append(out, s)
			}
		}
		return out, nil
	}
	for _, f := range strings.Split(spec, ",") {
		f = strings.TrimSpace(f)
		found := false
		for _, s := range all {
			if f == strconv.Itoa(s.id) || strings.EqualFold(f, s.key) {
				out = append(out, s)
				found = true
				break
			}
		}
		if !found {
			var names []string
			for _, s := range all {
				names = append(names, fmt.Sprintf("%d=%s", s.id, s.key))
			}
			return nil, fmt.Errorf("unknown scenario %q (have %s)", f, strings.Join(names, ", "))
		}
	}
	return out, nil
}
