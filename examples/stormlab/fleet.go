package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/examples/internal/fleetsim"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// grpcSuiteServer is a row of the fleet scenario: grpc-go's retryPolicy
// clients against the suite's server (interceptor.NewServer()).
const grpcSuiteServer policyKey = "grpc-suiteserver"

// fleetShape is the set-up of the fleet scenario: a fleet of quiet
// clients, each with its own ClientConn and (in the suite's rows) its own
// interceptor.Client, calling one origin whose attempts fail
// independently with probability p.
type fleetShape struct {
	clients int           // N: clients in the fleet
	rate    float64       // r: calls per second per client, open loop
	warmup  time.Duration // healthy calls before the failure (0: the failure starts with the first call)
	failure time.Duration // how long the failure lasts
	settle  time.Duration // the failure's first part, bounded only as part of the whole
	ps      []float64     // the failure probabilities, one variant each
}

// defaultFleet is the fleet scenario as the lab runs it: 100 clients at 5
// calls/s each (500 calls/s), 2 s healthy, then 10 s of failure, the
// first 5 s of which are the start-up allowance. Each client decides
// alone, so the fleet's size changes its totals, not its amplification
// (the start-up allowance, 5 retries per client, is 5 ÷ (r × 10 s) of the
// calls whatever N); 100 clients keep the scenario within about 90 s on
// two cores.
var defaultFleet = fleetShape{
	clients: 100,
	rate:    5,
	warmup:  2 * time.Second,
	failure: 10 * time.Second,
	settle:  5 * time.Second,
	ps:      []float64{0.3, 0.5, 0.9, 1.0},
}

// The fleet scenario's load generator and calls.
const (
	// fleetDeadline is every call's deadline.
	fleetDeadline = 2 * time.Second
	// fleetMinOnSchedule is the share of the asked calls the generator
	// must send on schedule; below it the scenario fails with an error:
	// the machine cannot run the cell in real time, and its counts would
	// measure the machine rather than the policies.
	fleetMinOnSchedule = 0.90
	// fleetMaxTimeouts is the share of the calls made that may end with
	// DeadlineExceeded. The origin answers at once, so a call runs out of
	// its fleetDeadline only when the machine falls behind in serving the
	// calls the generator sent on time; above this share the scenario
	// fails with an error. It is half a percent: the availability bounds
	// compare ok% to half a point.
	fleetMaxTimeouts = 0.005
	// fleetMaxConcurrentAttempts bounds the attempts per second that the
	// cells run side by side may send (each cell has its own origin and
	// clients), estimated from above as the cell's calls per second times
	// 1 + p + p² (what three attempts on independent failures send; 1 for
	// no retries): cells are started in batches whose estimates add up
	// to at most this, and at least one cell per batch. An attempt costs
	// this process about 0.25 ms of CPU on a 2-vCPU VM (both ends of its
	// RPC; each client has its own connection, so nothing is batched), so
	// this is at most about 1.25 of two cores.
	fleetMaxConcurrentAttempts = 5000
	// fleetMaxConcurrentClients bounds the clients of the cells that run
	// side by side: each client holds two sockets of this process (its
	// connection's two ends).
	fleetMaxConcurrentClients = 4000
)

// orDefault returns s, or defaultFleet if s is the zero shape.
func (s fleetShape) orDefault() fleetShape {
	if s.clients == 0 && s.rate == 0 && s.failure == 0 && s.settle == 0 && s.warmup == 0 && s.ps == nil {
		return defaultFleet
	}
	return s
}

// validate reports a shape the scenario cannot run.
func (s fleetShape) validate() error {
	switch {
	case s.clients < 1 || s.clients > fleetMaxConcurrentClients:
		return fmt.Errorf("fleet: %d clients, want 1 to %d (each holds two sockets of this process)", s.clients, fleetMaxConcurrentClients)
	case !(s.rate > 0) || s.rate > 1000:
		return fmt.Errorf("fleet: %g calls/s per client, want more than 0 and at most 1000", s.rate)
	case s.warmup < 0:
		return fmt.Errorf("fleet: warm-up %v, want 0 or more", s.warmup)
	case s.settle <= 0:
		return fmt.Errorf("fleet: the failure's first part is %v, want more than 0", s.settle)
	case len(s.ps) == 0:
		return errors.New("fleet: no failure probability")
	case s.failure <= s.settle:
		return fmt.Errorf("fleet: a failure of %v, want longer than its first %v (the bound after them needs calls)", s.failure, s.settle)
	case s.warmup+s.failure > 2*time.Minute:
		return fmt.Errorf("fleet: %v of warm-up and failure, want at most 2m", s.warmup+s.failure)
	}
	for _, p := range s.ps {
		if !(p >= 0 && p <= 1) {
			return fmt.Errorf("fleet: failure probability %g, want one in [0, 1]", p)
		}
	}
	return nil
}

