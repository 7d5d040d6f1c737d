package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/stormguard/stormguard/interceptor"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
	"github.com/stormguard/stormguard/priority"
)

// priorityShape is the priority scenario: an origin of 4 workers × 40 ms
// (100/s) with a queue of 250, and twice its capacity offered for 6 s,
// a fifth of the calls from callers whose work is critical (40/s, 40% of
// the capacity) and the rest from callers whose work may be dropped.
var priorityShape = shape{
	workers: 4, service: 40 * time.Millisecond, queue: 250, rate: 200, clients: 4,
	deadline: time.Second, after: 6 * time.Second,
}

// criticalEvery: call i is a critical caller's when i % criticalEvery is
// 0 (a fifth), a sheddable caller's otherwise.
const criticalEvery = 5

// The classes of callers, and the priority scenario's bounds: with
// priorities the critical callers' calls succeed at least minCriticalOK of
// the time; without a difference between them (no call marked, or every
// call critical) every caller is served alike: the two classes' success
// rates differ by at most maxClassGap points, and the calls that succeed
// when every call claims critical are the defaults' within maxAllCritical
// of the calls.
const (
	classCritical  = "critical"
	classSheddable = "sheddable"
	minCriticalOK  = 99.0
	maxClassGap    = 10.0
	maxAllCritical = 0.05
)

// The priority scenario's schedule: a call is on schedule when the load
// generator sent it within prioLate of its time; below prioMinOnSchedule
// of them the machine cannot run the scenario (an error, exit status 2).
const (
	prioLate          = 25 * time.Millisecond
	prioMinOnSchedule = 0.95
)

// classCount is what one class of callers saw.
type classCount struct {
	Calls int `json:"calls"`
	OK    int `json:"ok"`
}

func (c classCount) percent() float64 {
	if c.Calls == 0 {
		return 0
	}
	return 100 * float64(c.OK) / float64(c.Calls)
}

func (c classCount) String() string {
	return fmt.Sprintf("%d/%d (%.1f%%)", c.OK, c.Calls, c.percent())
}

// mark returns the priority p's rows mark a call of the given class with,
// and false for the rows that mark nothing.
func (p policy) mark(class string) (priority.Priority, bool) {
	switch {
	case p.key == suiteAllCritical, p.key == suitePriority && class == classCritical:
		return priority.Critical, true
	case p.key == suitePriority:
		return priority.Sheddable, true
	}
	return priority.Default, false
}

// priorityLoop sends s.rate Puts a second for s.after, open loop, as
// openLoop does: call i through clients[i % len(clients)], marked as p
// marks its class. It returns what each class
// saw, the critical class's calls per step in crit, and how many calls
// were sent on schedule.
func priorityLoop(ctx context.Context, s shape, clients []echov1.EchoServiceClient, start time.Time, p policy) (out outcome, classes map[string]classCount, crit *tally, onTime int) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	classes = map[string]classCount{}
	steps := s.steps()
	crit = &tally{offered: make([]int, steps), ok: make([]int, steps)}
	n := int(s.after.Seconds() * float64(s.rate))
	interval := time.Second / time.Duration(s.rate)
	for i := range n {
		due := start.Add(time.Duration(i) * interval)
		if sleepCtx(ctx, time.Until(due)) != nil {
			break
		}
		if time.Since(due) <= prioLate {
			onTime++
		}
		class := classSheddable
		if i%criticalEvery == 0 {
			class = classCritical
		}
		mark, marked := p.mark(class)
		c := clients[i%len(clients)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, s.deadline)
			defer cancel()
			if marked {
				cctx = priority.NewContext(cctx, mark)
			}
			begin := time.Now()
			_, err := c.Put(cctx, &echov1.PutRequest{RequestId: strconv.Itoa(i)})
			d := time.Since(begin)
			if class == classCritical {
				crit.record(due.Sub(start), err, d)
			}
			mu.Lock()
			defer mu.Unlock()
			out.record(err, d)
			cc := classes[class]
			cc.Calls++
			if err == nil {
				cc.OK++
			}
			classes[class] = cc
		}()
	}
	wg.Wait()
	return out, classes, crit, onTime
}

