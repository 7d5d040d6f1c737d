package fleetsim

import (
	"fmt"
	"strconv"
	"time"
)

// LabSeed is the storm lab's seed (examples/stormlab, labSeed): its fleet's
// offsets and its origin's choice of failing attempts.
const LabSeed = 2026

// The storm lab's backoff for every retrying row: 1 ms doubling to 10 ms.
const (
	labBase = time.Millisecond
	labMax  = 10 * time.Millisecond
)

// LabRow is one row of a cell the model shares with the storm lab: the
// model's setup, and the lab's figure from its README's full run
// (examples/stormlab/README.md, "One run": 2026-12-01, go1.26.8, 2 vCPUs),
// but for the fleet's cells, which are of a run of the fleet alone since
// the server charges every retry (go run ./examples/stormlab -scenario
// fleet, 2026-12-02, the same machine).
// Unchecked, when set, says why the row is not held to the lab's figure.
type LabRow struct {
	Row       Row
	LabLoad   float64 // the lab's attempts at the handler per call
	LabOK     float64 // the lab's ok %
	Unchecked string
}

// LabCell is a cell of the storm lab run in the model.
type LabCell struct {
	Name string
	Cfg  Config
	Rows []LabRow
	// Load and OK read the model's figures from a row's result.
	Load func(*Result) float64
	OK   func(*Result) float64
}

// The tolerances the model is held to on the lab's cells.
const (
	LabLoadTolerance = 0.02
	LabOKTolerance   = 1.5
)

// labRTT is the round trip of the lab's loopback RPCs, about.
const labRTT = 300 * time.Microsecond

func labRows(suite bool) []Row {
	grpc, thr := PolicyGRPCWith(false, labBase, labMax), PolicyGRPCWith(true, labBase, labMax)
	rows := []Row{
		{Key: "none", Name: "no retries", Client: PolicyNone()},
		{Key: "grpc", Name: "grpc-go retryPolicy", Client: grpc},
		{Key: "grpc-throttle", Name: "grpc-go retryPolicy+throttling", Client: thr},
	}
	if suite {
		s := PolicySuiteWith(SuiteOptions{BackoffBase: labBase, BackoffMax: labMax})
		rows = append(rows,
			Row{Key: KeySuiteClientOnly, Name: "stormguard client, plain server", Client: s},
			Row{Key: KeySuite, Name: "stormguard client + server", Client: s, Server: PolicySuiteServer()},
			Row{Key: KeyGRPCSuiteServer, Name: "grpc-go retryPolicy, stormguard server", Client: grpc, Server: PolicySuiteServer()})
	}
	return rows
}

// labFleet is the storm lab's fleet scenario (12) at p: 100 clients × 5
// calls a second, strictly periodic at the lab's offsets, 2 s healthy,
// then 10 s of independent failures drawn as the lab's origin draws them
// (by request id and attempt); the figures are of the failure's calls.
func labFleet(p float64, lab [][2]float64) LabCell {
	cfg := Config{
		Groups:   []Group{{Clients: 100, Rate: 5}},
		Backends: Backends{M: 1, RTT: labRTT},
		Failure:  Failure{Mode: Independent, P: p, Start: 2 * time.Second, End: 13 * time.Second},
		Duration: 12 * time.Second, Deadline: 2 * time.Second, Seed: LabSeed,
		Draw: func(client, k, attempt int, due time.Duration) float64 {
			ph := byte('f')
			if due >= 7*time.Second {
				ph = 'a'
			}
			return LabUniform(LabSeed, fmt.Sprintf("%c%d.%d", ph, client, k), attempt)
		},
	}
	c := LabCell{Name: fmt.Sprintf("fleet of 100 × 5/s, p = %g", p), Cfg: cfg,
		Load: func(r *Result) float64 { return r.Window.HandlerLoad() }, OK: func(r *Result) float64 { return r.Window.OKPercent() }}
	for i, r := range labRows(true) {
		c.Rows = append(c.Rows, LabRow{Row: r, LabLoad: lab[i][0], LabOK: lab[i][1]})
	}
	return c
}