// period is the time between two calls of one client.
func (s fleetShape) period() time.Duration { return time.Duration(float64(time.Second) / s.rate) }

// offset is when client i's first call is due after the start: a seeded
// uniform in [0, period), the same in every row, and the same as the fleet
// simulator's (fleetsim.Phase).
func (s fleetShape) offset(i int) time.Duration { return fleetsim.Phase(labSeed, i, s.period()) }

// askedRate is the fleet's calls per second.
func (s fleetShape) askedRate() float64 { return float64(s.clients) * s.rate }

// parseProbabilities parses -fleet-p: failure probabilities in [0, 1],
// comma-separated.
func parseProbabilities(spec string) ([]float64, error) {
	var ps []float64
	for _, f := range strings.Split(spec, ",") {
		p, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || !(p >= 0 && p <= 1) {
			return nil, fmt.Errorf("-fleet-p: %q is not a probability in [0, 1]", f)
		}
		ps = append(ps, p)
	}
	return ps, nil
}

// fleetRow is one row of the fleet scenario: a client setup, and whether
// the origin runs behind the suite's server interceptor
// (interceptor.NewServer() as it comes) or is a plain grpc-go server.
type fleetRow struct {
	p           policy
	suiteServer bool
}

// fleetRows returns the scenario's rows, in table order.
func fleetRows() []fleetRow {
	return []fleetRow{
		{policy{noRetries, "no retries"}, false},
		{policy{naive, "3 attempts, no budget"}, false},
		{policy{grpcRetry, "grpc-go retryPolicy"}, false},
		{policy{grpcThrottled, "grpc-go retryPolicy+throttling"}, false},
		{policy{suiteClientOnly, "stormguard client, plain server"}, false},
		{policy{suiteDefaults, "stormguard client + server"}, true},
		{policy{grpcSuiteServer, "grpc-go retryPolicy, stormguard server"}, true},
	}
}

// dial returns one client of the fleet: its own ClientConn and, in the
// suite's rows, its own interceptor.Client (nil otherwise).
func (f fleetRow) dial(l *origin.Listener) (*grpc.ClientConn, *interceptor.Client, error) {
	switch f.p.key {
	case noRetries:
		cc, err := l.Dial()
		return cc, nil, err
	case grpcRetry, grpcThrottled, grpcSuiteServer:
		cc, err := grpc.NewClient(l.Target, l.ConnectOptions(grpc.WithDefaultServiceConfig(grpcServiceConfig(f.p.key == grpcThrottled)))...)
		return cc, nil, err
	}
	opts := f.p.clientOptions()
	if opts == nil {
		return nil, nil, fmt.Errorf("fleet: no client for policy %q", f.p.key)
	}
	guard := interceptor.NewClient(opts...)
	cc, err := grpc.NewClient(l.Target, l.ConnectOptions(guard.DialOptions()...)...)
	if err != nil {
		_ = guard.Close()
		return nil, nil, err
	}
	return cc, guard, nil
}

// fleetStats is what the fleet scenario measures of a row besides the
// whole failure's counts (which are the row's Calls, OK, Origin and
// Amplification).
type fleetStats struct {
	// Clients is N; AskedRate the fleet's calls per second (N × r), and
	// Rate those it sent on schedule, over the whole run (warm-up
	// included).
	Clients   int     `json:"clients"`
	AskedRate float64 `json:"asked_calls_per_s"`
	Rate      float64 `json:"calls_per_s"`
	// Missed is the calls the generator skipped because it woke too late
	// for them; LateP99ms the 99th percentile of how late it sent the
	// others; Timeouts the calls that ran out of their deadline.
	Missed    int     `json:"missed_calls"`
	LateP99ms float64 `json:"late_p99_ms"`
	Timeouts  int     `json:"timeouts"`
	// WarmupS, SettleS and FailureS are the time line: the healthy
	// warm-up, the failure's first part and its whole length, in seconds.
	WarmupS  float64 `json:"warmup_s"`
	SettleS  float64 `json:"settle_s"`
	FailureS float64 `json:"failure_s"`
	// Warmup, First and After count the calls made (and attempts seen)
	// during the warm-up, during the failure's first SettleS seconds and
	// after them. A call belongs to the part in which it was due.
	Warmup fleetWindow `json:"warmup"`
	First  fleetWindow `json:"first"`
	After  fleetWindow `json:"after"`
	// Sent is the attempts of the failure's calls that reached the server
	// (before the suite's server interceptor, if any), and
	// SentAmplification that ÷ the calls. Row.Origin counts those that
	// reached the handler.
	Sent              int     `json:"server_requests"`
	SentAmplification float64 `json:"server_amplification"`
}

