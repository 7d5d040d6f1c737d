package main

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"os"
	"strings"
)

// The chart's geometry, in SVG user units (pixels).
const (
	svgBarW     = 16.0
	svgGroupGap = 30.0
	svgLeft     = 64.0
	svgRight    = 24.0
	svgPlotTop  = 130.0
	svgPlotH    = 300.0
	svgYMax     = 4.0 // bars above this are cut and labelled
	svgYStep    = 0.5
)

// policyColor is each policy's bar colour (the Okabe-Ito palette, safe
// for colour-blind readers), in legend order.
func policyColor(p policyKey) string {
	switch p {
	case noRetries:
		return "#999999"
	case naive:
		return "#D55E00"
	case grpcRetry:
		return "#E69F00"
	case grpcThrottled:
		return "#CC79A7"
	case suiteBudget:
		return "#56B4E9"
	case suiteDefaults:
		return "#0072B2"
	case suiteOutlier:
		return "#009E73"
	}
	return "#000000"
}

// chartGroup is one cluster of bars: one scenario (and variant), one bar
// per policy.
type chartGroup struct {
	label  string
	values map[policyKey]float64
}

// chartGroups collects the charted rows of the report, in order.
func chartGroups(rep *Report) []chartGroup {
	var groups []chartGroup
	for _, r := range rep.Results {
		if r.chart == "" {
			continue
		}
		index := map[string]int{}
		for _, row := range r.Rows {
			if policyColor(row.Policy) == "#000000" {
				continue // an extra row, not one of the charted policies
			}
			i, ok := index[row.Variant]
			if !ok {
				i = len(groups)
				index[row.Variant] = i
				groups = append(groups, chartGroup{
					label:  strings.ReplaceAll(r.chart, "%s", row.Variant),
					values: map[policyKey]float64{},
				})
			}
			groups[i].values[row.Policy] = row.Chart
		}
	}
	return groups
}

// writeSVGFile writes the chart to path.
func writeSVGFile(path string, rep *Report) error {
	var b bytes.Buffer
	writeSVG(&b, rep)
	return os.WriteFile(path, b.Bytes(), 0o644)
}

// writeSVG draws a grouped bar chart of the amplification of every policy
// in every charted scenario: hand-written SVG, no dependencies.
func writeSVG(w io.Writer, rep *Report) {
	pols := deadPolicies() // every policy, and the outlier row of scenario 9
	groups := chartGroups(rep)
	groupW := float64(len(pols))*svgBarW + svgGroupGap
	width := svgLeft + float64(max(len(groups), 1))*groupW + svgRight
	height := svgPlotTop + svgPlotH + 88
	y := func(v float64) float64 { return svgPlotTop + svgPlotH*(1-min(v, svgYMax)/svgYMax) }
	esc := func(s string) string {
		var b strings.Builder
		_ = xml.EscapeText(&b, []byte(s))
		return b.String()
	}

	fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="Helvetica, Arial, sans-serif">
<title>stormlab: retry amplification per policy and scenario</title>
<rect width="100%%" height="100%%" fill="#ffffff"/>
`, width, height, width, height)
	fmt.Fprintf(w, `<text x="%.0f" y="30" font-size="20" font-weight="bold" fill="#222">Retry amplification: requests the origin saw per caller request</text>
`, svgLeft)
	fmt.Fprintf(w, `<text x="%.0f" y="52" font-size="12" fill="#555">%s</text>
`, svgLeft, esc(fmt.Sprintf("go run ./examples/stormlab — %s. Bars above %g× are cut and labelled.", rep.Machine, svgYMax)))

	// Legend.
	lx := svgLeft
	for _, p := range pols {
		fmt.Fprintf(w, `<rect x="%.0f" y="70" width="14" height="14" fill="%s"/><text x="%.0f" y="82" font-size="13" fill="#222">%s</text>
`, lx, policyColor(p.key), lx+19, esc(p.name))
		lx += 19 + 7.2*float64(len(p.name)) + 22
	}

	// Group backgrounds, axis, grid.
	for i := range groups {
		if i%2 == 1 {
			fmt.Fprintf(w, `<rect x="%.1f" y="%.0f" width="%.1f" height="%.0f" fill="#f4f4f4"/>
`, svgLeft+float64(i)*groupW, svgPlotTop, groupW, svgPlotH)
		}
	}
	for v := 0.0; v <= svgYMax+1e-9; v += svgYStep {
		stroke := "#dddddd"
		if v == 0 {
			stroke = "#333333"
		}
		fmt.Fprintf(w, `<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="%s"/><text x="%.0f" y="%.1f" font-size="12" text-anchor="end" fill="#333">%g×</text>
`, svgLeft, y(v), width-svgRight, y(v), stroke, svgLeft-6, y(v)+4, v)
	}
	fmt.Fprintf(w, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="#333"/>
`, svgLeft, svgPlotTop, svgLeft, svgPlotTop+svgPlotH)
	fmt.Fprintf(w, `<text transform="translate(18 %.0f) rotate(-90)" font-size="13" text-anchor="middle" fill="#333">origin requests ÷ calls</text>
`, svgPlotTop+svgPlotH/2)
	// 1× = every call reached the origin once.
	fmt.Fprintf(w, `<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#333" stroke-dasharray="5 4"/>
`, svgLeft, y(1), width-svgRight, y(1))

	// Bars, values and group labels.
	for i, g := range groups {
		x0 := svgLeft + float64(i)*groupW + svgGroupGap/2
		for j, p := range pols {
			v, ok := g.values[p.key]
			if !ok {
				continue
			}
			x := x0 + float64(j)*svgBarW
			top := y(v)
			fmt.Fprintf(w, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s</title></rect>
`, x+1, top, svgBarW-2, svgPlotTop+svgPlotH-top, policyColor(p.key), esc(fmt.Sprintf("%s, %s: %.2f×", strings.ReplaceAll(g.label, "\n", " "), p.name, v)))
			label := fmt.Sprintf("%.2f", v)
			if v > svgYMax {
				// A cut bar: a white break near the top, and its value.
				fmt.Fprintf(w, `<path d="M%.1f %.1f l%.1f -4 v4 l-%.1f 4 z" fill="#ffffff"/>
`, x+1, top+14, svgBarW-2, svgBarW-2)
				label = fmt.Sprintf("%.2f×", v)
			}
			fmt.Fprintf(w, `<text transform="translate(%.1f %.1f) rotate(-90)" font-size="10" fill="#222">%s</text>
`, x+svgBarW/2+3.5, top-4, label)
		}
		for k, line := range strings.Split(g.label, "\n") {
			fmt.Fprintf(w, `<text x="%.1f" y="%.0f" font-size="12" text-anchor="middle" fill="#222">%s</text>
`, x0+float64(len(pols))*svgBarW/2, svgPlotTop+svgPlotH+20+15*float64(k), esc(line))
		}
	}
	fmt.Fprintf(w, `<text x="%.0f" y="%.0f" font-size="11" fill="#555">%s</text>
`, svgLeft, height-14, esc("Dashed line: 1× (every call reached the origin once). 6 runs 2,000 calls in sequence per p; 7 is the capacity-drop model (peak attempts per tick ÷ 900 requests); 8 is the load with hedging; 9 is the load on N origins, one dead (stormguard + outlier: its LB policy)."))
	fmt.Fprintln(w, "</svg>")
}