// errPriorityBehind marks a priority row the machine could not run on
// schedule.
var errPriorityBehind = errors.New("the load generator fell behind")

// prioOnSchedule returns an error wrapping errPriorityBehind when fewer
// than prioMinOnSchedule of the asked calls were sent on schedule.
func prioOnSchedule(onTime, asked int) error {
	if asked == 0 || float64(onTime) < prioMinOnSchedule*float64(asked) {
		return fmt.Errorf("%w: %d of %d calls sent within %v of their time (want ≥ %.0f%%): this machine cannot run the scenario in real time",
			errPriorityBehind, onTime, asked, prioLate, 100*prioMinOnSchedule)
	}
	return nil
}

// priorityRow runs one row: a fresh origin and fresh clients (with extra
// options, in the suite's rows), and the overload.
func priorityRow(ctx context.Context, s shape, p policy, extra ...interceptor.ClientOption) (Row, error) {
	o := newQueueOrigin(s.workers, s.queue, s.service)
	defer o.close()
	e := newEnv(p, extra...)
	defer e.close()
	l, err := e.serve(o)
	if err != nil {
		return Row{}, err
	}
	clients, err := e.clients(ctx, l, s.clients)
	if err != nil {
		return Row{}, err
	}
	out, classes, crit, onTime := priorityLoop(ctx, s, clients, time.Now().Add(50*time.Millisecond), p)
	if ctx.Err() != nil {
		return Row{}, ctx.Err()
	}
	if err := prioOnSchedule(onTime, int(s.after.Seconds()*float64(s.rate))); err != nil {
		return Row{}, err
	}
	row := out.row(p, int(o.arrived.Load()))
	row.Classes = classes
	wasted := int(o.wasted.Load())
	row.Wasted = &wasted
	row.Worked = int(o.worked.Load())
	row.Goodput = crit.goodput()
	row.ServerRefused = serverRefusals(e.guards)
	row.Chart = 0
	return row, nil
}

// priorityPolicies are the scenario's main rows.
func priorityPolicies() []policy {
	return []policy{
		{noRetries, "no retries"},
		{suiteDefaults, "stormguard defaults, no priorities"},
		{suitePriority, "stormguard, priorities"},
		{suiteAllCritical, "stormguard, every call critical"},
	}
}

// The priority scenario's variant with a per-attempt timeout in the
// suite's defaults (no retries has none: its row is the main one): 40% of
// the deadline, as the metastable scenario's main rows have.
const (
	priorityPerTryVariant = "per-try 400ms"
	priorityPerTry        = 400 * time.Millisecond
)

// priorityRun is one row to run: a policy, and its variant.
type priorityRun struct {
	p       policy
	variant string
	extra   []interceptor.ClientOption
}

// priorityRuns are the scenario's rows: the main ones, and the suite's
// defaults with a per-attempt timeout.
func priorityRuns() []priorityRun {
	var runs []priorityRun
	for _, p := range priorityPolicies() {
		runs = append(runs, priorityRun{p: p})
	}
	return append(runs, priorityRun{p: policy{suiteDefaults, "stormguard defaults, no priorities"}, variant: priorityPerTryVariant,
		extra: []interceptor.ClientOption{interceptor.WithRetryPolicy(interceptor.RetryPolicy{PerAttemptTimeout: priorityPerTry})}})
}

// Scenario 13: an overload with priorities. Twice the origin's capacity
// is offered, a fifth of it by critical callers: with priorities their
// calls succeed while the sheddable ones are shed; without, every caller
// loses alike.
func priorities(ctx context.Context) (*Result, error) { return prioritiesWith(ctx, priorityShape) }