// fleetWindow is one part of a fleet row's time line.
type fleetWindow struct {
	Calls int `json:"calls"`
	OK    int `json:"ok"`
	// Origin is the attempts that reached the origin's handler, Sent
	// those that reached the server; each ÷ Calls is its amplification.
	Origin            int     `json:"origin_requests"`
	Sent              int     `json:"server_requests"`
	Amplification     float64 `json:"amplification"`
	SentAmplification float64 `json:"server_amplification"`
}

func (w *fleetWindow) fill() {
	if w.Calls > 0 {
		w.Amplification = float64(w.Origin) / float64(w.Calls)
		w.SentAmplification = float64(w.Sent) / float64(w.Calls)
	}
}

// The parts of a fleet row's time line. A request id starts with the
// part's letter, so that the origin and the server count each attempt
// where its call belongs.
const (
	phaseWarmup = iota
	phaseFirst
	phaseAfter
	phaseOther // not a fleet request id: counted, and an error
	phases
)

var phaseLetters = [...]byte{phaseWarmup: 'w', phaseFirst: 'f', phaseAfter: 'a'}

func phaseOf(requestID string) int {
	if requestID != "" {
		for ph, l := range phaseLetters {
			if requestID[0] == l {
				return ph
			}
		}
	}
	return phaseOther
}

// fleetCounter counts attempts by part.
type fleetCounter [phases]atomic.Int64

func (c *fleetCounter) add(requestID string) int {
	ph := phaseOf(requestID)
	c[ph].Add(1)
	return ph
}

// fleetTally is what the callers of one cell saw.
type fleetTally struct {
	mu       sync.Mutex
	out      outcome // the failure's calls
	calls    [phases]int
	ok       [phases]int
	missed   atomic.Int64
	timeouts int               // calls that ended with DeadlineExceeded
	lates    [][]time.Duration // per client
}

func (t *fleetTally) record(ph int, err error, d time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.calls[ph]++
	if err == nil {
		t.ok[ph]++
	}
	if status.Code(err) == codes.DeadlineExceeded {
		t.timeouts++
	}
	if ph != phaseWarmup {
		t.out.record(err, d)
	}
}

// drive runs the fleet's load: client i sends its k-th Put when it is due,
// at start + offset_i + k/r (offset_i a seeded uniform in [0, 1/r), the
// same in every row, so that the fleet's calls are spread over each
// period and every row makes the same calls), each call in its own
// goroutine with fleetDeadline, whatever happened to the client's
// earlier calls. A client that wakes a whole period or more after a call
// was due (its next call is due too) skips that call and counts it as
// missed, as time.Ticker drops ticks: no client ever has two calls due
// at once. The call's request id names its part of the time line, its
// client and k. drive returns when every call has ended.
func (s fleetShape) drive(ctx context.Context, clients []echov1.EchoServiceClient, start time.Time, t *fleetTally) {
	period := s.period()
	failStart, afterStart, end := start.Add(s.warmup), start.Add(s.warmup+s.settle), start.Add(s.warmup+s.failure)
	t.lates = make([][]time.Duration, len(clients))
	var calls, loops sync.WaitGroup
	for i, c := range clients {
		off := s.offset(i)
		loops.Add(1)
		go func() {
			defer loops.Done()
			for k := 0; ; k++ {
				due := start.Add(off + time.Duration(k)*period)
				if !due.Before(end) || sleepCtx(ctx, time.Until(due)) != nil {
					return
				}
				late := time.Since(due)
				if late >= period {
					t.missed.Add(1)
					continue
				}
				t.lates[i] = append(t.lates[i], late)
				ph := phaseWarmup
				switch {
				case !due.Before(afterStart):
					ph = phaseAfter
				case !due.Before(failStart):
					ph = phaseFirst
				}
				id := fmt.Sprintf("%c%d.%d", phaseLetters[ph], i, k)
				calls.Add(1)
				go func() {
					defer calls.Done()
					cctx, cancel := context.WithTimeout(ctx, fleetDeadline)
					defer cancel()
					begin := time.Now()
					_, err := c.Put(cctx, &echov1.PutRequest{RequestId: id})
					t.record(ph, err, time.Since(begin))
				}()
			}
		}()
	}
	loops.Wait()
	calls.Wait()
}

