package main

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
	"github.com/stormguard/stormguard/overload"
)

// mixedShape is the mixed-fleet overload: an origin of 4 workers × 20 ms
// (200/s) at 90% (180 calls/s, 1 s deadlines), whose capacity halves
// (40 ms a request) for a while, called by a fleet of mixedClients
// clients, each with its own ClientConn. A proxy's upstream timeout
// (mixedUpstream) bounds each attempt at the origin: when it passes, the
// attempt is answered UNAVAILABLE and cancelled, and the origin's handler,
// deaf to its context, keeps the work queued. Once the queue holds more
// than that, every attempt fails and is worked for nobody, and each retry
// of it adds another. The drop lasts each of mixedDrops.
var mixedShape = shape{
	workers: 4, service: 20 * time.Millisecond, queue: 500, rate: 180,
	deadline: time.Second, slow: 40 * time.Millisecond,
	before: 2 * time.Second, after: 4 * time.Second,
}

// mixedUpstream is the proxy's upstream timeout in front of mixedShape's
// origin: 15 service times at full capacity, 7.5 in the drop.
const mixedUpstream = 300 * time.Millisecond

// upstreamTimeout is a proxy's upstream timeout, in front of the origin's
// server chain: each attempt gets d at most (as its deadline, which the
// server chain after it sees, as a proxy's grpc-timeout), and when d
// passes first, it is answered UNAVAILABLE at once while the handler,
// whose context ends then, runs on by itself.
func upstreamTimeout(d time.Duration) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		ctx, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		type answer struct {
			resp any
			err  error
		}
		done := make(chan answer, 1)
		go func() {
			resp, err := handler(ctx, req)
			done <- answer{resp, err}
		}()
		select {
		case a := <-done:
			return a.resp, a.err
		case <-ctx.Done():
			return nil, status.Error(codes.Unavailable, "proxy: upstream timeout")
		}
	}
}

// mixedDrops are the lengths of the capacity drop, one variant each. The
// 60 s one runs in real time, as the others do.
var mixedDrops = []time.Duration{time.Second, 10 * time.Second, 60 * time.Second}

// The fleet and its bounds.
const (
	mixedClients = 20 // each with its own ClientConn; in a mixed fleet, every other one is grpc-go's
	// mixedGRPCAttempts is the grpc-go clients' retryPolicy maxAttempts
	// (no retryThrottling).
	mixedGRPCAttempts = 5
	// mixedPerTry is the per-attempt timeout of the suite's clients in the
	// row that has one.
	mixedPerTry = 100 * time.Millisecond
	// During the drop the protected rows answer callers still waiting at
	// least minDropGoodput of the reduced capacity; from maxRecovery99
	// after its end on, every second's calls succeed at least min99 of
	// the time.
	minDropGoodput = 0.9
	maxRecovery99  = 1.0
	min99          = 0.99
)

// mixedRow is a row of the scenario: who the clients are, and whether the
// origin runs behind the suite's server.
type mixedRow struct {
	key         policyKey
	name        string
	suiteServer bool
	grpcShare   int           // of every two clients, how many are grpc-go's (the others the suite's); -1: no retries
	perTry      time.Duration // the suite's clients' per-attempt timeout (0: none)
}

// The scenario's rows.
const (
	mixedControl   policyKey = "mixed-control"   // the mixed fleet, no server protection
	mixedSuite     policyKey = "mixed-suite"     // the mixed fleet, the suite's server
	mixedSuitePT   policyKey = "mixed-suite-pt"  // ... the suite's clients with a per-attempt timeout
	mixedGRPCSuite policyKey = "mixed-grpc-only" // every client grpc-go's, the suite's server
)

