//go:build e2e

package main

// The end-to-end test: a real Prometheus scrapes the example's /metrics,
// and the suite's numbers are read back through Prometheus's HTTP API
// (/api/v1/query), with the PromQL of docs/metrics.md. Run it with
//
//	bash scripts/prometheus.sh run-e2e
//
// which starts Prometheus (Debian's package) on loopback, runs
//
//	PROMETHEUS_URL=http://127.0.0.1:9090 PROMETHEUS_TARGETS_FILE=/tmp/stormguard-prometheus.*/targets.json \
//	  go -C examples/metrics test -tags e2e -count=1 -run TestPrometheusE2E -v .
//
// and stops it.

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stormguard/stormguard/semconv"
)

// e2eTimeout bounds the whole test: Prometheus picks up a new target
// within about 5 s, the traffic takes about 5 s (Config.Pace), scrapes are
// 1 s apart.
const e2eTimeout = 3 * time.Minute

func TestPrometheusE2E(t *testing.T) {
	base := strings.TrimSuffix(os.Getenv("PROMETHEUS_URL"), "/")
	targets := os.Getenv("PROMETHEUS_TARGETS_FILE")
	if base == "" || targets == "" {
		t.Fatal("PROMETHEUS_URL and PROMETHEUS_TARGETS_FILE must point at a running Prometheus: run bash scripts/prometheus.sh run-e2e")
	}
	ctx, cancel := context.WithTimeout(t.Context(), e2eTimeout)
	defer cancel()
	prom := &promAPI{t: t, ctx: ctx, base: base}
	t0 := time.Now()

	// The example, serving /metrics on a free port; Prometheus is told to
	// scrape it, and the traffic starts once it has, at 2 ms a tick (about
	// 5 s), so that several scrapes see the counters grow and the rate form
	// of the recipes has samples to use.
	d := startDemo(t, Config{Pace: 2 * time.Millisecond})
	instance := d.MetricsAddr()
	writeTargets(t, targets, instance)
	sel := fmt.Sprintf(`job="stormguard-example",instance=%q`, instance)
	prom.waitFor(`up{`+sel+`}`, func(v float64) bool { return v == 1 }, "Prometheus scrapes the example")
	t.Logf("Prometheus scrapes %s after %v", instance, time.Since(t0).Round(time.Millisecond))

	reports, err := d.Run(ctx)
	require.NoError(t, err)
	t.Logf("traffic done after %v", time.Since(t0).Round(time.Millisecond))
	inc, err := d.RunIncidents(ctx)
	require.NoError(t, err)
	checkIncidents(t, inc)
	t.Logf("incidents done after %v", time.Since(t0).Round(time.Millisecond))
	// Scrapes are a second apart: wait until one has seen the last call
	// and the vault's last refusal.
	prom.waitFor(`sum(stormguard_client_calls_total{`+sel+`})`, func(v float64) bool { return v == 2*Ticks+LedgerCalls }, "Prometheus has every call")
	prom.waitFor(`sum(stormguard_server_refusals_total{`+sel+`})`, func(v float64) bool { return v == float64(sumInts(inc.Refused)) }, "Prometheus has every refusal")
	t.Logf("Prometheus has every call and refusal after %v", time.Since(t0).Round(time.Millisecond))

	ordersAddr, searchAddr := d.Targets()
	orders, search := targetLabels(ordersAddr), targetLabels(searchAddr)
	ordersSel := fmt.Sprintf(`%s,server_port=%q`, sel, orders["server_port"])
	searchSel := fmt.Sprintf(`%s,server_port=%q`, sel, search["server_port"])

	// Amplification per target: attempts per call, from the counters'
	// values (the rate form is checked below; on a run of a few seconds its
	// extrapolation is not exact).
	amp := prom.vector(`sum by (server_address, server_port) (stormguard_client_attempts_total{` + sel + `})
		/ sum by (server_address, server_port) (stormguard_client_calls_total{` + sel + `})`)
	assert.InDelta(t, ordersAmplification, amp.get(orders), 1e-12, "orders: attempts per call")
	assert.Greater(t, amp.get(search), 1.0, "search: hedges make it more than one attempt per call")
	assert.Less(t, amp.get(search), 1.2, "search: hedges stay within the budget's 10%% (and the stalls' 4%%)")

	// Refusals by reason, and the other breakdowns of the counters.
	assert.Equal(t, ordersWant.refusalsByReason, prom.vector(`sum by (stormguard_reason) (stormguard_client_refusals_total{`+ordersSel+`})`).by("stormguard_reason"))
	assert.Equal(t, ordersWant.callsByStatus, prom.vector(`sum by (rpc_response_status_code) (stormguard_client_calls_total{`+ordersSel+`})`).by("rpc_response_status_code"))
	assert.Equal(t, ordersWant.attemptsByKind, prom.vector(`sum by (stormguard_attempt_kind) (stormguard_client_attempts_total{`+ordersSel+`})`).by("stormguard_attempt_kind"))
	searchKinds := prom.vector(`sum by (stormguard_attempt_kind) (stormguard_client_attempts_total{` + searchSel + `})`).by("stormguard_attempt_kind")
	assert.Equal(t, float64(Ticks), searchKinds["first"])
	assert.Positive(t, searchKinds["hedge"])

	// The per-call histograms (gRFC A66 and A96), with their own labels:
	// one duration per call and target; orders' calls take no simulated
	// time, search's take real time; the retries of orders' calls.
	a66 := fmt.Sprintf(`%s,grpc_target=~%q`, sel, ordersAddr+"|"+searchAddr)
	assert.Equal(t, map[string]float64{ordersAddr: Ticks, searchAddr: Ticks},
		prom.vector(`sum by (grpc_target) (grpc_client_call_duration_seconds_count{`+a66+`})`).by("grpc_target"))
	assert.Equal(t, ordersWant.callsByStatus,
		prom.vector(fmt.Sprintf(`sum by (grpc_status) (grpc_client_call_duration_seconds_count{%s,grpc_target=%q})`, sel, ordersAddr)).by("grpc_status"))
	durations := prom.vector(`sum by (grpc_target) (grpc_client_call_duration_seconds_sum{` + a66 + `})`).by("grpc_target")
	assert.Zero(t, durations[ordersAddr], "orders: no simulated time passes during a call")
	assert.Positive(t, durations[searchAddr], "search: calls take real time")
	assert.Equal(t, float64(wantRetries),
		prom.vector(fmt.Sprintf(`sum(grpc_client_call_retries_sum{%s,grpc_target=%q})`, sel, ordersAddr)).get(nil))

	// gRFC A96's retry delay: on orders, one per call that retried, of no
	// simulated time; on the ledger (the wall clock), one per call that
	// retried, at least the backoffs the Client reported.
	ordersA96 := fmt.Sprintf(`%s,grpc_target=%q`, sel, ordersAddr)
	assert.Equal(t, prom.vector(`sum(grpc_client_call_retries_count{`+ordersA96+`})`).get(nil),
		prom.vector(`sum(grpc_client_call_retry_delay_seconds_count{`+ordersA96+`})`).get(nil))
	assert.Zero(t, prom.vector(`sum(grpc_client_call_retry_delay_seconds_sum{`+ordersA96+`})`).get(nil))
	ledgerA96 := fmt.Sprintf(`%s,grpc_target=%q`, sel, ledgerTarget)
	assert.Equal(t, float64(inc.Retried), prom.vector(`sum(grpc_client_call_retry_delay_seconds_count{`+ledgerA96+`})`).get(nil))
	ledgerDelay := prom.vector(`sum(grpc_client_call_retry_delay_seconds_sum{` + ledgerA96 + `})`).get(nil)
	assert.GreaterOrEqual(t, ledgerDelay, inc.Backoff.Seconds(), "the backoffs, at least")
	assert.Less(t, ledgerDelay, inc.Backoff.Seconds()+1, "the backoffs and the client's own time between attempts")
	t.Logf("ledger: %d calls retried, retry delay %.4fs in Prometheus, backoffs %.4fs", inc.Retried, ledgerDelay, inc.Backoff.Seconds())

	// gRFC A91: the outlier policy ejected the ledger's dead replica.
	ejections := prom.vector(`sum by (grpc_target, grpc_lb_outlier_detection_detection_method, otel_scope_name) (grpc_lb_outlier_detection_ejections_enforced_total{` + sel + `})`)
	assert.GreaterOrEqual(t, ejections.get(map[string]string{
		"grpc_target": ledgerTarget, "grpc_lb_outlier_detection_detection_method": "failure_percentage", "otel_scope_name": semconv.OutlierScopeName,
	}), 1.0, "the dead replica was ejected: %v", ejections)
	t.Logf("ledger: %v ejections in Prometheus", ejections)

	// The vault Server's refusals, by reason and method, as its callers
	// saw them.
	byReason := prom.vector(`sum by (stormguard_reason, rpc_method) (stormguard_server_refusals_total{` + sel + `})`)
	wantRefusals := map[string]float64{}
	for r, n := range inc.Refused {
		wantRefusals[r] = float64(n)
		assert.Equal(t, float64(n), byReason.get(map[string]string{"stormguard_reason": r, "rpc_method": vaultMethods[r]}), r)
	}
	assert.Equal(t, wantRefusals, byReason.by("stormguard_reason"))
	t.Logf("vault: refusals in Prometheus %v", byReason.by("stormguard_reason"))

	// Gauges, observed at the last scrape: every breaker closed (one per
	// method: orders' Put and Notify, search's Get, and the ledger's Put,
	// whose target, ledger:///replicas, has no port), and the orders budget
	// as it stands at the last tick of the simulated clock.
	assert.Equal(t, map[string]float64{orders["server_port"]: 0, search["server_port"]: 0, "": 0},
		prom.vector(`max by (server_port) (stormguard_breaker_state{`+sel+`})`).by("server_port"))
	assert.Equal(t, map[string]float64{"echo.v1.EchoService/Notify": 0, "echo.v1.EchoService/Put": 0},
		prom.vector(`stormguard_breaker_state{`+ordersSel+`}`).by("rpc_method"), "a breaker per method")
	assert.Contains(t, ordersWant.budgetBalance, prom.vector(`stormguard_budget_balance{`+ordersSel+`}`).get(orders))

	// What the callers saw per phase agrees with what Prometheus holds.
	var failed, refusedByBudget float64
	for _, r := range reports {
		failed += float64(r.Orders.Failed)
		refusedByBudget += float64(r.Orders.RefusedBy["budget"])
	}
	assert.Equal(t, failed, prom.vector(`sum(stormguard_client_refusals_total{`+ordersSel+`})`).get(nil), "one refusal per failed call")
	assert.Equal(t, refusedByBudget, ordersWant.refusalsByReason["budget"])

	// Every recipe of docs/metrics.md and every panel query of the Grafana
	// dashboard is valid PromQL over these series, and the amplification
	// recipe in rate form gives a number per target.
	t.Run("recipes", func(t *testing.T) {
		recipes := docRecipes(t)
		require.NotEmpty(t, recipes)
		for _, q := range recipes {
			prom.t = t
			prom.vector(q)
		}
		for _, q := range dashboardQueries(t) {
			prom.vector(q)
		}
		rate := prom.vector(`sum by (server_address, server_port) (rate(stormguard_client_attempts_total{` + sel + `}[1m]))
			/ sum by (server_address, server_port) (rate(stormguard_client_calls_total{` + sel + `}[1m]))`)
		for _, tl := range []map[string]string{orders, search} {
			v := rate.get(tl)
			assert.False(t, math.IsNaN(v), "rate-form amplification for %v", tl)
			assert.True(t, v >= 0 && v <= 3, "rate-form amplification %v for %v", v, tl)
		}
	})
	t.Logf("done after %v", time.Since(t0).Round(time.Millisecond))
}

