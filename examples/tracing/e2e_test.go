//go:build e2e

package main

// The end-to-end test: the example exports over OTLP/gRPC to a real Jaeger,
// and the traces are read back through Jaeger's HTTP query API. Run it with
//
//	bash scripts/jaeger.sh run-e2e
//
// which builds Jaeger (once, cached), starts it on loopback, runs
//
//	JAEGER_QUERY_URL=http://127.0.0.1:16686 OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4317 \
//	  go -C examples/tracing test -tags e2e -count=1 -run TestJaegerE2E -v .
//
// and stops it.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// Jaeger's query API (/api/traces) returns the Jaeger v1 JSON model.
type jaegerResponse struct {
	Data   []jaegerTrace `json:"data"`
	Errors []struct {
		Code int    `json:"code"`
		Msg  string `json:"msg"`
	} `json:"errors"`
}

type jaegerTrace struct {
	TraceID   string                   `json:"traceID"`
	Spans     []jaegerSpan             `json:"spans"`
	Processes map[string]jaegerProcess `json:"processes"`
}

type jaegerSpan struct {
	TraceID       string      `json:"traceID"`
	SpanID        string      `json:"spanID"`
	OperationName string      `json:"operationName"`
	References    []jaegerRef `json:"references"`
	StartTime     int64       `json:"startTime"` // µs since the epoch
	Duration      int64       `json:"duration"`  // µs
	Tags          []jaegerKV  `json:"tags"`
	Logs          []jaegerLog `json:"logs"`
	ProcessID     string      `json:"processID"`
	Warnings      []string    `json:"warnings"`
}

type jaegerRef struct {
	RefType string `json:"refType"` // CHILD_OF, FOLLOWS_FROM
	TraceID string `json:"traceID"`
	SpanID  string `json:"spanID"`
}

type jaegerKV struct {
	Key   string          `json:"key"`
	Type  string          `json:"type"` // string, bool, int64, float64, binary
	Value json.RawMessage `json:"value"`
}

type jaegerLog struct {
	Timestamp int64      `json:"timestamp"` // µs
	Fields    []jaegerKV `json:"fields"`    // the event's name is the field "event"
}

type jaegerProcess struct {
	ServiceName string     `json:"serviceName"`
	Tags        []jaegerKV `json:"tags"`
}

func (kv jaegerKV) value(t *testing.T) any {
	t.Helper()
	var err error
	switch kv.Type {
	case "bool":
		var b bool
		err = json.Unmarshal(kv.Value, &b)
		return b
	case "int64":
		var n json.Number
		if err = json.Unmarshal(kv.Value, &n); err == nil {
			var i int64
			i, err = n.Int64()
			require.NoError(t, err, "tag %s", kv.Key)
			return i
		}
	case "float64":
		var f float64
		err = json.Unmarshal(kv.Value, &f)
		return f
	default:
		var s string
		err = json.Unmarshal(kv.Value, &s)
		return s
	}
	require.NoError(t, err, "tag %s: %s", kv.Key, kv.Value)
	return nil
}

func kvMap(t *testing.T, kvs []jaegerKV) map[string]any {
	m := map[string]any{}
	for _, kv := range kvs {
		m[kv.Key] = kv.value(t)
	}
	return m
}

// hexID normalises a Jaeger id (which may drop leading zeros) to n hex digits.
func hexID(id string, n int) string {
	id = strings.ToLower(id)
	if len(id) < n {
		id = strings.Repeat("0", n-len(id)) + id
	}
	return id
}

// fromJaeger turns Jaeger's spans into the views the shape checks read:
// the parent is the CHILD_OF reference, the kind the span.kind tag, the
// attributes the tags, and each log an event named by its "event" field.
func fromJaeger(t *testing.T, tr jaegerTrace) []spanView {
	var out []spanView
	for _, s := range tr.Spans {
		v := spanView{
			TraceID: hexID(s.TraceID, 32),
			SpanID:  hexID(s.SpanID, 16),
			Name:    s.OperationName,
			Start:   time.UnixMicro(s.StartTime),
			Attrs:   kvMap(t, s.Tags),
		}
		for _, r := range s.References {
			if r.RefType == "CHILD_OF" {
				assert.Empty(t, v.ParentID, "span %s has one parent", s.OperationName)
				v.ParentID = hexID(r.SpanID, 16)
			}
		}
		v.Kind, _ = v.Attrs["span.kind"].(string)
		for _, l := range s.Logs {
			attrs := kvMap(t, l.Fields)
			name, _ := attrs["event"].(string)
			delete(attrs, "event")
			v.Events = append(v.Events, eventView{Name: name, Time: time.UnixMicro(l.Timestamp), Attrs: attrs})
		}
		out = append(out, v)
	}
	return out
}

