package main

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Row is one line of a scenario's table: one policy (and variant) and what
// it measured. Fields that a scenario does not measure stay zero and are
// neither printed nor written to JSON.
type Row struct {
	Policy  policyKey `json:"policy"`
	Label   string    `json:"label"`
	Variant string    `json:"variant,omitempty"` // e.g. "p=0.5", "deadline 100ms"
	// Calls is the number of logical calls (requests) the callers made.
	Calls int `json:"calls"`
	// Origin is the number of requests (attempts) that reached the origin.
	Origin int `json:"origin_requests"`
	// Amplification is Origin / Calls.
	Amplification float64 `json:"amplification"`
	// OK is the number of calls that succeeded.
	OK int `json:"ok"`
	// Errors counts the failed calls by status code.
	Errors map[string]int `json:"errors,omitempty"`
	// Refused counts, for the suite's rows, the failed calls whose retry
	// the suite refused, by reason (interceptor.RefusedBy).
	Refused map[string]int `json:"refused,omitempty"`
	// WouldRefuse counts, for the shadow-mode row, the refusals its budget
	// and breaker recorded without making them, by reason.
	WouldRefuse map[string]int `json:"would_refuse,omitempty"`
	// Latency of the calls, in milliseconds.
	P50ms  float64 `json:"p50_ms,omitempty"`
	P99ms  float64 `json:"p99_ms,omitempty"`
	P999ms float64 `json:"p999_ms,omitempty"`
	MaxMs  float64 `json:"max_ms,omitempty"`
	Wasted *int    `json:"wasted,omitempty"` // origin work finished after its caller left
	Worked int     `json:"worked,omitempty"` // requests the origin worked (a worker pool's scenarios)
	// The capacity-drop model: the most attempts in one tick, and the
	// requests served.
	Peak   int `json:"peak_per_tick,omitempty"`
	Served int `json:"served,omitempty"`
	// PeakAmplification is Peak / the requests per tick.
	PeakAmplification float64 `json:"peak_amplification,omitempty"`
	// Dead is the requests the dead backend got (scenario 9), and
	// DeadRatio that ÷ the no-retries row's.
	Dead      int     `json:"dead_backend_requests,omitempty"`
	DeadRatio float64 `json:"dead_vs_no_retries,omitempty"`
	// Goodput is, for the metastable scenario, the share of the calls sent
	// in each step (Result.StepS) that succeeded; for the priority
	// scenario, that of the critical callers' calls.
	Goodput []float64 `json:"goodput,omitempty"`
	// Recovery is, for the metastable scenario, the seconds from the
	// trigger's end until Goodput stays at or above 90% (null: never).
	Recovery *recoveryS `json:"recovery_s,omitempty"`
	// Recovery99 is, for the mixed-fleet overload, the seconds from the
	// drop's end until every later second's calls succeed at least 99% of
	// the time (null: never); DropGoodput the answers that reached a
	// caller still waiting during the drop, ÷ the reduced capacity.
	Recovery99  *recoveryS `json:"recovery99_s,omitempty"`
	DropGoodput float64    `json:"drop_goodput,omitempty"`
	// ServerRefused counts, for the suite's rows, what its servers'
	// overload protection refused, by overload.Reason.
	ServerRefused map[string]int `json:"server_refused,omitempty"`
	// Classes is, for the priority scenario, the calls and successes of
	// each class of callers ("critical", "sheddable"), marked or not.
	Classes map[string]classCount `json:"classes,omitempty"`
	// Fleet is, for the fleet scenario, the load generator's figures and
	// the counts by part of the time line and at the server.
	Fleet *fleetStats `json:"fleet,omitempty"`
	// Chart is the value drawn in the SVG chart for this row, if any.
	Chart float64 `json:"-"`
	// marks are the Goodput steps where the trigger starts and ends.
	marks []int
}

// col is a column of a text table.
type col int