// errBehind marks a cell the machine could not run in real time.
var errBehind = errors.New("the load generator fell behind")

// onSchedule returns an error wrapping errBehind when the machine could
// not run a cell in real time: fewer than fleetMinOnSchedule of the asked
// calls were sent on schedule, or more than fleetMaxTimeouts of those sent
// ran out of their deadline.
func onSchedule(sent, missed, timeouts int, asked float64) error {
	const hint = "this machine cannot run the cell in real time; lower -fleet-clients or -fleet-rate"
	if total := sent + missed; total == 0 || float64(sent) < fleetMinOnSchedule*float64(total) {
		return fmt.Errorf("%w: %d of %d calls sent on schedule (%.1f%%, want ≥ %.0f%%) at %.0f calls/s asked: %s",
			errBehind, sent, total, 100*float64(sent)/float64(max(total, 1)), 100*fleetMinOnSchedule, asked, hint)
	}
	if float64(timeouts) > fleetMaxTimeouts*float64(sent) {
		return fmt.Errorf("%w: %d of %d calls ran out of their %v deadline against an origin that answers at once (%.1f%%, want ≤ %.1f%%) at %.0f calls/s asked: %s",
			errBehind, timeouts, sent, fleetDeadline, 100*float64(timeouts)/float64(sent), 100*fleetMaxTimeouts, asked, hint)
	}
	return nil
}

// fleetCell is one row at one failure probability: a fresh origin behind
// the row's server, N clients, and what they counted.
type fleetCell struct {
	s       fleetShape
	f       fleetRow
	p       float64
	handled fleetCounter // attempts at the origin's handler
	sent    fleetCounter // attempts at the server
	origin  *origin.Origin
	srv     *origin.Server
	conns   []*grpc.ClientConn
	guards  []*interceptor.Client
	clients []echov1.EchoServiceClient
	tally   fleetTally
}

// newFleetCell serves the cell's origin and connects its clients; close
// releases them, also after an error.
func (s fleetShape) newFleetCell(ctx context.Context, f fleetRow, p float64) (*fleetCell, error) {
	c := &fleetCell{s: s, f: f, p: p}
	fail := failWithProbability(labSeed, p)
	c.origin = origin.New(func(call origin.Call) origin.Reply {
		if c.handled.add(call.RequestID) == phaseWarmup {
			return origin.Reply{}
		}
		return fail(call)
	})
	count := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		id := ""
		if r, ok := req.(interface{ GetRequestId() string }); ok {
			id = r.GetRequestId()
		}
		c.sent.add(id)
		return handler(ctx, req)
	}
	l, err := origin.TCP()
	if err != nil {
		return c, err
	}
	// The counter first: it sees every attempt that reaches the server,
	// the suite's server interceptor (if any) what it lets through.
	sopts := []grpc.ServerOption{grpc.ChainUnaryInterceptor(count)}
	if f.suiteServer {
		g := interceptor.NewServer()
		sopts = append(sopts, grpc.ChainUnaryInterceptor(g.Unary()), grpc.ChainStreamInterceptor(g.Stream()))
	}
	c.srv = origin.Serve(l, c.origin, sopts...)
	for range s.clients {
		cc, guard, err := f.dial(l)
		if err != nil {
			return c, err
		}
		c.conns = append(c.conns, cc)
		if guard != nil {
			c.guards = append(c.guards, guard)
		}
		c.clients = append(c.clients, echov1.NewEchoServiceClient(cc))
	}
	return c, connectAll(ctx, c.conns)
}