// labIndependent is the lab's independent failures (6) at p = 0.5: 2,000
// calls one after the other, 1 ms apart, the suite's clock virtual (its
// retries fall in the same millisecond: the model gives the suite a
// backoff of a nanosecond).
func labIndependent() LabCell {
	cfg := Config{
		Groups:   []Group{{Clients: 1, Rate: 1000}},
		Backends: Backends{M: 1},
		Failure:  Failure{Mode: Independent, P: 0.5, Start: 0, End: 3 * time.Second},
		Duration: 2 * time.Second, Deadline: 2 * time.Second, Seed: LabSeed,
		Draw: func(_, k, attempt int, _ time.Duration) float64 {
			return LabUniform(LabSeed, strconv.Itoa(k), attempt)
		},
	}
	grpc, thr := PolicyGRPCWith(false, time.Nanosecond, time.Nanosecond), PolicyGRPCWith(true, time.Nanosecond, time.Nanosecond)
	s := PolicySuiteWith(SuiteOptions{BackoffBase: time.Nanosecond, BackoffMax: time.Nanosecond})
	return LabCell{Name: "independent failures, p = 0.5, 2,000 calls in sequence", Cfg: cfg,
		Load: func(r *Result) float64 { return r.Window.HandlerLoad() }, OK: func(r *Result) float64 { return r.Window.OKPercent() },
		Rows: []LabRow{
			{Row: Row{Key: "none", Name: "no retries", Client: PolicyNone()}, LabLoad: 1, LabOK: 49.55},
			{Row: Row{Key: "grpc", Name: "grpc-go retryPolicy", Client: grpc}, LabLoad: 1.7565, LabOK: 88.0},
			{Row: Row{Key: "grpc-throttle", Name: "grpc-go retryPolicy+throttling", Client: thr}, LabLoad: 1.002, LabOK: 49.6},
			{Row: Row{Key: KeySuite, Name: "stormguard defaults", Client: s, Server: PolicySuiteServer()}, LabLoad: 1.10, LabOK: 54.1},
		}}
}

// labOutage is the lab's outage (1): 50 concurrent callers through one
// client against an origin that answers UNAVAILABLE to everything, then
// 50 more through the same client (here each caller's second call comes
// 100 ms after its first ended, when every first call has); the figures
// are each wave's requests at the origin per call.
func labOutage(wave int) LabCell {
	cfg := Config{
		Groups:   []Group{{Clients: 1, Workers: 50, Calls: 100, Think: 100 * time.Millisecond}},
		Backends: Backends{M: 1, RTT: labRTT},
		Failure:  Failure{Mode: Outage, Start: 0, End: time.Minute},
		Duration: 10 * time.Second, Deadline: 10 * time.Second, Seed: LabSeed, Step: time.Millisecond,
		Settle: 50 * time.Millisecond, // wave 1 is due at the workers' phase, under 1 ms; wave 2 after 100 ms
	}
	lab := [][2]float64{{1, 0}, {3, 0}, {54.0 / 50, 0}, {1, 0}}
	pick := func(r *Result) Window { return r.First }
	if wave == 2 {
		lab = [][2]float64{{1, 0}, {3, 0}, {1, 0}, {0, 0}}
		pick = func(r *Result) Window { return r.After }
	}
	c := LabCell{Name: fmt.Sprintf("outage, 50 callers, wave %d", wave), Cfg: cfg,
		Load: func(r *Result) float64 { return pick(r).HandlerLoad() }, OK: func(r *Result) float64 { return pick(r).OKPercent() }}
	for i, r := range labRows(true)[:3] {
		c.Rows = append(c.Rows, LabRow{Row: r, LabLoad: lab[i][0], LabOK: lab[i][1]})
	}
	s := labRows(true)[4]
	s.Name = "stormguard defaults"
	c.Rows = append(c.Rows, LabRow{Row: s, LabLoad: lab[3][0], LabOK: lab[3][1]})
	return c
}