const (
	colVariant col = iota
	colPolicy
	colOrigin
	colAmpl
	colOK
	colErrors
	colRefused
	colP50
	colP99
	colMax
	colWasted
	colPeak
	colPeakAmpl
	colServed
	colCalls
	colOKPct
	colDead
	colDeadRel
	colRecovery
	colGoodput
	colServerRefused
	colWouldRefuse
	colFleetSent
	colFleetFirst
	colFleetAfter
	colFleetAfterAmpl
	colFleetSentAfterAmpl
	colFleetRate
	colCriticalOK
	colSheddableOK
	colCriticalGoodput
	colP999
	colDropGoodput
	colRecovery99
)

func (c col) head() string {
	return [...]string{"", "policy", "origin", "ampl.", "ok", "errors by code", "retries refused",
		"p50", "p99", "slowest", "wasted", "peak/tick", "peak ampl.", "served",
		"requests", "ok %", "dead", "dead ÷ none",
		"recovery", "goodput per step", "server refused", "would refuse (shadow)",
		"at server", "origin first", "origin after", "ampl. after", "at server ampl. after", "calls/s sent (asked)",
		"critical ok", "sheddable ok", "critical goodput per step", "p99.9", "drop goodput", "recovery 99%"}[c]
}

// left reports whether the column is left-aligned (text) rather than
// right-aligned (numbers).
func (c col) left() bool {
	return c == colVariant || c == colPolicy || c == colErrors || c == colRefused || c == colGoodput || c == colCriticalGoodput || c == colServerRefused || c == colWouldRefuse
}

func (r Row) cell(c col) string {
	switch c {
	case colVariant:
		return r.Variant
	case colPolicy:
		return r.Label
	case colOrigin:
		return strconv.Itoa(r.Origin)
	case colAmpl:
		return fmt.Sprintf("%.2f×", r.Amplification)
	case colOK:
		return fmt.Sprintf("%d/%d", r.OK, r.Calls)
	case colErrors:
		return counts(r.Errors)
	case colRefused:
		return counts(r.Refused)
	case colP50:
		return ms(r.P50ms)
	case colP99:
		return ms(r.P99ms)
	case colP999:
		return ms(r.P999ms)
	case colMax:
		return ms(r.MaxMs)
	case colWasted:
		if r.Wasted == nil {
			return "-"
		}
		return strconv.Itoa(*r.Wasted)
	case colPeak:
		return strconv.Itoa(r.Peak)
	case colPeakAmpl:
		return fmt.Sprintf("%.2f×", r.PeakAmplification)
	case colServed:
		return strconv.Itoa(r.Served)
	case colCalls:
		return strconv.Itoa(r.Calls)
	case colOKPct:
		return fmt.Sprintf("%.1f%%", r.okPercent())
	case colDead:
		return strconv.Itoa(r.Dead)
	case colDeadRel:
		if r.DeadRatio == 0 {
			return "-"
		}
		return fmt.Sprintf("%.2f×", r.DeadRatio)
	case colRecovery:
		return r.Recovery.String()
	case colRecovery99:
		return r.Recovery99.String()
	case colDropGoodput:
		return mixedDropStr(r.DropGoodput)
	case colGoodput:
		return sparkline(r.Goodput, r.marks...)
	case colServerRefused:
		return counts(r.ServerRefused)
	case colWouldRefuse:
		return counts(r.WouldRefuse)
	case colCriticalOK:
		return r.Classes[classCritical].String()
	case colSheddableOK:
		return r.Classes[classSheddable].String()
	case colCriticalGoodput:
		return sparkline(r.Goodput, r.marks...)
	}
	if f := r.Fleet; f != nil {
		switch c {
		case colFleetSent:
			return strconv.Itoa(f.Sent)
		case colFleetFirst:
			return strconv.Itoa(f.First.Origin)
		case colFleetAfter:
			return strconv.Itoa(f.After.Origin)
		case colFleetAfterAmpl:
			return fmt.Sprintf("%.2f×", f.After.Amplification)
		case colFleetSentAfterAmpl:
			return fmt.Sprintf("%.2f×", f.After.SentAmplification)
		case colFleetRate:
			return fmt.Sprintf("%.0f (%.0f), late p99 %s", f.Rate, f.AskedRate, ms(f.LateP99ms))
		}
	}
	return ""
}