// close closes the cell's connections and Clients and stops its server.
func (c *fleetCell) close() {
	for _, cc := range c.conns {
		_ = cc.Close()
	}
	for _, g := range c.guards {
		_ = g.Close()
	}
	if c.srv != nil {
		c.srv.Stop()
	}
}

// row returns what the cell measured, or an error if the counts do not
// add up or the load generator fell behind (then with the row as far as
// it was measured).
func (c *fleetCell) row() (Row, error) {
	handled, sent, t, s := &c.handled, &c.sent, &c.tally, c.s
	if n := handled[phaseOther].Load() + sent[phaseOther].Load(); n > 0 {
		return Row{}, fmt.Errorf("fleet: %d attempts without a fleet request id", n)
	}
	if h := handled[phaseWarmup].Load() + handled[phaseFirst].Load() + handled[phaseAfter].Load(); h != int64(c.origin.Total()) {
		return Row{}, fmt.Errorf("fleet: the parts add up to %d attempts at the origin, which counted %d", h, c.origin.Total())
	}
	row := t.out.row(c.f.p, int(handled[phaseFirst].Load()+handled[phaseAfter].Load()))
	row.Variant = fmt.Sprintf("p=%g", c.p)
	row.Chart = 0
	var lates []time.Duration
	for _, l := range t.lates {
		lates = append(lates, l...)
	}
	slices.Sort(lates)
	st := &fleetStats{
		Clients: s.clients, AskedRate: s.askedRate(), Missed: int(t.missed.Load()), Timeouts: t.timeouts,
		WarmupS: s.warmup.Seconds(), SettleS: s.settle.Seconds(), FailureS: s.failure.Seconds(),
	}
	if len(lates) > 0 {
		st.LateP99ms = millis(lates[min(int(0.99*float64(len(lates))), len(lates)-1)])
	}
	made := t.calls[phaseWarmup] + t.calls[phaseFirst] + t.calls[phaseAfter]
	st.Rate = float64(made) / (s.warmup + s.failure).Seconds()
	for ph, w := range map[int]*fleetWindow{phaseWarmup: &st.Warmup, phaseFirst: &st.First, phaseAfter: &st.After} {
		*w = fleetWindow{Calls: t.calls[ph], OK: t.ok[ph], Origin: int(handled[ph].Load()), Sent: int(sent[ph].Load())}
		w.fill()
	}
	st.Sent = st.First.Sent + st.After.Sent
	if row.Calls > 0 {
		st.SentAmplification = float64(st.Sent) / float64(row.Calls)
	}
	row.Fleet = st
	return row, onSchedule(made, st.Missed, st.Timeouts, s.askedRate())
}

// connectAll connects every connection and waits until each is ready.
func connectAll(ctx context.Context, conns []*grpc.ClientConn) error {
	for _, cc := range conns {
		cc.Connect()
	}
	for _, cc := range conns {
		for s := cc.GetState(); s != connectivity.Ready; s = cc.GetState() {
			if !cc.WaitForStateChange(ctx, s) {
				return ctx.Err()
			}
		}
	}
	return nil
}

// fleet is the fleet scenario at the lab's defaults.
func fleet(ctx context.Context) (*Result, error) { return fleetWith(ctx, defaultFleet) }