// writeTargets points Prometheus's file-based discovery at addr. The file
// is replaced by a rename, so Prometheus never reads half of it.
func writeTargets(t *testing.T, path, addr string) {
	t.Helper()
	b, err := json.Marshal([]map[string][]string{{"targets": {addr}}})
	require.NoError(t, err)
	tmp := path + ".tmp"
	require.NoError(t, os.WriteFile(tmp, b, 0o644))
	require.NoError(t, os.Rename(tmp, path))
}

// promAPI queries Prometheus's HTTP API.
type promAPI struct {
	t    *testing.T
	ctx  context.Context
	base string
}

type promResponse struct {
	Status    string `json:"status"`
	ErrorType string `json:"errorType"`
	Error     string `json:"error"`
	Data      struct {
		ResultType string `json:"resultType"`
		Result     []struct {
			Metric map[string]string `json:"metric"`
			Value  [2]any            `json:"value"`
		} `json:"result"`
	} `json:"data"`
}

// sample is one element of an instant vector.
type sample struct {
	labels map[string]string
	value  float64
}

type vector []sample

// query evaluates q now; it returns an error for a failed request or a
// query Prometheus rejects.
func (p *promAPI) query(q string) (vector, error) {
	u := p.base + "/api/v1/query?" + url.Values{"query": {q}}.Encode()
	req, err := http.NewRequestWithContext(p.ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var r promResponse
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return nil, fmt.Errorf("%s: HTTP %d, %w", q, resp.StatusCode, err)
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("%s: %s: %s", q, r.ErrorType, r.Error)
	}
	if r.Data.ResultType != "vector" {
		return nil, fmt.Errorf("%s: result type %s, want vector", q, r.Data.ResultType)
	}
	var out vector
	for _, s := range r.Data.Result {
		str, _ := s.Value[1].(string)
		v, err := strconv.ParseFloat(str, 64)
		if err != nil {
			return nil, fmt.Errorf("%s: value %v: %w", q, s.Value[1], err)
		}
		out = append(out, sample{labels: s.Metric, value: v})
	}
	return out, nil
}