// okPercent is the share of calls that succeeded, in percent.
func (r Row) okPercent() float64 {
	if r.Calls == 0 {
		return 0
	}
	return 100 * float64(r.OK) / float64(r.Calls)
}

// counts formats a count map as "a=1 b=2", sorted by name; "-" when empty.
func counts(m map[string]int) string {
	if len(m) == 0 {
		return "-"
	}
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s=%d", k, m[k])
	}
	return b.String()
}

func ms(v float64) string {
	switch {
	case v == 0:
		return "-"
	case v < 10:
		return fmt.Sprintf("%.1fms", v)
	}
	return fmt.Sprintf("%.0fms", v)
}

// Result is what one scenario measured.
type Result struct {
	ID      int      `json:"id"`
	Key     string   `json:"key"`
	Title   string   `json:"title"`
	Setup   string   `json:"setup"`
	Notes   []string `json:"notes,omitempty"`
	Rows    []Row    `json:"rows"`
	Seconds float64  `json:"seconds"`
	// StepS and Trigger describe the metastable scenario's time line:
	// the goodput step and the trigger, in seconds from the start.
	StepS   float64 `json:"step_s,omitempty"`
	Trigger *window `json:"trigger,omitempty"`
	cols    []col
	chart   string // the chart's group label ("" = not charted); "%s" is replaced by the variant
}

// row returns the row of the given policy and variant, or nil.
func (r *Result) row(p policyKey, variant string) *Row {
	for i := range r.Rows {
		if r.Rows[i].Policy == p && r.Rows[i].Variant == variant {
			return &r.Rows[i]
		}
	}
	return nil
}

// printTable writes r as an aligned text table.
func printTable(w io.Writer, r *Result) {
	fmt.Fprintf(w, "\n%d. %s (%.1fs)\n   %s\n", r.ID, r.Title, r.Seconds, r.Setup)
	cols := r.cols
	grid := [][]string{make([]string, len(cols))}
	for i, c := range cols {
		grid[0][i] = c.head()
	}
	for _, row := range r.Rows {
		line := make([]string, len(cols))
		for i, c := range cols {
			line[i] = row.cell(c)
		}
		grid = append(grid, line)
	}
	width := make([]int, len(cols))
	for _, line := range grid {
		for i, s := range line {
			width[i] = max(width[i], len([]rune(s)))
		}
	}
	for n, line := range grid {
		var b strings.Builder
		b.WriteString("  ")
		for i, s := range line {
			pad := strings.Repeat(" ", width[i]-len([]rune(s)))
			if i > 0 {
				b.WriteString("  ")
			}
			if cols[i].left() {
				b.WriteString(s + pad)
			} else {
				b.WriteString(pad + s)
			}
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
		// A blank line between variants.
		if n > 0 && n < len(r.Rows) && cols[0] == colVariant && r.Rows[n-1].Variant != r.Rows[n].Variant {
			fmt.Fprintln(w)
		}
	}
	for _, note := range r.Notes {
		fmt.Fprintf(w, "   %s\n", note)
	}
}

// window is a stretch of a run, in seconds from its start.
type window struct {
	From float64 `json:"from_s"`
	To   float64 `json:"to_s"`
}

// Report is the whole run, as written by -json.
type Report struct {
	Machine  Machine  `json:"machine"`
	Settings string   `json:"settings"`
	Results  []Result `json:"results"`
	Checks   []Check  `json:"checks"`
	Seconds  float64  `json:"seconds"`
	OK       bool     `json:"ok"`
}

func writeJSON(w io.Writer, rep *Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
