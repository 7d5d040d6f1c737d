package main

import (
	"net"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stormguard/stormguard/semconv"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	otelconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/stormguard/stormguard/interceptor"
)

// spanView is a span reduced to what the shape checks read. It is built
// from the SDK's in-memory spans (fromStubs) or from what a tracing backend
// returns (the e2e test's fromJaeger), so that both are held to one shape.
type spanView struct {
	TraceID, SpanID, ParentID string // lower-case hex; ParentID "" for a root
	Name                      string
	Kind                      string // "client", "internal", ...
	Start                     time.Time
	Attrs                     map[string]any // string, int64, bool or float64
	Events                    []eventView
}

type eventView struct {
	Name  string
	Time  time.Time
	Attrs map[string]any
}

func fromStubs(stubs tracetest.SpanStubs) []spanView {
	var out []spanView
	for _, s := range stubs {
		v := spanView{
			TraceID: s.SpanContext.TraceID().String(),
			SpanID:  s.SpanContext.SpanID().String(),
			Name:    s.Name,
			Kind:    s.SpanKind.String(),
			Start:   s.StartTime,
			Attrs:   attrMap(s.Attributes),
		}
		if s.Parent.IsValid() {
			v.ParentID = s.Parent.SpanID().String()
		}
		for _, e := range s.Events {
			v.Events = append(v.Events, eventView{Name: e.Name, Time: e.Time, Attrs: attrMap(e.Attributes)})
		}
		out = append(out, v)
	}
	return out
}

func attrMap(kvs []attribute.KeyValue) map[string]any {
	m := map[string]any{}
	for _, kv := range kvs {
		m[string(kv.Key)] = kv.Value.AsInterface()
	}
	return m
}

// Expected trees, by scenario: the calls under the scenario's root span,
// in order, each with its attempts (in order: attempt i has
// previous-rpc-attempts = i) and the decision events on its span.
type wantCall struct {
	method   string
	status   string
	attempts []wantAttempt
	events   []wantEvent
}

type wantAttempt struct {
	kind    string // first, retry, hedge
	hedge   bool
	status  string
	notSent bool // refused at its pick by an open breaker: stormguard.sent=false
}

type wantEvent struct {
	name   string
	reason interceptor.Reason // for refusals
}

var (
	first       = wantAttempt{"first", false, "UNAVAILABLE", false}
	retryFailed = wantAttempt{"retry", false, "UNAVAILABLE", false}
	scheduled   = wantEvent{name: semconv.EventRetryScheduled}
)

func refused(r interceptor.Reason) wantEvent {
	return wantEvent{name: semconv.EventRetryRefused, reason: r}
}

var wantTrees = map[string][]wantCall{
	"retried-twice": {{
		method: put, status: "OK",
		attempts: []wantAttempt{first, retryFailed, {"retry", false, "OK", false}},
		events:   []wantEvent{scheduled, scheduled},
	}},
	"budget-refused": {{
		method: put, status: "UNAVAILABLE",
		attempts: []wantAttempt{first},
		events:   []wantEvent{refused(interceptor.ReasonBudget)},
	}},
	"hedged": {{
		method: put, status: "OK",
		attempts: []wantAttempt{{"first", false, "CANCELLED", false}, {"hedge", true, "OK", false}},
		events:   []wantEvent{{name: semconv.EventHedgeSent}},
	}},
	"breaker-open": {{
		method: put, status: "UNAVAILABLE",
		attempts: []wantAttempt{first, retryFailed, retryFailed},
		events:   []wantEvent{scheduled, scheduled, refused(interceptor.ReasonMaxAttempts)},
	}, {
		method: put, status: "UNAVAILABLE",
		// The open breaker lets the call go to the pick, and refuses it
		// there, before anything is sent: it picked the endpoint that
		// served nothing (the only one).
		attempts: []wantAttempt{{"first", false, "UNAVAILABLE", true}},
		events:   []wantEvent{{name: semconv.EventBreakerRejected, reason: interceptor.ReasonBreaker}},
	}},
	"unmarked": {{
		method: notify, status: "UNAVAILABLE",
		attempts: []wantAttempt{first},
		events:   []wantEvent{refused(interceptor.ReasonNotIdempotent)},
	}},
}

// checkShape asserts that spans hold, for every scenario of results, the
// tree wantTrees describes, and nothing else in those traces.
func checkShape(t *testing.T, results []Result, spans []spanView) {
	t.Helper()
	require.Len(t, results, len(wantTrees), "one result per scenario")
	byTrace := map[string][]spanView{}
	for _, s := range spans {
		byTrace[s.TraceID] = append(byTrace[s.TraceID], s)
	}
	for _, r := range results {
		want, ok := wantTrees[r.Name]
		require.True(t, ok, "no expected tree for scenario %s", r.Name)
		t.Run(r.Name, func(t *testing.T) {
			checkScenario(t, r, byTrace[r.TraceID.String()], want)
		})
	}
}