// labBackendDead is the lab's one backend of 2 dead (9): 2,000 calls from
// 8 workers of one client, round robin over 2 backends, the first
// answering UNAVAILABLE to everything.
func labBackendDead() LabCell {
	cfg := Config{
		Groups:   []Group{{Clients: 1, Workers: 8, Calls: 2000}},
		Backends: Backends{M: 2, RTT: labRTT},
		Failure:  Failure{Mode: BackendDead, Start: 0, End: time.Minute},
		Duration: 30 * time.Second, Deadline: 2 * time.Second, Seed: LabSeed,
	}
	rows := labRows(true)
	return LabCell{Name: "one backend of 2 dead, 8 workers", Cfg: cfg,
		Load: func(r *Result) float64 { return r.All.HandlerLoad() }, OK: func(r *Result) float64 { return r.All.OKPercent() },
		Rows: []LabRow{
			{Row: rows[0], LabLoad: 1.00, LabOK: 50.1},
			{Row: rows[1], LabLoad: 1.782, LabOK: 89.3, Unchecked: transportTiming},
			{Row: rows[2], LabLoad: 1.0025, LabOK: 54.4, Unchecked: transportTiming},
			{Row: Row{Key: KeySuite, Name: "stormguard defaults", Client: rows[4].Client, Server: rows[4].Server}, LabLoad: 1.0045, LabOK: 100},
		}}
}

// transportTiming is why the model does not match the lab's retrying
// rows with one backend of 2 dead: where grpc-go's round_robin sends an
// attempt depends on the order in which the lab's 8 workers reach its
// picker and on which connection was ready first, which a real transport
// decides (the lab's no-retries row sent 997 of 2,000 calls to the dead
// backend, its throttled row 918 of 2,005, and its retryPolicy row 88.7%
// to 89.3% ok from run to run); the model's picks interleave at random.
const transportTiming = "timing inside a real transport: the order of the workers' picks in grpc-go's round_robin"

// LabCells returns the cells the model shares with the storm lab, with
// the lab's figures.
func LabCells() []LabCell {
	return []LabCell{
		labFleet(0.3, [][2]float64{{1, 69.5}, {1.4006, 97.2}, {1.1104, 77.1}, {1.1268, 78.1}, {1.1188, 77.5}, {1.1406, 79.1}}),
		labFleet(0.5, [][2]float64{{1, 48.8}, {1.7716, 86.6}, {1.0894, 53.2}, {1.1282, 55.1}, {1.1290, 55.2}, {1.1264, 54.8}}),
		labFleet(0.9, [][2]float64{{1, 9.9}, {2.7178, 25.6}, {1.068, 10.6}, {1.12, 11.1}, {1.1168, 11.1}, {1.1202, 11.0}}),
		labFleet(1, [][2]float64{{1, 0}, {3, 0}, {1.06, 0}, {1.0474, 0}, {1.0374, 0}, {1.1188, 0}}),
		labIndependent(),
		labOutage(1),
		labOutage(2),
		labBackendDead(),
	}
}

// LabResult is a row of a lab cell run in the model.
type LabResult struct {
	LabRow
	Load, OK float64
	Result   *Result
}

// Within reports whether the model's figures are within the tolerances
// of the lab's.
func (r LabResult) Within() bool {
	return abs(r.Load-r.LabLoad) <= LabLoadTolerance+1e-9 && abs(r.OK-r.LabOK) <= LabOKTolerance+1e-9
}

func abs(x float64) float64 { return max(x, -x) }

// Run runs the cell's rows in the model.
func (c LabCell) Run() ([]LabResult, error) {
	rows := make([]Row, len(c.Rows))
	for i, r := range c.Rows {
		rows[i] = r.Row
	}
	res, err := RunRows(c.Cfg, rows)
	if err != nil {
		return nil, err
	}
	out := make([]LabResult, len(res))
	for i, r := range res {
		out[i] = LabResult{LabRow: c.Rows[i], Load: c.Load(r), OK: c.OK(r), Result: r}
	}
	return out, nil
}