// fleetWith runs the fleet scenario on shape s (the zero shape: the
// defaults): every row at every failure probability, each cell with its
// own origin and clients, as many side by side as
// fleetMaxConcurrentAttempts and fleetMaxConcurrentClients allow.
func fleetWith(ctx context.Context, s fleetShape) (*Result, error) {
	s = s.orDefault()
	if err := s.validate(); err != nil {
		return nil, err
	}
	rows := fleetRows()
	warm := "the failure starts with the first call (a cold fleet)"
	if s.warmup > 0 {
		warm = fmt.Sprintf("%v healthy first (a warm fleet), then the failure", s.warmup)
	}
	res := &Result{
		ID: 12, Key: "fleet", Title: "A fleet of quiet clients",
		Setup: fmt.Sprintf("%d clients, each with its own ClientConn and (suite rows) its own interceptor.Client, "+
			"each sending %g Puts/s open loop (%.0f calls/s; offsets seeded, the same calls in every row) to one origin on 127.0.0.1; "+
			"%s; for %v each attempt fails with UNAVAILABLE with probability p (seeded by request id and attempt). "+
			"Counts are of the failure's calls: first = those due in its first %v, after = the rest. "+
			"at server = attempts that reached the server, origin = those that reached the handler (they differ behind the suite's server). "+
			"p99 = the calls' latency; calls/s = sent on schedule (asked). "+
			"Cells side by side, each with its own origin, while their calls/s × (1 + p + p²) add up to at most %d.",
			s.clients, s.rate, s.askedRate(), warm, s.failure, s.settle, fleetMaxConcurrentAttempts),
		cols: []col{colVariant, colPolicy, colCalls, colFleetSent, colOrigin, colAmpl, colFleetFirst, colFleetAfter,
			colFleetAfterAmpl, colFleetSentAfterAmpl, colOKPct, colErrors, colRefused, colP99, colFleetRate},
	}
	var jobs []*fleetJob
	for _, p := range s.ps {
		for _, f := range rows {
			jobs = append(jobs, &fleetJob{f: f, p: p})
		}
	}
	// A batch's cells are all set up before their common start, and torn
	// down after they have all ended; the next batch starts after that.
	// So no cell's set-up or teardown falls in another cell's measured
	// time. The cells that fell behind their schedule run again, in
	// batches of half the attempts; a cell that falls behind alone is an
	// error.
	for pending, most := jobs, float64(fleetMaxConcurrentAttempts); len(pending) > 0; most /= 2 {
		var behind []*fleetJob
		batches := s.batches(pending, most)
		for _, b := range batches {
			if err := s.runBatch(ctx, b); err != nil {
				return nil, fmt.Errorf("%s, %w", res.Title, err)
			}
			for _, j := range b {
				switch {
				case j.err == nil:
				case errors.Is(j.err, errBehind) && len(b) > 1:
					behind = append(behind, j)
				default:
					return nil, fmt.Errorf("%s, p=%g, %s (%d cell(s) side by side): %w", res.Title, j.p, j.f.p.name, len(b), j.err)
				}
			}
		}
		res.Notes = append(res.Notes, fmt.Sprintf("%d cell(s) in %d batch(es) of at most %.0f attempts/s.", len(pending), len(batches), most))
		if len(behind) > 0 {
			var names []string
			for _, j := range behind {
				names = append(names, fmt.Sprintf("p=%g %s", j.p, j.f.p.name))
			}
			res.Notes = append(res.Notes, fmt.Sprintf("%d fell behind and ran again: %s (first: %v).",
				len(behind), strings.Join(names, ", "), behind[0].err))
		}
		pending = behind
	}
	for _, j := range jobs {
		res.Rows = append(res.Rows, j.row)
	}
	return res, nil
}

// attempts estimates from above the attempts per second of f at p: the
// fleet's calls per second times what three attempts on independent
// failures send on average (one for no retries).
func (s fleetShape) attempts(f fleetRow, p float64) float64 {
	if f.p.key == noRetries {
		return s.askedRate()
	}
	return s.askedRate() * (1 + p + p*p)
}

// batches packs jobs into batches whose attempts add up to at most most
// and whose clients to at most fleetMaxConcurrentClients (a job that
// alone exceeds them is a batch of its own): first fit, dearest first.
func (s fleetShape) batches(jobs []*fleetJob, most float64) [][]*fleetJob {
	sorted := slices.Clone(jobs)
	slices.SortStableFunc(sorted, func(a, b *fleetJob) int {
		return cmp.Compare(s.attempts(b.f, b.p), s.attempts(a.f, a.p))
	})
	var out [][]*fleetJob
	var load []float64
	for _, j := range sorted {
		a, placed := s.attempts(j.f, j.p), false
		for i := range out {
			if load[i]+a <= most && (len(out[i])+1)*s.clients <= fleetMaxConcurrentClients {
				out[i], load[i], placed = append(out[i], j), load[i]+a, true
				break
			}
		}
		if !placed {
			out, load = append(out, []*fleetJob{j}), append(load, a)
		}
	}
	return out
}

// fleetJob is one cell to run, and its row or why it has none.
type fleetJob struct {
	f   fleetRow
	p   float64
	row Row
	err error
}

