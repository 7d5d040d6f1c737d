package main

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"os"
	"strings"
)

// The goodput chart's geometry, in SVG user units (pixels): one panel per
// row, two columns.
const (
	gpCols    = 2
	gpPanelW  = 400.0
	gpPanelH  = 96.0
	gpGapX    = 70.0
	gpGapY    = 58.0
	gpLeft    = 56.0
	gpRight   = 24.0
	gpLineCol = "#0072B2"
)

// goodputRows returns the metastable scenario's result, if it ran, and its
// rows that ran with the trigger and the per-attempt timeout.
func goodputRows(rep *Report) (*Result, []Row) {
	for i := range rep.Results {
		r := &rep.Results[i]
		if r.Key != "metastable" {
			continue
		}
		var rows []Row
		for _, row := range r.Rows {
			if len(row.Goodput) > 0 && row.Variant == "" {
				rows = append(rows, row)
			}
		}
		if len(rows) > 0 {
			return r, rows
		}
	}
	return nil, nil
}

// writeGoodputSVGFile writes the goodput chart to path.
func writeGoodputSVGFile(path string, rep *Report) error {
	var b bytes.Buffer
	if err := writeGoodputSVG(&b, rep); err != nil {
		return err
	}
	return os.WriteFile(path, b.Bytes(), 0o644)
}