func TestJaegerE2E(t *testing.T) {
	query := os.Getenv("JAEGER_QUERY_URL")
	endpoint := os.Getenv(EndpointEnv)
	if query == "" || endpoint == "" {
		t.Fatalf("JAEGER_QUERY_URL and %s must point at a running Jaeger: run bash scripts/jaeger.sh run-e2e", EndpointEnv)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*runTimeout)
	defer cancel()
	t0 := time.Now()

	// The example, exactly as `go -C examples/tracing run .` runs it with the
	// variable set: its spans go to Jaeger over OTLP/gRPC, and a copy stays
	// in memory to compare with what Jaeger returns.
	results, spans, err := runExample(ctx, endpoint)
	require.NoError(t, err)
	require.Len(t, results, len(scenarios))
	t.Logf("example ran and exported %d spans in %v", len(spans), time.Since(t0).Round(time.Millisecond))

	want := map[string]int{} // trace id → spans recorded
	for _, s := range spans {
		want[s.SpanContext.TraceID().String()]++
	}
	for _, r := range results {
		require.NotZero(t, want[r.TraceID.String()], "scenario %s recorded no spans", r.Name)
	}

	// Read the traces back through Jaeger's own API until every span is
	// there (Jaeger's batch processor and storage take a moment).
	traces, body := pollJaeger(t, ctx, query, t0, want)
	if dir := os.Getenv("JAEGER_E2E_DUMP"); dir != "" {
		require.NoError(t, os.WriteFile(dir+"/jaeger-traces.json", body, 0o644))
		var b strings.Builder
		PrintTree(&b, results, spans)
		require.NoError(t, os.WriteFile(dir+"/span-tree.txt", []byte(b.String()), 0o644))
	}

	// The service is listed, as a user picking it in Jaeger would see it.
	services, _, err := getJSON[struct {
		Data []string `json:"data"`
	}](ctx, strings.TrimSuffix(query, "/")+"/api/services")
	require.NoError(t, err)
	assert.Contains(t, services.Data, ServiceName, "/api/services")

	var views []spanView
	for _, tr := range traces {
		for _, p := range tr.Processes {
			assert.Equal(t, ServiceName, p.ServiceName, "process of trace %s", tr.TraceID)
		}
		for _, s := range tr.Spans {
			assert.Empty(t, s.Warnings, "Jaeger's warnings on span %s", s.OperationName)
		}
		views = append(views, fromJaeger(t, tr)...)
	}

	// 1. The tree of every scenario, as Jaeger shows it.
	t.Run("shape", func(t *testing.T) { checkShape(t, results, views) })
	// 2. Every span the suite recorded, as Jaeger shows it: same ids,
	// parent, name, kind, start, attributes and events.
	t.Run("fidelity", func(t *testing.T) { checkFidelity(t, spans, views) })
}

