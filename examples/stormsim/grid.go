package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/stormguard/stormguard/examples/internal/fleetsim"
)

// The grid: failure modes × fleet shapes, every rival against the suite's
// defaults, on one target (3 backends × 8 workers × 10 ms, 2,400
// requests a second, a queue of 256 each) that every shape loads at 1,000
// calls a second: 60 s of calls, the failure from 10 s to 40 s, a 2 s
// deadline.
const (
	gridSeconds = 60 * time.Second
	gridFrom    = 10 * time.Second
	gridTo      = 40 * time.Second
	// gridSlack is how much more ok % a rival that sends no more load must
	// have to dominate the suite, in points; gridLoadSlack how much less
	// load the suite must send to be better on load.
	gridSlack     = 0.5
	gridLoadSlack = 0.01
	// gridBound is the load the suite promises, which a rival must keep to
	// be the suite's comparison in a cell.
	gridBound = 1.10
)

// gridShape is a fleet of the grid.
type gridShape struct {
	name   string
	groups []fleetsim.Group
}

// gridMode is a failure of the grid.
type gridMode struct {
	name    string
	failure fleetsim.Failure
}

func gridShapes() []gridShape {
	return []gridShape{
		{"1 × 1,000/s", []fleetsim.Group{{Clients: 1, Rate: 1000, Jitter: 1}}},
		{"200 × 5/s", []fleetsim.Group{{Clients: 200, Rate: 5, Jitter: 1}}},
		{"10,000 × 0.1/s", []fleetsim.Group{{Clients: 10_000, Rate: 0.1, Jitter: 1}}},
		{"mix: 10 × 50/s + 5,000 × 0.1/s", []fleetsim.Group{{Clients: 10, Rate: 50, Jitter: 1}, {Clients: 5000, Rate: 0.1, Jitter: 1}}},
	}
}

func gridModes() []gridMode {
	f := func(m fleetsim.Mode) fleetsim.Failure { return fleetsim.Failure{Mode: m, Start: gridFrom, End: gridTo} }
	ind := func(p float64) fleetsim.Failure { x := f(fleetsim.Independent); x.P = p; return x }
	cap5 := f(fleetsim.CapacityDrop)
	cap5.Factor = 5
	tail := f(fleetsim.LatencyTail)
	tail.P, tail.Factor = 0.1, 20
	thr := f(fleetsim.Throttling)
	thr.Limit, thr.Pushback = 200, 500*time.Millisecond
	return []gridMode{
		{"independent failures, p = 0.1", ind(0.1)},
		{"independent failures, p = 0.5", ind(0.5)},
		{"one backend of 3 dead", f(fleetsim.BackendDead)},
		{"full outage", f(fleetsim.Outage)},
		{"capacity drop to 1/5", cap5},
		{"latency tail: 10% of requests 20× slower", tail},
		{"throttling at 200/s per backend, pushback 500 ms", thr},
	}
}

// gridConfig is the grid's cell of mode m and shape s, without policies.
func gridConfig(m gridMode, s gridShape) fleetsim.Config {
	return fleetsim.Config{
		Groups:   s.groups,
		Backends: fleetsim.Backends{M: 3, Workers: 8, Queue: 256, Service: 10 * time.Millisecond, RTT: time.Millisecond},
		Failure:  m.failure, Duration: gridSeconds, Deadline: 2 * time.Second, Seed: 1,
	}
}

// cell is one cell of the grid: every row's result, and the verdict.
type cell struct {
	mode, shape string
	rows        []*fleetsim.Result // the rivals, then the suite
	verdict     verdict
}

// verdict compares the suite with the rivals in a cell.
type verdict struct {
	// dominatedBy names a rival that sends no more load and has a higher
	// ok % (by more than gridSlack): the suite must never have one.
	dominatedBy string
	// best is the rival the suite is compared with: the one with the
	// highest ok % among those within the bound (then the least load).
	best *fleetsim.Result
	// win: the suite is better than best (see better); lose: best is
	// better than the suite; neither: a tie.
	win, lose bool
}

// better reports whether a (load, ok %) is better than b: its ok % is
// higher by more than gridSlack, or its load lower by more than
// gridLoadSlack at an ok % no lower by more than gridSlack.
func better(al, ao, bl, bo float64) bool {
	return ao > bo+gridSlack || (al < bl-gridLoadSlack && ao >= bo-gridSlack)
}

// String is the verdict as the README's grid prints it.
func (v verdict) String() string {
	switch {
	case v.dominatedBy != "":
		return "DOMINATED by " + v.dominatedBy
	case v.win:
		return "stormguard"
	case v.lose:
		return "rival: " + v.best.Name
	}
	return "tie: " + v.best.Name
}

