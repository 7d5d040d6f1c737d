package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/stormguard/stormguard/interceptor"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
	"github.com/stormguard/stormguard/overload"
)

// shape is the set-up of a capacity-drop run: the origin, the load and the
// trigger.
type shape struct {
	workers  int           // origin workers
	service  time.Duration // per request, per worker
	queue    int           // FIFO queue; full: UNAVAILABLE
	rate     int           // calls per second, open loop
	clients  int           // connections, each with its own suite Client
	deadline time.Duration // per call
	perTry   time.Duration // per attempt, in the suite's rows (0: none)
	slow     time.Duration // the service time during the trigger
	before   time.Duration // from the start to the trigger
	trigger  time.Duration // the trigger's length
	after    time.Duration // from the trigger's end to the end of the load
}

// metastableShape is scenario 10: the fast shape of the metastable trial
// (issueShape in main_test.go: 4 workers × 5 ms, a queue of 2,000, 560
// calls/s, 1 s deadlines, 100 ms per attempt, 2 s at 16 ms) slowed down
// four times (service time and per-attempt timeout × 4, rates and queue ÷
// 4), so that it is the same system in units of its service time (70% load,
// a trigger to 31%, a queue of 2.5 s of work, an attempt timeout of 20
// service times) with a quarter of the RPCs, and a machine that pauses the
// lab for tens of milliseconds cannot time attempts out by itself. The call
// deadline is 1 s, as in the trial: no retries fail during the trigger, but
// only then.
var metastableShape = shape{
	workers:  4,
	service:  20 * time.Millisecond, // 200 calls/s
	queue:    500,
	rate:     140, // 70%
	clients:  4,
	deadline: time.Second,
	perTry:   400 * time.Millisecond,
	slow:     64 * time.Millisecond, // 62.5 calls/s: 31%
	before:   2 * time.Second,
	trigger:  2 * time.Second,
	after:    6 * time.Second,
}

// The goodput step, and the share of the offered load that counts as
// recovered.
const (
	msStep = 250 * time.Millisecond
	msGood = 0.9
)

func (s shape) steps() int       { return int((s.before + s.trigger + s.after) / msStep) }
func (s shape) triggerStep() int { return int(s.before / msStep) }
func (s shape) endStep() int     { return int((s.before + s.trigger) / msStep) }
func (s shape) capacity() float64 {
	return float64(s.workers) * float64(time.Second) / float64(s.service)
}
func (s shape) lowCapacity() float64 {
	return float64(s.workers) * float64(time.Second) / float64(s.slow)
}

// recoveryS is the JSON recovery_s of a row: seconds from the trigger's end
// until the goodput stays at or above 90% of the offered load, or null
// when it never does within the run.
type recoveryS struct {
	s     float64
	never bool
}

func (r recoveryS) MarshalJSON() ([]byte, error) {
	if r.never {
		return []byte("null"), nil
	}
	return json.Marshal(r.s)
}

func (r *recoveryS) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*r = recoveryS{never: true}
		return nil
	}
	r.never = false
	return json.Unmarshal(b, &r.s)
}

func (r *recoveryS) String() string {
	if r == nil {
		return "-"
	}
	if r.never {
		return "never"
	}
	return fmt.Sprintf("%.2fs", r.s)
}

// recovery returns how long after step from the goodput ratios good stay
// at or above msGood to the end.
func recovery(good []float64, from int) recoveryS { return recoveryAbove(good, from, msGood) }

// recoveryAbove returns how long after step from the goodput ratios good
// stay at or above threshold to the end.
func recoveryAbove(good []float64, from int, threshold float64) recoveryS {
	k := len(good)
	for k > from && good[k-1] >= threshold {
		k--
	}
	if k == len(good) {
		return recoveryS{never: true}
	}
	return recoveryS{s: float64(k-from) * msStep.Seconds()}
}