// pollJaeger queries /api/traces?service=stormguard-example until it holds
// every trace of want with all its spans, and returns those traces and the
// last response body.
func pollJaeger(t *testing.T, ctx context.Context, base string, since time.Time, want map[string]int) ([]jaegerTrace, []byte) {
	t.Helper()
	q := url.Values{
		"service": {ServiceName},
		"limit":   {"1000"},
		"start":   {strconv.FormatInt(since.Add(-time.Minute).UnixMicro(), 10)},
		"end":     {strconv.FormatInt(time.Now().Add(time.Hour).UnixMicro(), 10)},
	}
	u := strings.TrimSuffix(base, "/") + "/api/traces?" + q.Encode()
	t.Logf("GET %s", u)
	deadline := time.Now().Add(30 * time.Second)
	var (
		found   map[string]jaegerTrace
		body    []byte
		lastErr error
	)
	for attempt := 1; ; attempt++ {
		found, body, lastErr = getTraces(ctx, u, want)
		complete := lastErr == nil && len(found) == len(want)
		for id, n := range want {
			if complete && len(found[id].Spans) < n {
				complete = false
			}
		}
		if complete {
			t.Logf("all %d traces complete after %d queries", len(want), attempt)
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			got := map[string]int{}
			for id, tr := range found {
				got[id] = len(tr.Spans)
			}
			t.Fatalf("Jaeger did not return every span within 30s (error: %v)\nwant spans per trace: %v\ngot: %v\nlast body: %.2000s", lastErr, want, got, body)
		}
		time.Sleep(250 * time.Millisecond)
	}
	out := make([]jaegerTrace, 0, len(found))
	for _, tr := range found {
		out = append(out, tr)
	}
	slices.SortFunc(out, func(a, b jaegerTrace) int { return strings.Compare(a.TraceID, b.TraceID) })
	return out, body
}

// httpClient keeps no idle connection, so that no goroutine outlives the
// test (goleak).
var httpClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}

// getTraces returns the traces of u's response whose ids are in want.
func getTraces(ctx context.Context, u string, want map[string]int) (map[string]jaegerTrace, []byte, error) {
	r, body, err := getJSON[jaegerResponse](ctx, u)
	if err != nil {
		return nil, body, err
	}
	if len(r.Errors) > 0 {
		return nil, body, fmt.Errorf("Jaeger errors: %+v", r.Errors)
	}
	found := map[string]jaegerTrace{}
	for _, tr := range r.Data {
		id := hexID(tr.TraceID, 32)
		if _, ok := want[id]; ok {
			found[id] = tr
		}
	}
	return found, body, nil
}

// getJSON GETs u and decodes its JSON answer into a T.
func getJSON[T any](ctx context.Context, u string) (T, []byte, error) {
	var v T
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return v, nil, err
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return v, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return v, body, err
	}
	if resp.StatusCode != http.StatusOK {
		return v, body, fmt.Errorf("GET %s: %s: %s", u, resp.Status, bytes.TrimSpace(body))
	}
	if err := json.Unmarshal(body, &v); err != nil {
		return v, body, fmt.Errorf("decoding the answer to GET %s: %w", u, err)
	}
	return v, body, nil
}

// checkFidelity asserts that every span recorded in memory is in Jaeger as
// recorded: nothing lost or changed on the way through the exporter, the
// collector pipeline, the storage and the query API.
func checkFidelity(t *testing.T, recorded tracetest.SpanStubs, seen []spanView) {
	byID := map[string]spanView{}
	for _, v := range seen {
		byID[v.TraceID+"/"+v.SpanID] = v
	}
	for _, r := range fromStubs(recorded) {
		j, ok := byID[r.TraceID+"/"+r.SpanID]
		if !assert.True(t, ok, "span %s (%s) missing from Jaeger", r.Name, r.SpanID) {
			continue
		}
		assert.Equal(t, r.Name, j.Name, "span %s: name", r.SpanID)
		assert.Equal(t, r.ParentID, j.ParentID, "span %s: parent", r.Name)
		assert.Equal(t, r.Kind, j.Kind, "span %s: kind", r.Name)
		assert.Equal(t, r.Start.UnixMicro(), j.Start.UnixMicro(), "span %s: start (µs)", r.Name)
		for k, v := range r.Attrs {
			assert.Equal(t, v, j.Attrs[k], "span %s: attribute %s", r.Name, k)
		}
		if assert.Len(t, j.Events, len(r.Events), "span %s: events", r.Name) {
			for i, e := range r.Events {
				assert.Equal(t, e.Name, j.Events[i].Name, "span %s: event %d", r.Name, i)
				assert.Equal(t, e.Time.UnixMicro(), j.Events[i].Time.UnixMicro(), "span %s: event %s time", r.Name, e.Name)
				assert.Equal(t, e.Attrs, j.Events[i].Attrs, "span %s: event %s attributes", r.Name, e.Name)
			}
		}
	}
}