// writeGoodputSVG draws, for the metastable scenario, one small chart per
// row: the share of each step's calls that succeeded, over the run, with
// the trigger shaded, the 90% line dashed and the recovery marked.
func writeGoodputSVG(w io.Writer, rep *Report) error {
	res, rows := goodputRows(rep)
	if res == nil {
		return fmt.Errorf("no goodput to draw: run the metastable scenario")
	}
	esc := func(s string) string {
		var b strings.Builder
		_ = xmlEscape(&b, s)
		return b.String()
	}
	var quiet []string
	for _, row := range res.Rows {
		if row.Variant == noTrigger && row.Policy != noRetries {
			n := 0
			for _, v := range row.ServerRefused {
				n += v
			}
			quiet = append(quiet, fmt.Sprintf("%s %d", row.Label, n))
		}
	}
	head := []string{
		fmt.Sprintf("Share of the calls sent in each %.2g s step that succeeded. Shaded: the trigger; dashed: %.0f%%; ▼: recovered (every later step ≥ %.0f%%).", res.StepS, 100*msGood, 100*msGood),
		"go run ./examples/stormlab -scenario metastable -goodput-svg FILE; " + rep.Machine.String() + ".",
	}
	if len(quiet) > 0 {
		head = append(head, "Server refusals in the same runs without the trigger (false refusals): "+strings.Join(quiet, "; ")+".")
	}
	var headLines []string
	for _, h := range head {
		headLines = append(headLines, wrap(h, 136)...)
	}
	setup := res.Setup
	if i := strings.Index(setup, " goodput:"); i > 0 {
		setup = setup[:i]
	}
	footLines := wrap(setup, 150)

	nrows := (len(rows) + gpCols - 1) / gpCols
	top := 52 + 16*float64(len(headLines)) + 30
	width := gpLeft + gpCols*gpPanelW + (gpCols-1)*gpGapX + gpRight
	height := top + float64(nrows)*(gpPanelH+gpGapY) + 14*float64(len(footLines)) + 16
	steps := len(rows[0].Goodput)
	stepW := gpPanelW / float64(steps)
	runS := float64(steps) * res.StepS

	fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="Helvetica, Arial, sans-serif">
<title>stormlab: goodput over time per policy, metastable scenario</title>
<rect width="100%%" height="100%%" fill="#ffffff"/>
`, width, height, width, height)
	fmt.Fprintf(w, `<text x="%.0f" y="30" font-size="20" font-weight="bold" fill="#222">%s</text>
`, gpLeft, esc(fmt.Sprintf("%d. %s", res.ID, res.Title)))
	for k, line := range headLines {
		fmt.Fprintf(w, `<text x="%.0f" y="%.0f" font-size="12" fill="#555">%s</text>
`, gpLeft, 52+16*float64(k), esc(line))
	}

	for i, row := range rows {
		x0 := gpLeft + float64(i%gpCols)*(gpPanelW+gpGapX)
		y0 := top + float64(i/gpCols)*(gpPanelH+gpGapY)
		y := func(v float64) float64 { return y0 + gpPanelH*(1-min(max(v, 0), 1)) }
		x := func(s float64) float64 { return x0 + gpPanelW*s/runS }
		fmt.Fprintf(w, `<text x="%.1f" y="%.1f" font-size="13" font-weight="bold" fill="#222">%s</text>
`, x0, y0-14, esc(row.Label+" — recovery "+row.Recovery.String()))
		for _, v := range []float64{0, 0.5, 1} {
			fmt.Fprintf(w, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#dddddd"/><text x="%.1f" y="%.1f" font-size="10" text-anchor="end" fill="#333">%.0f%%</text>
`, x0, y(v), x0+gpPanelW, y(v), x0-5, y(v)+3.5, 100*v)
		}
		fmt.Fprintf(w, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#333" stroke-dasharray="4 3"/>
`, x0, y(msGood), x0+gpPanelW, y(msGood))
		// The goodput as a filled step line.
		var path strings.Builder
		fmt.Fprintf(&path, "M%.1f %.1f", x0, y(0))
		for k, g := range row.Goodput {
			fmt.Fprintf(&path, " L%.1f %.1f L%.1f %.1f", x0+float64(k)*stepW, y(g), x0+float64(k+1)*stepW, y(g))
		}
		fmt.Fprintf(&path, " L%.1f %.1f Z", x0+gpPanelW, y(0))
		fmt.Fprintf(w, `<path d="%s" fill="%s" fill-opacity="0.35" stroke="%s" stroke-width="1.5"><title>%s</title></path>
`, path.String(), gpLineCol, gpLineCol, esc(fmt.Sprintf("%s: %d of %d calls ok", row.Label, row.OK, row.Calls)))
		if t := res.Trigger; t != nil {
			fmt.Fprintf(w, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#E69F00" fill-opacity="0.3"><title>trigger</title></rect>
`, x(t.From), y0, x(t.To)-x(t.From), gpPanelH)
		}
		fmt.Fprintf(w, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#333"/>
`, x0, y0+gpPanelH, x0+gpPanelW, y0+gpPanelH)
		for s := 0.0; s <= runS+1e-9; s += 2 {
			fmt.Fprintf(w, `<text x="%.1f" y="%.1f" font-size="10" text-anchor="middle" fill="#333">%gs</text>
`, x(s), y0+gpPanelH+13, s)
		}
		if r := row.Recovery; r != nil && !r.never && res.Trigger != nil {
			fmt.Fprintf(w, `<path d="M%.1f %.1f l-5 -8 h10 z" fill="#D55E00"><title>%s</title></path>
`, x(res.Trigger.To+r.s), y0-1, esc("recovered "+r.String()+" after the trigger"))
		}
	}
	for k, line := range footLines {
		fmt.Fprintf(w, `<text x="%.0f" y="%.0f" font-size="11" fill="#555">%s</text>
`, gpLeft, height-14*float64(len(footLines)-k)-4, esc(line))
	}
	fmt.Fprintln(w, "</svg>")
	return nil
}

// wrap cuts s into lines of at most n characters at spaces.
func wrap(s string, n int) []string {
	var lines []string
	var cur strings.Builder
	for _, word := range strings.Fields(s) {
		if cur.Len() > 0 && cur.Len()+1+len([]rune(word)) > n {
			lines = append(lines, cur.String())
			cur.Reset()
		}
		if cur.Len() > 0 {
			cur.WriteByte(' ')
		}
		cur.WriteString(word)
	}
	if cur.Len() > 0 {
		lines = append(lines, cur.String())
	}
	return lines
}

func xmlEscape(w io.Writer, s string) error { return xml.EscapeText(w, []byte(s)) }