// sparkline draws goodput ratios as block characters ('·' below 1/16),
// with a bar at the steps marks.
func sparkline(good []float64, marks ...int) string {
	bars := []rune("▁▂▃▄▅▆▇█")
	var b strings.Builder
	for i, g := range good {
		for _, m := range marks {
			if i == m {
				b.WriteRune('|')
			}
		}
		if g < 1.0/16 {
			b.WriteRune('·')
		} else {
			b.WriteRune(bars[min(int(g*float64(len(bars))), len(bars)-1)])
		}
	}
	return b.String()
}

// tally is what the callers of one run saw: the outcome, and per step the
// calls sent and those of them that succeeded, and, if answered is not
// nil, the successes by the step they were answered in.
type tally struct {
	mu       sync.Mutex
	out      outcome
	offered  []int
	ok       []int
	answered []int
}

// record adds a call sent at offset from the run's start that ended with
// err after d.
func (t *tally) record(offset time.Duration, err error, d time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.out.record(err, d)
	step := min(int(offset/msStep), len(t.offered)-1)
	t.offered[step]++
	if err == nil {
		t.ok[step]++
		if t.answered != nil {
			t.answered[min(int((offset+d)/msStep), len(t.answered)-1)]++
		}
	}
}

// windowed returns, per step, the share of the calls sent in it and the
// k-1 steps after it that succeeded; the last k-1 steps, which have not
// so many after them, get the last k steps' share.
func (t *tally) windowed(k int) []float64 {
	g := make([]float64, len(t.offered))
	for i := range g {
		from := max(min(i, len(t.offered)-k), 0)
		g[i] = t.share(from, from+k)
	}
	return g
}

// perSecond returns, per second, the share of the calls sent in it that
// succeeded.
func (t *tally) perSecond() []float64 {
	k := int(time.Second / msStep)
	g := make([]float64, (len(t.offered)+k-1)/k)
	for i := range g {
		g[i] = t.share(i*k, (i+1)*k)
	}
	return g
}

// share returns the share of the calls sent in steps [from, to) (as far as
// there are) that succeeded, 0 when none was sent.
func (t *tally) share(from, to int) float64 {
	sent, ok := 0, 0
	for j := from; j < min(to, len(t.offered)); j++ {
		sent += t.offered[j]
		ok += t.ok[j]
	}
	if sent == 0 {
		return 0
	}
	return float64(ok) / float64(sent)
}

// drop drops o's capacity from s.before after start for s.trigger (its
// service time s.slow), on a goroutine that wg counts.
func (s shape) drop(ctx context.Context, o *queueOrigin, start time.Time, wg *sync.WaitGroup) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		if sleepCtx(ctx, time.Until(start.Add(s.before))) == nil {
			o.setService(s.slow)
		}
		_ = sleepCtx(ctx, time.Until(start.Add(s.before+s.trigger)))
		o.setService(s.service)
	}()
}

// goodput returns, per step, the share of the calls sent in that step that
// succeeded.
func (t *tally) goodput() []float64 {
	g := make([]float64, len(t.offered))
	for i := range g {
		if t.offered[i] > 0 {
			g[i] = float64(t.ok[i]) / float64(t.offered[i])
		}
	}
	return g
}

// openLoop sends s.rate Puts a second from start to the end of the run,
// the i-th at start + i/rate through clients[i % len(clients)], each in
// its own goroutine with the call deadline, whatever happened to the
// earlier ones; it waits for all of them.
func openLoop(ctx context.Context, s shape, clients []echov1.EchoServiceClient, start time.Time, t *tally) {
	var wg sync.WaitGroup
	n := int((s.before + s.trigger + s.after).Seconds() * float64(s.rate))
	interval := time.Second / time.Duration(s.rate)
	for i := range n {
		offset := time.Duration(i) * interval
		if sleepCtx(ctx, time.Until(start.Add(offset))) != nil {
			break
		}
		c := clients[i%len(clients)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, s.deadline)
			defer cancel()
			begin := time.Now()
			_, err := c.Put(cctx, &echov1.PutRequest{RequestId: strconv.Itoa(i)})
			t.record(offset, err, time.Since(begin))
		}()
	}
	wg.Wait()
}