// prioritiesWith runs scenario 13 on shape s (s.after long).
func prioritiesWith(ctx context.Context, s shape) (*Result, error) {
	if crit := float64(s.rate) / criticalEvery; crit > s.capacity() {
		return nil, fmt.Errorf("the critical share of the load (%.0f/s) exceeds the capacity (%.0f/s)", crit, s.capacity())
	}
	res := &Result{
		ID: 13, Key: "priority", Title: "Overload with priorities: critical work is shed last",
		Setup: fmt.Sprintf("An origin with %d workers × %v per request (%.0f/s), a FIFO queue of %d (full: UNAVAILABLE), "+
			"a handler that does not watch its context; %d Puts/s offered open-loop for %v from %d connections (%.0f%% of capacity), deadline %v. "+
			"One call in %d is a critical caller's (%.0f/s, %.0f%% of capacity), the others a sheddable caller's; "+
			"the rows with priorities mark them so (priority.NewContext), the others send them unmarked. "+
			"wasted: requests the origin worked after their caller had left; critical ok, sheddable ok: each class's calls that succeeded; server refused: the suite server's admission (deadline) and shedding (shed_retry, shed_first).",
			s.workers, s.service, s.capacity(), s.queue, s.rate, s.after, s.clients, 100*float64(s.rate)/s.capacity(), s.deadline,
			criticalEvery, float64(s.rate)/criticalEvery, 100*float64(s.rate)/criticalEvery/s.capacity()),
		StepS: msStep.Seconds(),
		cols:  []col{colVariant, colPolicy, colOrigin, colOK, colWasted, colCriticalOK, colSheddableOK, colErrors, colServerRefused, colP50, colCriticalGoodput},
	}
	runs := priorityRuns()
	rows := make([]Row, len(runs))
	errs := make([]error, len(rows))
	var wg sync.WaitGroup
	for i, r := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rows[i], errs[i] = priorityRow(ctx, s, r.p, r.extra...)
			rows[i].Variant = r.variant
		}()
	}
	wg.Wait()
	for i, r := range runs {
		if errs[i] != nil {
			return nil, fmt.Errorf("%s, %s: %w", res.Title, r.p.name, errs[i])
		}
	}
	res.Rows = rows
	return res, nil
}

// priorityChecks are the priority scenario's bounds.
func priorityChecks(r *Result) []Check {
	none := r.row(noRetries, "")
	out := noHarmChecks(r, r.row(suiteDefaults, ""), none, "priority")
	out = append(out, wasteCheck(r, r.row(suiteDefaults, ""), "priority")...)
	out = append(out, noHarmChecks(r, r.row(suiteDefaults, priorityPerTryVariant), none, "priority, "+priorityPerTryVariant)...)
	out = append(out, wasteCheck(r, r.row(suiteDefaults, priorityPerTryVariant), "priority, "+priorityPerTryVariant)...)
	add := func(p policyKey, what, want, got string, ok bool) {
		out = append(out, Check{Scenario: r.ID, Row: string(p), What: what, Want: want, Got: got, OK: ok})
	}
	if row := r.row(suitePriority, ""); row != nil {
		c := row.Classes[classCritical]
		add(suitePriority, "priority: critical calls ok", fmt.Sprintf("≥ %.0f%%", minCriticalOK), c.String(),
			c.Calls > 0 && c.percent() >= minCriticalOK)
	}
	defaults := r.row(suiteDefaults, "")
	for _, p := range []policyKey{suiteDefaults, suiteAllCritical} {
		row := r.row(p, "")
		if row == nil {
			continue
		}
		crit, shed := row.Classes[classCritical], row.Classes[classSheddable]
		gap := crit.percent() - shed.percent()
		add(p, "priority: no difference, both classes served alike", fmt.Sprintf("|gap| ≤ %.0f pts", maxClassGap),
			fmt.Sprintf("%.1f%% vs %.1f%%", crit.percent(), shed.percent()), gap <= maxClassGap && gap >= -maxClassGap)
		if p == suiteAllCritical && defaults != nil {
			slack := int(maxAllCritical * float64(defaults.Calls))
			add(p, "priority: every call critical, ok = defaults' ok", fmt.Sprintf("%d ± %d", defaults.OK, slack),
				fmt.Sprint(row.OK), row.OK >= defaults.OK-slack && row.OK <= defaults.OK+slack)
		}
	}
	return out
}
