package main

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/stormguard/stormguard/examples/internal/fleetsim"
)

// report is one run of every selected row on one scenario.
type report struct {
	Machine  string        `json:"machine"`
	Scenario string        `json:"scenario"`
	Wall     time.Duration `json:"-"`
	WallS    float64       `json:"wall_s"`
	Rows     []rowJSON     `json:"rows"`
	results  []*fleetsim.Result
	cfg      fleetsim.Config
}

// rowJSON is one row's figures, as -json prints them.
type rowJSON struct {
	Key            string         `json:"key"`
	Name           string         `json:"name"`
	Server         string         `json:"server,omitempty"`
	Clients        int            `json:"clients"`
	Failure        windowJSON     `json:"failure"`
	First          windowJSON     `json:"first"`
	After          windowJSON     `json:"after"`
	All            windowJSON     `json:"all"`
	RecoveryS      *float64       `json:"recovery_s"`
	BurstPerClient float64        `json:"burst_per_client"`
	MaxRetries     int            `json:"max_retries_per_client"`
	RefusedFirst   int            `json:"refused_first"`
	RefusedRetry   int            `json:"refused_retry"`
	ServerRefused  int            `json:"server_refused"`
	Wasted         int            `json:"wasted"`
	ServerHeld     int            `json:"server_held"`
	ServerLeft     int            `json:"server_left"`
	Codes          map[string]int `json:"codes"`
	WallS          float64        `json:"wall_s"`
	Series         seriesJSON     `json:"series"`
	result         *fleetsim.Result
}

type windowJSON struct {
	FromS       float64 `json:"from_s"`
	ToS         float64 `json:"to_s"`
	Calls       int     `json:"calls"`
	OK          int     `json:"ok"`
	Sent        int     `json:"sent"`
	Handled     int     `json:"handled"`
	Load        float64 `json:"load"`
	HandlerLoad float64 `json:"handler_load"`
	OKPercent   float64 `json:"ok_percent"`
}

type seriesJSON struct {
	StepS   float64 `json:"step_s"`
	Calls   []int   `json:"calls"`
	OK      []int   `json:"ok"`
	Sent    []int   `json:"sent"`
	Handled []int   `json:"handled"`
}

func window(w fleetsim.Window) windowJSON {
	return windowJSON{FromS: w.From.Seconds(), ToS: w.To.Seconds(), Calls: w.Calls, OK: w.OK, Sent: w.Sent, Handled: w.Handled,
		Load: w.Load(), HandlerLoad: w.HandlerLoad(), OKPercent: w.OKPercent()}
}

func newReport(cfg fleetsim.Config, res []*fleetsim.Result, wall time.Duration) *report {
	rep := &report{Machine: machine(), Scenario: describe(cfg), Wall: wall, WallS: wall.Seconds(), results: res, cfg: cfg}
	for _, r := range res {
		row := rowJSON{
			Key: r.Policy, Name: r.Name, Server: r.Server, Clients: r.Clients,
			Failure: window(r.Window), First: window(r.First), After: window(r.After), All: window(r.All),
			BurstPerClient: r.BurstPerClient, MaxRetries: r.MaxRetries,
			RefusedFirst: r.RefusedFirst, RefusedRetry: r.RefusedRetry, ServerRefused: r.ServerRefused, Wasted: r.Wasted,
			ServerHeld: r.ServerHeld, ServerLeft: r.ServerLeft,
			Codes: r.Codes, WallS: r.Wall.Seconds(),
			Series: seriesJSON{StepS: r.Step.Seconds(), Calls: r.Calls, OK: r.OK, Sent: r.Sent, Handled: r.HandledAt},
			result: r,
		}
		if r.Ended && r.Recovery >= 0 {
			s := r.Recovery.Seconds()
			row.RecoveryS = &s
		}
		rep.Rows = append(rep.Rows, row)
	}
	return rep
}