func checkScenario(t *testing.T, r Result, spans []spanView, want []wantCall) {
	host, portStr, err := net.SplitHostPort(r.Target)
	require.NoError(t, err)
	port, err := strconv.Atoi(portStr)
	require.NoError(t, err)

	children := map[string][]spanView{}
	var roots []spanView
	for _, s := range spans {
		if s.ParentID == "" {
			roots = append(roots, s)
		} else {
			children[s.ParentID] = append(children[s.ParentID], s)
		}
	}
	for id := range children {
		slices.SortStableFunc(children[id], func(a, b spanView) int { return a.Start.Compare(b.Start) })
	}
	require.Len(t, roots, 1, "one root span in the trace of %s", r.Name)
	root := roots[0]
	assert.Equal(t, RootPrefix+r.Name, root.Name)

	calls := children[root.SpanID]
	require.Len(t, calls, len(want), "call spans under %s", root.Name)
	total := 1 + len(calls)
	for i, w := range want {
		call := calls[i]
		attempts := children[call.SpanID]
		total += len(attempts)
		checkCall(t, call, attempts, w, host, port)
	}
	assert.Len(t, spans, total, "spans in the trace: the root, the calls and their attempts, nothing else")
}

func checkCall(t *testing.T, call spanView, attempts []spanView, w wantCall, host string, port int) {
	t.Helper()
	// The logical call: one CLIENT span named pkg.Svc/Method with the
	// semconv v1.43 attributes.
	assert.Equal(t, w.method, call.Name)
	assert.Equal(t, "client", call.Kind, "%s: span kind", call.Name)
	assert.Equal(t, "grpc", call.Attrs[string(otelconv.RPCSystemNameKey)], "%s: rpc.system.name", call.Name)
	assert.Equal(t, w.method, call.Attrs[string(otelconv.RPCMethodKey)], "%s: rpc.method", call.Name)
	assert.Equal(t, w.status, call.Attrs[string(otelconv.RPCResponseStatusCodeKey)], "%s: rpc.response.status_code", call.Name)
	assert.Equal(t, host, call.Attrs[string(otelconv.ServerAddressKey)], "%s: server.address", call.Name)
	assert.Equal(t, int64(port), call.Attrs[string(otelconv.ServerPortKey)], "%s: server.port", call.Name)

	// Its attempts: children named Attempt.pkg.Svc/Method, numbered by
	// previous-rpc-attempts, with their kind, hedge flag and status.
	if assert.Len(t, attempts, len(w.attempts), "%s: attempt spans", call.Name) {
		for i, wa := range w.attempts {
			a := attempts[i]
			assert.Equal(t, "Attempt."+w.method, a.Name)
			assert.Equal(t, "internal", a.Kind, "attempt %d: span kind", i)
			assert.Equal(t, int64(i), a.Attrs[string(semconv.AttrPreviousAttempts)], "attempt %d: previous-rpc-attempts", i)
			assert.Equal(t, wa.kind, a.Attrs[string(semconv.AttrAttemptKind)], "attempt %d: kind", i)
			assert.Equal(t, wa.hedge, a.Attrs[string(semconv.AttrHedge)], "attempt %d: hedge flag", i)
			assert.Equal(t, false, a.Attrs[string(semconv.AttrTransparentRetry)], "attempt %d: transparent-retry", i)
			assert.Equal(t, wa.status, a.Attrs[string(otelconv.RPCResponseStatusCodeKey)], "attempt %d: rpc.response.status_code", i)
			assert.Empty(t, a.Events, "attempt %d: decisions are events on the call span, not on attempts", i)
			if wa.notSent {
				assert.Equal(t, false, a.Attrs[string(semconv.AttrSent)], "attempt %d: stormguard.sent", i)
			} else {
				assert.NotContains(t, a.Attrs, string(semconv.AttrSent), "attempt %d: sent", i)
			}
		}
	}

	// The decisions: events on the call span, in order, with their reasons.
	names := make([]string, len(call.Events))
	for i, e := range call.Events {
		names[i] = e.Name
	}
	wantNames := make([]string, len(w.events))
	for i, e := range w.events {
		wantNames[i] = e.name
	}
	if !assert.Equal(t, wantNames, names, "%s: events", call.Name) {
		return
	}
	retry := 0
	for i, we := range w.events {
		e := call.Events[i]
		if we.reason != "" {
			assert.Equal(t, string(we.reason), e.Attrs[string(semconv.AttrReason)], "event %s: reason", e.Name)
		} else {
			assert.NotContains(t, e.Attrs, string(semconv.AttrReason), "event %s", e.Name)
		}
		switch e.Name {
		case semconv.EventRetryScheduled:
			// Scheduled after attempt n started and before attempt n+1.
			assert.Equal(t, "UNAVAILABLE", e.Attrs[string(semconv.AttrCause)], "retry cause")
			d, ok := e.Attrs[string(semconv.AttrDelay)].(float64)
			assert.True(t, ok && d > 0 && d <= 1, "retry delay_s %v: a backoff in (0, 1s]", e.Attrs[string(semconv.AttrDelay)])
			if retry+1 < len(attempts) {
				assert.False(t, e.Time.Before(attempts[retry].Start), "retry %d scheduled before attempt %d started", retry+1, retry)
				assert.False(t, e.Time.After(attempts[retry+1].Start), "retry %d scheduled after it started", retry+1)
			}
			retry++
		case semconv.EventHedgeSent:
			assert.Equal(t, int64(1), e.Attrs[string(semconv.AttrPreviousAttempts)], "hedge.sent: previous-rpc-attempts")
			if len(attempts) == 2 {
				d := attempts[1].Start.Sub(attempts[0].Start)
				assert.GreaterOrEqual(t, d, hedgeDelay-time.Millisecond, "the hedge waits for the hedging delay")
			}
		}
	}
}