func mixedRows() []mixedRow {
	return []mixedRow{
		{noRetries, "no retries, plain server", false, -1, 0},
		{mixedControl, "mixed fleet, no server protection", false, 1, 0},
		{mixedSuite, "mixed fleet, stormguard server", true, 1, 0},
		{mixedSuitePT, "mixed fleet (suite: per-try 100ms), stormguard server", true, 1, mixedPerTry},
		{mixedGRPCSuite, "every client grpc-go, stormguard server", true, 2, 0},
	}
}

// dial returns client i of the row's fleet, on its own ClientConn.
func (m mixedRow) dial(l *origin.Listener, i int) (*grpc.ClientConn, *interceptor.Client, error) {
	switch {
	case m.grpcShare < 0:
		cc, err := l.Dial()
		return cc, nil, err
	case i%2 < m.grpcShare:
		cc, err := grpc.NewClient(l.Target, l.ConnectOptions(grpc.WithDefaultServiceConfig(grpcServiceConfigWith(false, mixedGRPCAttempts)))...)
		return cc, nil, err
	}
	var extra []interceptor.ClientOption
	if m.perTry > 0 {
		extra = append(extra, interceptor.WithRetryPolicy(interceptor.RetryPolicy{PerAttemptTimeout: m.perTry}))
	}
	guard := interceptor.NewClient(policy{key: suiteDefaults}.clientOptions(extra...)...)
	cc, err := grpc.NewClient(l.Target, l.ConnectOptions(guard.DialOptions()...)...)
	if err != nil {
		_ = guard.Close()
		return nil, nil, err
	}
	return cc, guard, nil
}

// mixedCell runs one row with a drop of s.trigger.
func mixedCell(ctx context.Context, s shape, m mixedRow) (Row, error) {
	o := newQueueOrigin(s.workers, s.queue, s.service)
	defer o.close()
	l, err := origin.TCP()
	if err != nil {
		return Row{}, err
	}
	sopts := []grpc.ServerOption{grpc.ChainUnaryInterceptor(upstreamTimeout(mixedUpstream))}
	var guards []*overload.Guard
	if m.suiteServer {
		g := overload.New(overload.Config{})
		guards = append(guards, g)
		srv := interceptor.NewServer(interceptor.WithOverload(g))
		sopts = append(sopts, grpc.ChainUnaryInterceptor(srv.Unary()), grpc.ChainStreamInterceptor(srv.Stream()))
	}
	server := origin.Serve(l, o, sopts...)
	defer server.Stop()
	var conns []*grpc.ClientConn
	var clients []echov1.EchoServiceClient
	defer func() {
		for _, cc := range conns {
			_ = cc.Close()
		}
	}()
	for i := range mixedClients {
		cc, guard, err := m.dial(l, i)
		if err != nil {
			return Row{}, err
		}
		conns = append(conns, cc)
		if guard != nil {
			defer guard.Close()
		}
		clients = append(clients, echov1.NewEchoServiceClient(cc))
	}
	if err := connectAll(ctx, conns); err != nil {
		return Row{}, err
	}
	start := time.Now().Add(50 * time.Millisecond)
	var wg sync.WaitGroup
	s.drop(ctx, o, start, &wg)
	t := &tally{offered: make([]int, s.steps()), ok: make([]int, s.steps()), answered: make([]int, s.steps())}
	openLoop(ctx, s, clients, start, t)
	wg.Wait()
	if ctx.Err() != nil {
		return Row{}, ctx.Err()
	}
	return mixedResult(s, m, t, o, guards), nil
}

// mixedResult fills the row of m from what its cell measured.
func mixedResult(s shape, m mixedRow, t *tally, o *queueOrigin, guards []*overload.Guard) Row {
	row := t.out.row(policy{m.key, m.name}, int(o.arrived.Load()))
	row.Variant = mixedVariant(s.trigger)
	wasted := int(o.wasted.Load())
	row.Wasted = &wasted
	row.Worked = int(o.worked.Load())
	good := t.goodput()
	rec := recovery(good, s.endStep())
	row.Recovery = &rec
	rec99 := recoveryAbove(t.windowed(int(time.Second/msStep)), s.endStep(), min99)
	row.Recovery99 = &rec99
	answered := 0
	for i := s.triggerStep(); i < s.endStep(); i++ {
		answered += t.answered[i]
	}
	row.DropGoodput = float64(answered) / s.trigger.Seconds() / s.lowCapacity()
	row.Goodput = t.perSecond()
	sec := int(time.Second / msStep)
	row.marks = []int{s.triggerStep() / sec, s.endStep() / sec}
	row.ServerRefused = serverRefusals(guards)
	row.Chart = 0
	return row
}