// sleepCtx waits d or until ctx is done.
func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// capacityRow runs one row: a fresh origin and fresh clients, the load,
// and (if trigger) the capacity drop.
func capacityRow(ctx context.Context, s shape, p policy, trigger bool) (Row, error) {
	o := newQueueOrigin(s.workers, s.queue, s.service)
	defer o.close()
	var extra []interceptor.ClientOption
	if s.perTry > 0 {
		extra = append(extra, interceptor.WithRetryPolicy(interceptor.RetryPolicy{PerAttemptTimeout: s.perTry}))
	}
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
	start := time.Now().Add(50 * time.Millisecond)
	var wg sync.WaitGroup
	if trigger {
		s.drop(ctx, o, start, &wg)
	}
	t := &tally{offered: make([]int, s.steps()), ok: make([]int, s.steps())}
	openLoop(ctx, s, clients, start, t)
	wg.Wait()
	if ctx.Err() != nil {
		return Row{}, ctx.Err()
	}
	row := t.out.row(p, int(o.arrived.Load()))
	wasted := int(o.wasted.Load())
	row.Wasted = &wasted
	row.Worked = int(o.worked.Load())
	row.Goodput = t.goodput()
	rec := recovery(row.Goodput, s.endStep())
	row.Recovery = &rec
	row.ServerRefused = serverRefusals(e.guards)
	row.marks = []int{s.triggerStep(), s.endStep()}
	row.Chart = 0
	return row, nil
}

// serverRefusals adds up what the suite's servers refused, by reason.
func serverRefusals(guards []*overload.Guard) map[string]int {
	var m map[string]int
	add := func(r overload.Reason, n uint64) {
		if n > 0 {
			if m == nil {
				m = map[string]int{}
			}
			m[r.String()] += int(n)
		}
	}
	for _, g := range guards {
		st := g.Stats()
		add(overload.RefusedDeadline, st.RefusedDeadline)
		add(overload.ShedRetry, st.ShedRetry)
		add(overload.ShedFirst, st.ShedFirst)
	}
	return m
}

// metastablePolicies are the rows of the scenario: the usual six, the
// suite's defaults with adaptive hedging, and the suite's defaults
// without one or both of its server's overload mechanisms.
func metastablePolicies() []policy {
	return append(policies(),
		policy{suiteHedging, "stormguard defaults, hedging"},
		policy{suiteNoAdmission, "suite, no admission"},
		policy{suiteNoShedding, "suite, no shedding"},
		policy{suiteNoOverload, "suite, neither"},
	)
}

// shortPerTry is the variant with the trigger and a per-attempt timeout of
// shortPerTryTimeout in the suite's rows: the suite's client alone (a
// plain server) must recover within maxShortPerTryRecovery of the
// trigger's end, as the defaults do.
const (
	shortPerTry        = "per-try 100ms"
	shortPerTryTimeout = 100 * time.Millisecond
)

// noTrigger is the variant without the trigger, run for the rows whose
// server may refuse, and for no retries as the reference: at 70% of
// capacity every call finishes in time, so every refusal there is a false
// one.
const noTrigger = "no trigger"

// noPerTry is the variant with the trigger and without the per-attempt
// timeout (the client's default), run for no retries and the suite's rows
// whose server differs: without it the suite's defaults must do no harm,
// succeeding as often as no retries.
const noPerTry = "no per-try"

// msParallel is how many rows run at once. Rows share nothing but the
// machine, and each origin keeps its capacity on an absolute time line.
// Fewer would not fit the scenario in a minute.
const msParallel = 4

// capacityJob is one row to run.
type capacityJob struct {
	p       policy
	trigger bool
	variant string // the row's variant ("" for the main rows)
	// perTry, when set, replaces the shape's per-attempt timeout (0: none).
	perTry    time.Duration
	setPerTry bool
	row       Row
	err       error
}

// noPerTryJob is the job of p's row in the variant without the per-attempt
// timeout.
func noPerTryJob(p policy) *capacityJob {
	return &capacityJob{p: p, trigger: true, variant: noPerTry, setPerTry: true}
}