// judge returns the verdict of a cell whose last row is the suite's.
func judge(rows []*fleetsim.Result) verdict {
	suite, rivals := rows[len(rows)-1], rows[:len(rows)-1]
	sl, so := suite.Window.Load(), suite.Window.OKPercent()
	var v verdict
	for _, r := range rivals {
		l, ok := r.Window.Load(), r.Window.OKPercent()
		if l <= sl && ok > so+gridSlack && v.dominatedBy == "" {
			v.dominatedBy = r.Name
		}
		if l > gridBound {
			continue
		}
		if b := v.best; b == nil || ok > b.Window.OKPercent() || (ok == b.Window.OKPercent() && l < b.Window.Load()) {
			v.best = r
		}
	}
	bl, bo := v.best.Window.Load(), v.best.Window.OKPercent()
	v.win, v.lose = better(sl, so, bl, bo), better(bl, bo, sl, so)
	return v
}

// overBound reports whether a row's load over the failure is above the
// bound (as printed, to two decimals).
func overBound(r *fleetsim.Result) bool { return r.Window.Load() >= gridBound+0.005 }

// runGridCells runs every cell of the grid.
func runGridCells() ([]*cell, error) {
	rows, err := fleetsim.SelectRows("grid")
	if err != nil {
		return nil, err
	}
	var cells []*cell
	var cfgs []fleetsim.Config
	for _, m := range gridModes() {
		for _, s := range gridShapes() {
			cells = append(cells, &cell{mode: m.name, shape: s.name})
			for _, r := range rows {
				c := gridConfig(m, s)
				c.Client, c.Server = r.Client, r.Server
				cfgs = append(cfgs, c)
			}
		}
	}
	res, err := fleetsim.RunAll(cfgs)
	if err != nil {
		return nil, err
	}
	for i, c := range cells {
		c.rows = res[i*len(rows) : (i+1)*len(rows)]
		for j, r := range c.rows {
			r.Policy, r.Name = rows[j].Key, rows[j].Name
		}
		c.verdict = judge(c.rows)
	}
	return cells, nil
}

// runGrid runs the grid and prints it as the README shows it: per mode,
// each row's load and ok % in each shape; then the verdicts.
func runGrid(w io.Writer, _ options) error {
	start := time.Now()
	cells, err := runGridCells()
	if err != nil {
		return err
	}
	writeGrid(w, cells)
	fmt.Fprintf(w, "\n%d cells × %d rows in %.1fs of wall time; %s.\n", len(cells), len(cells[0].rows), time.Since(start).Seconds(), machine())
	return nil
}

// writeGrid prints the grid's tables in Markdown.
func writeGrid(w io.Writer, cells []*cell) {
	shapes := gridShapes()
	for mi, m := range gridModes() {
		fmt.Fprintf(w, "\n**%s** (load × over the failure, ok %%)\n\n| row |", m.name)
		for _, s := range shapes {
			fmt.Fprintf(w, " %s |", s.name)
		}
		fmt.Fprintf(w, "\n| --- |%s\n", strings.Repeat(" --- |", len(shapes)))
		row := cells[mi*len(shapes)]
		for j := range row.rows {
			name := row.rows[j].Name
			if j == len(row.rows)-1 {
				name = "**" + name + "**"
			}
			fmt.Fprintf(w, "| %s |", name)
			for si := range shapes {
				r := cells[mi*len(shapes)+si].rows[j]
				fmt.Fprintf(w, " %.2f×, %.1f%% |", r.Window.Load(), r.Window.OKPercent())
			}
			fmt.Fprintln(w)
		}
	}
	fmt.Fprintf(w, "\n**Verdicts**\n\n| failure | fleet | stormguard | best rival within %.2f× | verdict |\n| --- | --- | --- | --- | --- |\n", gridBound)
	wins, over := 0, 0
	for _, c := range cells {
		s, b := c.rows[len(c.rows)-1], c.verdict.best
		mark := ""
		if overBound(s) {
			mark = " (over 1.10×)"
		}
		fmt.Fprintf(w, "| %s | %s | %.2f×, %.1f%%%s | %s: %.2f×, %.1f%% | %s |\n", c.mode, c.shape,
			s.Window.Load(), s.Window.OKPercent(), mark, b.Name, b.Window.Load(), b.Window.OKPercent(), c.verdict)
		if c.verdict.win {
			wins++
			if overBound(s) {
				over++
			}
		}
	}
	fmt.Fprintf(w, "\nThe suite is better than the best rival within %.2f× in %d of %d cells, %d of them at a load over 1.10×.\n", gridBound, wins, len(cells), over)
}