// vector evaluates q and fails the test if Prometheus rejects it.
func (p *promAPI) vector(q string) vector {
	p.t.Helper()
	v, err := p.query(q)
	require.NoError(p.t, err)
	return v
}

// waitFor polls q until it returns exactly one sample for which ok is true.
func (p *promAPI) waitFor(q string, ok func(float64) bool, what string) {
	p.t.Helper()
	var last vector
	var lastErr error
	for {
		last, lastErr = p.query(q)
		if lastErr == nil && len(last) == 1 && ok(last[0].value) {
			return
		}
		select {
		case <-p.ctx.Done():
			p.t.Fatalf("waiting until %s (%s): last answer %v, error %v", what, q, last, lastErr)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// get returns the value of the one sample whose labels include match; NaN
// when there is none or more than one.
func (v vector) get(match map[string]string) float64 {
	found, val := 0, math.NaN()
next:
	for _, s := range v {
		for k, want := range match {
			if s.labels[k] != want {
				continue next
			}
		}
		found++
		val = s.value
	}
	if found != 1 {
		return math.NaN()
	}
	return val
}

// by returns the samples' values keyed by one label.
func (v vector) by(label string) map[string]float64 {
	out := map[string]float64{}
	for _, s := range v {
		out[s.labels[label]] += s.value
	}
	return out
}

// docRecipes returns the PromQL blocks of docs/metrics.md.
func docRecipes(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "metrics.md"))
	require.NoError(t, err)
	var out []string
	for _, m := range regexp.MustCompile("(?s)```promql\n(.*?)```").FindAllStringSubmatch(string(b), -1) {
		out = append(out, strings.TrimSpace(m[1]))
	}
	return out
}

// dashboardQueries returns the panel queries of grafana-dashboard.json with
// Grafana's variables replaced as Grafana would for this run.
func dashboardQueries(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("grafana-dashboard.json")
	require.NoError(t, err)
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(b, &dash))
	r := strings.NewReplacer("$__rate_interval", "1m", "${job}", "stormguard-example", "$job", "stormguard-example")
	var out []string
	for _, p := range dash.Panels {
		require.NotEmpty(t, p.Targets, "panel %q", p.Title)
		for _, tg := range p.Targets {
			out = append(out, r.Replace(tg.Expr))
		}
	}
	return out
}
