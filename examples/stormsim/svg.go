package main

import (
	"fmt"
	"html"
	"io"
	"math"
	"strings"
	"time"
)

// The chart's geometry, in SVG user units.
const (
	svgW      = 1000.0
	svgPanelH = 220.0
	svgLeft   = 60.0
	svgRight  = 250.0
	svgTop    = 70.0
	svgGap    = 60.0
	svgPoints = 300 // at most this many points per line
)

// palette is colour-blind-safe (Okabe-Ito, then greys).
var palette = []string{"#000000", "#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7", "#999999", "#0000FF", "#7F7F7F", "#AA4499"}

// writeSVG draws two panels over the run's time: each row's load (attempts
// sent ÷ calls due, per step) and its goodput (the share of the calls due
// in each step that succeeded), with the failure shaded.
func (rep *report) writeSVG(w io.Writer) error {
	if len(rep.results) == 0 {
		return fmt.Errorf("nothing to draw")
	}
	r0 := rep.results[0]
	steps := int(math.Ceil(float64(rep.cfg.Duration) / float64(r0.Step)))
	per := max(1, (steps+svgPoints-1)/svgPoints)
	n := (steps + per - 1) / per
	type line struct{ load, good []float64 }
	lines := make([]line, len(rep.results))
	maxLoad := 1.2
	for i, r := range rep.results {
		l := line{load: make([]float64, n), good: make([]float64, n)}
		for b := range n {
			calls, ok, sent := 0, 0, 0
			for s := b * per; s < min((b+1)*per, steps); s++ {
				calls, ok, sent = calls+r.Calls[s], ok+r.OK[s], sent+r.Sent[s]
			}
			l.load[b], l.good[b] = math.NaN(), math.NaN()
			if calls > 0 {
				l.load[b], l.good[b] = float64(sent)/float64(calls), float64(ok)/float64(calls)
				maxLoad = max(maxLoad, l.load[b])
			}
		}
		lines[i] = l
	}
	maxLoad = math.Ceil(maxLoad*2) / 2
	h := svgTop + 2*svgPanelH + svgGap + 50
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="12">`+"\n", svgW, h)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%.0f" y="20" font-size="14" font-weight="bold">%s</text>`+"\n", svgLeft, html.EscapeString("stormsim: load and goodput over time, per row"))
	fmt.Fprintf(&b, `<text x="%.0f" y="38">%s</text>`+"\n", svgLeft, html.EscapeString(rep.Scenario))
	fmt.Fprintf(&b, `<text x="%.0f" y="54" fill="#555">%s</text>`+"\n", svgLeft, html.EscapeString(rep.Machine+"; shaded: the failure; one point per "+fmt.Sprint(r0.Step*time.Duration(per))))
	plotW := svgW - svgLeft - svgRight
	dur := rep.cfg.Duration.Seconds()
	x := func(b int) float64 { return svgLeft + plotW*float64(b*per)*r0.Step.Seconds()/dur }
	panel := func(top float64, title string, ymax float64, ticks []float64, pick func(line) []float64, fmtTick func(float64) string) {
		fs, fe := rep.cfg.Failure.Start.Seconds(), rep.cfg.Failure.End.Seconds()
		if rep.cfg.Failure.Mode != 0 {
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#eee"/>`+"\n",
				svgLeft+plotW*fs/dur, top, plotW*(min(fe, dur)-fs)/dur, svgPanelH)
		}
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" font-weight="bold">%s</text>`+"\n", svgLeft, top-6, html.EscapeString(title))
		for _, t := range ticks {
			y := top + svgPanelH*(1-t/ymax)
			fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#ccc"/><text x="%.1f" y="%.1f" text-anchor="end">%s</text>`+"\n",
				svgLeft, svgLeft+plotW, y, y, svgLeft-6, y+4, fmtTick(t))
		}
		for i, l := range lines {
			var pts []string
			for j, v := range pick(l) {
				if !math.IsNaN(v) {
					pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(j), top+svgPanelH*(1-min(v, ymax)/ymax)))
				}
			}
			fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>`+"\n", palette[i%len(palette)], strings.Join(pts, " "))
		}
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#333"/>`+"\n", svgLeft, top, plotW, svgPanelH)
	}
	var loadTicks []float64
	for t := 0.0; t <= maxLoad+1e-9; t += math.Max(0.5, math.Round(maxLoad/6*2)/2) {
		loadTicks = append(loadTicks, t)
	}
	panel(svgTop, "load: attempts sent ÷ calls due", maxLoad, loadTicks, func(l line) []float64 { return l.load }, func(t float64) string { return fmt.Sprintf("%.1f×", t) })
	top2 := svgTop + svgPanelH + svgGap
	panel(top2, "goodput: share of the calls due that succeeded", 1, []float64{0, 0.25, 0.5, 0.75, 1}, func(l line) []float64 { return l.good }, func(t float64) string { return fmt.Sprintf("%.0f%%", 100*t) })
	for s := 0.0; s <= dur+1e-9; s += axisStep(dur) {
		xx := svgLeft + plotW*s/dur
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%gs</text>`+"\n", xx, top2+svgPanelH+16, s)
	}
	for i, r := range rep.results {
		y := svgTop + 14 + float64(i)*18
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="%s" stroke-width="3"/><text x="%.1f" y="%.1f">%s</text>`+"\n",
			svgW-svgRight+14, svgW-svgRight+34, y-4, y-4, palette[i%len(palette)], svgW-svgRight+40, y, html.EscapeString(r.Name))
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// axisStep is the spacing of the time axis' labels for a run of dur
// seconds: about ten labels.
func axisStep(dur float64) float64 {
	for _, s := range []float64{1, 2, 5, 10, 20, 30, 60, 120, 300, 600} {
		if dur/s <= 12 {
			return s
		}
	}
	return 1200
}