// describe says what a configuration simulates, in one line.
func describe(cfg fleetsim.Config) string {
	var fleet []string
	for _, g := range cfg.Groups {
		fleet = append(fleet, fmt.Sprintf("%s × %s/s", count(g.Clients), strconv.FormatFloat(g.Rate, 'g', -1, 64)))
	}
	b := cfg.Backends
	target := fmt.Sprintf("%d backends × %d workers × %v (queue %d)", b.M, b.Workers, b.Service, b.Queue)
	if b.Workers == 0 {
		target = fmt.Sprintf("%d backends answering after %v", b.M, b.Service)
	}
	f := cfg.Failure
	what := f.Mode.String()
	switch f.Mode {
	case fleetsim.Independent:
		what = fmt.Sprintf("independent failures at p = %g", f.P)
	case fleetsim.BackendDead:
		what = fmt.Sprintf("one backend of %d dead", b.M)
	case fleetsim.CapacityDrop:
		what = fmt.Sprintf("capacity drop to 1/%g", f.Factor)
	case fleetsim.LatencyTail:
		what = fmt.Sprintf("latency tail: %g%% of requests %g× slower", 100*f.P, f.Factor)
	case fleetsim.Throttling:
		what = fmt.Sprintf("throttling at %g/s per backend (RESOURCE_EXHAUSTED, pushback %v)", f.Limit, f.Pushback)
	}
	if f.Mode != fleetsim.Healthy {
		what += fmt.Sprintf(" from %v to %v", f.Start, f.End)
	}
	return fmt.Sprintf("%s clients, %.0f calls/s, against %s, %s; %v of calls, deadline %v, seed %d",
		strings.Join(fleet, " + "), cfg.Rate(), target, what, cfg.Duration, cfg.Deadline, cfg.Seed)
}

// count formats n with thousands separators.
func count(n int) string {
	s := strconv.Itoa(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// recovery formats a run's recovery time.
func recovery(r *fleetsim.Result) string {
	switch {
	case !r.Ended:
		return "-"
	case r.Recovery < 0:
		return "never"
	default:
		return fmt.Sprintf("%.1fs", r.Recovery.Seconds())
	}
}

// writeText prints the report's table.
func (rep *report) writeText(w io.Writer) {
	fmt.Fprintf(w, "stormsim — %s\n%s\n", rep.Machine, rep.Scenario)
	fmt.Fprintf(w, "Over the failure's calls: load = attempts sent ÷ calls, at handler = attempts past the server policy ÷ calls; after = from %v into it; burst = (attempts − 1.10 × calls) ÷ clients; max retries = the most one client sent; recovery = from the failure's end until every 100 ms step has ≥ 90%% of its calls ok.\n\n",
		rep.cfg.Settle)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "row\tload\tat handler\tok %\tload after\tat handler after\tok % after\tburst/client\tmax retries\trecovery\trefused first/retry\tserver refused\twasted\twall\t")
	for _, row := range rep.Rows {
		r := row.result
		fmt.Fprintf(tw, "%s\t%.3f×\t%.3f×\t%.1f\t%.3f×\t%.3f×\t%.1f\t%+.2f\t%d\t%s\t%d/%d\t%d\t%d\t%.2fs\t\n",
			r.Name, r.Window.Load(), r.Window.HandlerLoad(), r.Window.OKPercent(), r.After.Load(), r.After.HandlerLoad(), r.After.OKPercent(),
			r.BurstPerClient, r.MaxRetries, recovery(r), r.RefusedFirst, r.RefusedRetry, r.ServerRefused, r.Wasted, r.Wall.Seconds())
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "\n%d row(s) in %.2fs of wall time.\n", len(rep.Rows), rep.Wall.Seconds())
}

// writeJSON prints the report as JSON.
func (rep *report) writeJSON(w io.Writer) error {
	e := json.NewEncoder(w)
	e.SetIndent("", "  ")
	return e.Encode(rep)
}

// writeCSV writes the table as CSV, one line per row.
func (rep *report) writeCSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	_ = cw.Write([]string{"key", "name", "server", "clients", "calls", "ok", "sent", "handled", "load", "handler_load", "ok_percent",
		"load_after", "ok_percent_after", "burst_per_client", "max_retries_per_client", "recovery_s", "refused_first", "refused_retry", "server_refused", "wasted"})
	f := func(x float64) string { return strconv.FormatFloat(x, 'f', 4, 64) }
	for _, row := range rep.Rows {
		r := row.result
		rec := ""
		if r.Ended && r.Recovery >= 0 {
			rec = f(r.Recovery.Seconds())
		}
		wd := r.Window
		_ = cw.Write([]string{r.Policy, r.Name, r.Server, strconv.Itoa(r.Clients), strconv.Itoa(wd.Calls), strconv.Itoa(wd.OK),
			strconv.Itoa(wd.Sent), strconv.Itoa(wd.Handled), f(wd.Load()), f(wd.HandlerLoad()), f(wd.OKPercent()),
			f(r.After.Load()), f(r.After.OKPercent()), f(r.BurstPerClient), strconv.Itoa(r.MaxRetries), rec,
			strconv.Itoa(r.RefusedFirst), strconv.Itoa(r.RefusedRetry), strconv.Itoa(r.ServerRefused), strconv.Itoa(r.Wasted)})
	}
	cw.Flush()
	return cw.Error()
}