// mixedVariant names the variant of a drop of d.
func mixedVariant(d time.Duration) string { return "T=" + d.String() }

// Scenario 14: overload under a mixed fleet.
func overloadMixed(ctx context.Context) (*Result, error) {
	return overloadMixedWith(ctx, mixedShape, mixedDrops)
}

// overloadMixedWith runs scenario 14 on shape s, one variant per drop
// length: the rows without the suite's server side by side, then those
// with it.
func overloadMixedWith(ctx context.Context, s shape, drops []time.Duration) (*Result, error) {
	res := &Result{
		ID: 14, Key: "overload-mixed", Title: "Overload under a mixed fleet: grpc-go's retries and the suite's",
		Setup: fmt.Sprintf("An origin with %d workers × %v per request (%.0f/s), a FIFO queue of %d (full: UNAVAILABLE), "+
			"a handler that does not watch its context, behind a proxy's upstream timeout of %v (it answers UNAVAILABLE and cancels the attempt; the work stays queued); "+
			"%d Puts/s offered open-loop (%.0f%% of capacity), deadline %v, "+
			"from %d clients, each its own ClientConn: in a mixed fleet every other one is grpc-go's retryPolicy "+
			"(maxAttempts %d, no retryThrottling), the others the suite's client; from %v on, the service time is %v "+
			"(%.0f/s) for T. goodput per second: the share of the calls sent in it that succeeded; "+
			"drop goodput: answers that reached a caller still waiting during the drop, ÷ the reduced capacity; "+
			"recovery: from the drop's end until every later 250 ms step has ≥ %.0f%%; recovery 99%%: until every later second has ≥ %.0f%%.",
			s.workers, s.service, s.capacity(), s.queue, mixedUpstream, s.rate, 100*float64(s.rate)/s.capacity(), s.deadline,
			mixedClients, mixedGRPCAttempts, s.before, s.slow, s.lowCapacity(), 100*msGood, 100*min99),
		cols: []col{colVariant, colPolicy, colOrigin, colAmpl, colOK, colErrors, colWasted, colServerRefused,
			colDropGoodput, colRecovery, colRecovery99, colGoodput},
		StepS: time.Second.Seconds(),
	}
	for _, d := range drops {
		ds := s
		ds.trigger = d
		rows := mixedRows()
		out := make([]Row, len(rows))
		// The rows without the suite's server first, side by side, then
		// those with it: so that the storm of the first (up to 2.7× the
		// calls in attempts) does not take the machine from the others.
		for _, batch := range [][]int{{0, 1}, {2, 3, 4}} {
			errs := make([]error, len(rows))
			var wg sync.WaitGroup
			for _, i := range batch {
				wg.Add(1)
				go func() {
					defer wg.Done()
					out[i], errs[i] = mixedCell(ctx, ds, rows[i])
				}()
			}
			wg.Wait()
			for _, i := range batch {
				if errs[i] != nil {
					return nil, fmt.Errorf("%s, T=%v, %s: %w", res.Title, d, rows[i].name, errs[i])
				}
			}
		}
		res.Rows = append(res.Rows, out...)
	}
	return res, nil
}

// mixedDropStr formats a drop goodput.
func mixedDropStr(v float64) string {
	if v == 0 {
		return "-"
	}
	return strconv.FormatFloat(100*v, 'f', 0, 64) + "%"
}