// runBatch sets up the jobs' cells, runs their load from one common start,
// and fills in their rows (or errors). It returns an error if the cells
// could not be set up or ctx ended.
func (s fleetShape) runBatch(ctx context.Context, jobs []*fleetJob) error {
	cells := make([]*fleetCell, len(jobs))
	defer func() {
		for _, c := range cells {
			if c != nil {
				c.close()
			}
		}
	}()
	for i, j := range jobs {
		c, err := s.newFleetCell(ctx, j.f, j.p)
		cells[i] = c
		if err != nil {
			return fmt.Errorf("p=%g, %s: %w", j.p, j.f.p.name, err)
		}
	}
	start := time.Now().Add(100 * time.Millisecond)
	var wg sync.WaitGroup
	for _, c := range cells {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.drive(ctx, c.clients, start, &c.tally)
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return err
	}
	for i, c := range cells {
		jobs[i].row, jobs[i].err = c.row()
	}
	return nil
}

// fleetChecks returns the bounds of the fleet scenario, per failure
// probability: for the suite's client rows the fleet's load (attempts
// sent ÷ calls) after the failure's first seconds and over the whole
// failure (plus a start-up burst per client), and their availability
// against no retries and against grpc-go's retryThrottling; for the rows
// with the suite's server the load at the handler after the first
// seconds, whatever the clients.
func fleetChecks(r *Result) []Check {
	var out []Check
	add := func(p policyKey, what, want, got string, ok bool) {
		out = append(out, Check{Scenario: r.ID, Row: string(p), What: what, Want: want, Got: got, OK: ok})
	}
	var variants []string
	for _, row := range r.Rows {
		if !slices.Contains(variants, row.Variant) {
			variants = append(variants, row.Variant)
		}
	}
	for _, v := range variants {
		none, thr := r.row(noRetries, v), r.row(grpcThrottled, v)
		for _, key := range []policyKey{suiteClientOnly, suiteDefaults} {
			row := r.row(key, v)
			if row == nil || row.Fleet == nil {
				continue
			}
			st := row.Fleet
			add(key, fmt.Sprintf("fleet %s: load after the first %gs", v, st.SettleS), fmt.Sprintf("≤ %.2f×", maxFleetLoad),
				fmt.Sprintf("%d ÷ %d = %.3f×", st.After.Sent, st.After.Calls, st.After.SentAmplification),
				st.After.SentAmplification <= maxFleetLoad+1e-9)
			allowed := maxFleetLoad
			if row.Calls > 0 {
				allowed += float64(fleetBurst*st.Clients) / float64(row.Calls)
			}
			add(key, fmt.Sprintf("fleet %s: load over the failure", v), fmt.Sprintf("≤ %.3f×", allowed),
				fmt.Sprintf("%d ÷ %d = %.3f×", st.Sent, row.Calls, st.SentAmplification), st.SentAmplification <= allowed+1e-9)
			if none != nil {
				add(key, fmt.Sprintf("fleet %s: ok ≥ no retries'", v), fmt.Sprintf("≥ %.1f%%", none.okPercent()),
					fmt.Sprintf("%.1f%%", row.okPercent()), row.okPercent() >= none.okPercent())
			}
			if thr != nil && thr.Fleet != nil {
				what := fmt.Sprintf("fleet %s: ok ≥ retryThrottling's − %.1f where it sends no more", v, fleetThrottleSlack)
				if thr.Fleet.Sent > st.Sent {
					add(key, what, "-", fmt.Sprintf("throttle sent more (%d > %d)", thr.Fleet.Sent, st.Sent), true)
				} else {
					add(key, what, fmt.Sprintf("≥ %.1f%%", thr.okPercent()-fleetThrottleSlack),
						fmt.Sprintf("%.1f%% (throttle sent %d ≤ %d)", row.okPercent(), thr.Fleet.Sent, st.Sent),
						row.okPercent() >= thr.okPercent()-fleetThrottleSlack-1e-9)
				}
			}
		}
		for _, key := range []policyKey{suiteDefaults, grpcSuiteServer} {
			row := r.row(key, v)
			if row == nil || row.Fleet == nil {
				continue
			}
			a := row.Fleet.After
			add(key, fmt.Sprintf("fleet %s: load at the handler after the first %gs", v, row.Fleet.SettleS), fmt.Sprintf("≤ %.2f×", maxFleetLoad),
				fmt.Sprintf("%d ÷ %d = %.3f×", a.Origin, a.Calls, a.Amplification), a.Amplification <= maxFleetLoad+1e-9)
		}
	}
	return out
}

// joinFloats formats ps as -fleet-p takes them.
func joinFloats(ps []float64) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = strconv.FormatFloat(p, 'g', -1, 64)
	}
	return strings.Join(s, ",")
}
