package main

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
)

// PrintTree writes, for each scenario, its spans as a tree: one line per
// span (name, kind, start offset from the trace's root, duration, its
// attributes, and its error status if any), children indented under their parent, and a span's events
// ("@" lines, with their attributes) among its children in time order.
// Spans of traces that no scenario started are printed at the end.
func PrintTree(w io.Writer, results []Result, spans tracetest.SpanStubs) {
	byTrace := map[trace.TraceID][]tracetest.SpanStub{}
	for _, s := range spans {
		id := s.SpanContext.TraceID()
		byTrace[id] = append(byTrace[id], s)
	}
	for i, r := range results {
		fmt.Fprintf(w, "\n[%d/%d] %s: %s\n", i+1, len(results), r.Name, r.About)
		for _, c := range r.Calls {
			line := fmt.Sprintf("   %s -> %s", c.Method, statusName(c.Code))
			if c.RefusedBy != "" {
				line += fmt.Sprintf(" (refused by %s)", c.RefusedBy)
			}
			fmt.Fprintln(w, line)
		}
		fmt.Fprintf(w, "   trace %s\n", r.TraceID)
		printTrace(w, byTrace[r.TraceID])
		delete(byTrace, r.TraceID)
	}
	var rest []trace.TraceID
	for id := range byTrace {
		rest = append(rest, id)
	}
	slices.SortFunc(rest, func(a, b trace.TraceID) int { return strings.Compare(a.String(), b.String()) })
	for _, id := range rest {
		fmt.Fprintf(w, "\n[other trace] %s\n", id)
		printTrace(w, byTrace[id])
	}
}

// printTrace prints the spans of one trace, roots first.
func printTrace(w io.Writer, spans []tracetest.SpanStub) {
	if len(spans) == 0 {
		fmt.Fprintln(w, "   (no spans)")
		return
	}
	ids := map[trace.SpanID]bool{}
	children := map[trace.SpanID][]tracetest.SpanStub{}
	for _, s := range spans {
		ids[s.SpanContext.SpanID()] = true
	}
	var roots []tracetest.SpanStub
	for _, s := range spans {
		if p := s.Parent.SpanID(); s.Parent.IsValid() && ids[p] {
			children[p] = append(children[p], s)
		} else {
			roots = append(roots, s)
		}
	}
	byStart := func(a, b tracetest.SpanStub) int { return a.StartTime.Compare(b.StartTime) }
	slices.SortStableFunc(roots, byStart)
	for _, r := range roots {
		printSpan(w, r, children, r.StartTime, 1)
	}
}

func printSpan(w io.Writer, s tracetest.SpanStub, children map[trace.SpanID][]tracetest.SpanStub, t0 time.Time, depth int) {
	indent := strings.Repeat("   ", depth)
	errMsg := ""
	if s.Status.Code == otelcodes.Error {
		errMsg = fmt.Sprintf("  error=%q", s.Status.Description)
	}
	fmt.Fprintf(w, "%s%s [%s] +%s %s%s%s\n", indent, s.Name, s.SpanKind, ms(s.StartTime.Sub(t0)), ms(s.EndTime.Sub(s.StartTime)), formatAttrs(s.Attributes), errMsg)
	// Children and events, merged in time order.
	type item struct {
		at    time.Time
		span  *tracetest.SpanStub
		event string
		attrs []attribute.KeyValue
	}
	var items []item
	for _, c := range children[s.SpanContext.SpanID()] {
		items = append(items, item{at: c.StartTime, span: &c})
	}
	for _, e := range s.Events {
		items = append(items, item{at: e.Time, event: e.Name, attrs: e.Attributes})
	}
	slices.SortStableFunc(items, func(a, b item) int { return a.at.Compare(b.at) })
	for _, it := range items {
		if it.span != nil {
			printSpan(w, *it.span, children, t0, depth+1)
			continue
		}
		fmt.Fprintf(w, "%s   @ +%s %s%s\n", indent, ms(it.at.Sub(t0)), it.event, formatAttrs(it.attrs))
	}
}

func formatAttrs(kvs []attribute.KeyValue) string {
	var b strings.Builder
	for _, kv := range kvs {
		b.WriteString("  ")
		b.WriteString(string(kv.Key))
		b.WriteByte('=')
		switch kv.Value.Type() {
		case attribute.FLOAT64:
			b.WriteString(strconv.FormatFloat(kv.Value.AsFloat64(), 'g', 4, 64))
		case attribute.STRING:
			b.WriteString(kv.Value.AsString())
		default:
			b.WriteString(kv.Value.Emit())
		}
	}
	return b.String()
}

// ms formats d in milliseconds with one decimal.
func ms(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 1, 64) + "ms"
}

// statusName returns the canonical name of a gRPC code, as
// rpc.response.status_code has it ("UNAVAILABLE", "DEADLINE_EXCEEDED").
func statusName(c codes.Code) string {
	switch c {
	case codes.OK:
		return "OK"
	case codes.Canceled:
		return "CANCELLED"
	}
	var b strings.Builder
	for i, r := range c.String() {
		if i > 0 && r >= 'A' && r <= 'Z' {
			b.WriteByte('_')
		}
		b.WriteRune(r)
	}
	return strings.ToUpper(b.String())
}