// runCapacityJobs runs the jobs of shape s in batches of msParallel, a
// batch after the previous one has ended (so that no row's set-up or
// teardown falls in another row's measured time), and returns their rows
// in order, each with its job's variant.
func runCapacityJobs(ctx context.Context, s shape, jobs []*capacityJob) ([]Row, error) {
	for from := 0; from < len(jobs); from += msParallel {
		var wg sync.WaitGroup
		for _, j := range jobs[from:min(from+msParallel, len(jobs))] {
			wg.Add(1)
			go func() {
				defer wg.Done()
				js := s
				if j.setPerTry {
					js.perTry = j.perTry
				}
				j.row, j.err = capacityRow(ctx, js, j.p, j.trigger)
				j.row.Variant = j.variant
			}()
		}
		wg.Wait()
	}
	var rows []Row
	for _, j := range jobs {
		if j.err != nil {
			return nil, fmt.Errorf("%s: %w", j.p.name, j.err)
		}
		rows = append(rows, j.row)
	}
	return rows, nil
}

// setup describes s for a result's Setup.
func (s shape) setup() string {
	perTry := "no per-attempt timeout"
	if s.perTry > 0 {
		perTry = fmt.Sprintf("per-attempt timeout %v in the suite's rows (the naive row retries its expiry)", s.perTry)
	}
	return fmt.Sprintf("An origin with %d workers × %v per request (%.0f/s), a FIFO queue of %d (full: UNAVAILABLE), "+
		"a handler that does not watch its context; %d Puts/s offered open-loop from %d connections (%.0f%% of capacity), "+
		"deadline %v, %s; from %v to %v the service time is %v (%.1f/s, %.0f%%). "+
		"goodput: per %v step, the share of the calls sent in it that succeeded ('|' marks the trigger); "+
		"recovery: from the trigger's end until every later step has ≥ %.0f%%; "+
		"server refused: the suite server's admission (deadline) and shedding (shed_retry, shed_first).",
		s.workers, s.service, s.capacity(), s.queue, s.rate, s.clients, 100*float64(s.rate)/s.capacity(),
		s.deadline, perTry, s.before, s.before+s.trigger, s.slow, s.lowCapacity(), 100*s.lowCapacity()/s.capacity(),
		msStep, 100*msGood)
}

// Scenario 10: a metastable failure.
func metastable(ctx context.Context) (*Result, error) { return metastableWith(ctx, metastableShape) }

// metastableWith runs scenario 10 on shape s.
func metastableWith(ctx context.Context, s shape) (*Result, error) {
	res := &Result{
		ID: 10, Key: "metastable", Title: "Metastable failure: a capacity drop that retries keep going",
		Setup:   s.setup(),
		cols:    []col{colVariant, colPolicy, colOrigin, colAmpl, colOK, colWasted, colServerRefused, colRecovery, colGoodput},
		StepS:   msStep.Seconds(),
		Trigger: &window{From: s.before.Seconds(), To: (s.before + s.trigger).Seconds()},
	}
	var jobs []*capacityJob
	for _, p := range metastablePolicies() {
		jobs = append(jobs, &capacityJob{p: p, trigger: true})
	}
	for _, p := range metastablePolicies() {
		if p.key == noRetries || p.key == suiteDefaults || p.key == suiteNoAdmission || p.key == suiteHedging {
			jobs = append(jobs, noPerTryJob(p))
		}
	}
	for _, p := range []policy{{noRetries, "no retries"}, {suiteClientOnly, "stormguard client, plain server"}, {suiteDefaults, "stormguard defaults"}} {
		jobs = append(jobs, &capacityJob{p: p, trigger: true, variant: shortPerTry, perTry: shortPerTryTimeout, setPerTry: true})
	}
	for _, p := range metastablePolicies() {
		if p.key == noRetries || (p.key != naive && p.key != suiteNoOverload && p.key != suiteHedging && p.hasServer()) {
			jobs = append(jobs, &capacityJob{p: p, variant: noTrigger})
		}
	}
	rows, err := runCapacityJobs(ctx, s, jobs)
	if err != nil {
		return nil, fmt.Errorf("%s, %w", res.Title, err)
	}
	res.Rows = rows
	return res, nil
}
