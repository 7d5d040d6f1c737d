package main

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// runTimeout bounds one run of the traffic (about 1 s on an idle 2-core
// machine; the search stalls are 96 × up to 500 ms when hedges are refused).
const runTimeout = 2 * time.Minute

// startDemo starts the example as cfg says, with seed 1 and /metrics on a
// free loopback port.
func startDemo(t *testing.T, cfg Config) *Demo {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	cfg.Listener, cfg.Seed = ln, 1
	d, err := Start(cfg)
	require.NoError(t, err)
	t.Cleanup(d.Close)
	return d
}

// TestTraffic runs the traffic, checks each phase as the caller and the
// services saw it, then reads /metrics as Prometheus would and checks what
// the suite's metrics say against the same expectations and against the
// attempts the services counted.
func TestTraffic(t *testing.T) {
	d := startDemo(t, Config{})
	ctx, cancel := context.WithTimeout(t.Context(), runTimeout)
	defer cancel()
	start := time.Now()
	reports, err := d.Run(ctx)
	require.NoError(t, err)
	t.Logf("traffic ran in %v", time.Since(start))
	var table bytes.Buffer
	PrintReports(&table, reports)
	t.Logf("\n%s", table.String())

	require.Len(t, reports, len(wantPhases))
	var breakers []BreakerChange
	for i, w := range wantPhases {
		got := reports[i].Orders
		assert.Equal(t, w, phaseWant{calls: got.Calls, ok: got.OK, failed: got.Failed, attempts: got.Attempts, refusedBy: got.RefusedBy, refusals: got.Refusals},
			"orders in phase %s", reports[i].Phase.Name)
		s := reports[i].Search
		assert.Equal(t, s.Calls, s.OK, "search in phase %s: every Get succeeds", reports[i].Phase.Name)
		breakers = append(breakers, reports[i].Breakers...)
	}
	assert.Equal(t, wantBreaker, breakers, "the breakers' changes")

	fams := scrape(t, ctx, "http://"+d.MetricsAddr()+"/metrics")
	ordersAddr, searchAddr := d.Targets()
	orders, search := targetLabels(ordersAddr), targetLabels(searchAddr)

	assert.Equal(t, ordersWant.callsByStatus, sumBy(fams, "stormguard_client_calls_total", orders, "rpc_response_status_code"))
	assert.Equal(t, ordersWant.attemptsByKind, sumBy(fams, "stormguard_client_attempts_total", orders, "stormguard_attempt_kind"))
	assert.Equal(t, ordersWant.refusalsByReason, sumBy(fams, "stormguard_client_refusals_total", orders, "stormguard_reason"))
	assert.Contains(t, ordersWant.budgetBalance, sumBy(fams, "stormguard_budget_balance", orders, "")[""])
	assert.Equal(t, map[string]float64{"": 0}, sumBy(fams, "stormguard_breaker_state", orders, ""), "orders' breakers closed again")
	assert.Equal(t, map[string]float64{"echo.v1.EchoService/Notify": 0, "echo.v1.EchoService/Put": 0},
		sumBy(fams, "stormguard_breaker_state", orders, "rpc_method"), "a breaker per method")
	// The attempts the suite counted are the attempts that reached orders.
	attempts := sumBy(fams, "stormguard_client_attempts_total", orders, "")[""]
	assert.Equal(t, float64(d.orders.Total()), attempts)
	assert.InDelta(t, ordersAmplification, attempts/sumBy(fams, "stormguard_client_calls_total", orders, "")[""], 1e-12)
	// Every failed call records one refusal.
	assert.Equal(t, ordersWant.callsByStatus["UNAVAILABLE"], sumBy(fams, "stormguard_client_refusals_total", orders, "")[""])
	// gRFC A96: one retries observation per call that retried.
	ordersA66 := map[string]string{"grpc_target": ordersAddr}
	assert.Equal(t, float64(wantRetries), histSum(fams, "grpc_client_call_retries", ordersA66))
	// gRFC A96: one retry delay per call that retried (orders hedges
	// nothing), of no simulated time: the clock stands still while orders
	// is called, backoffs included.
	assert.Equal(t, histCountBy(fams, "grpc_client_call_retries", ordersA66, ""), histCountBy(fams, "grpc_client_call_retry_delay_seconds", ordersA66, ""))
	assert.Zero(t, histSum(fams, "grpc_client_call_retry_delay_seconds", ordersA66))
	// gRFC A66: one duration per call, by status; orders' calls take no
	// simulated time (the clock stands still while they are made).
	assert.Equal(t, ordersWant.callsByStatus, histCountBy(fams, "grpc_client_call_duration_seconds", ordersA66, "grpc_status"))
	assert.Zero(t, histSum(fams, "grpc_client_call_duration_seconds", ordersA66))
	assert.Empty(t, sumBy(fams, "stormguard_client_would_refuse_total", nil, ""), "no shadow mode here")

	assert.Equal(t, map[string]float64{"OK": Ticks}, sumBy(fams, "stormguard_client_calls_total", search, "rpc_response_status_code"))
	kinds := sumBy(fams, "stormguard_client_attempts_total", search, "stormguard_attempt_kind")
	assert.Equal(t, float64(Ticks), kinds["first"], "search: one first attempt per call")
	assert.Zero(t, kinds["retry"], "search: nothing failed, nothing retried")
	// A hedge cancelled before it arrived is counted but never reaches search.
	assert.GreaterOrEqual(t, kinds["first"]+kinds["hedge"], float64(d.search.Total()))
	assert.Equal(t, map[string]float64{"": 0}, sumBy(fams, "stormguard_breaker_state", search, ""))
	// The stalled Gets were hedged: every 25th stalls its first attempt for
	// 500 ms; once the adaptive delay is known (after 20 calls), a hedge
	// should be sent for each, budget permitting.
	stalled, hedged := 0, 0
	for tick := 20; tick < Ticks; tick++ {
		if tick%25 == 3 {
			stalled++
			if d.search.CountID("/echo.v1.EchoService/Get", requestID("get", tick)) > 1 {
				hedged++
			}
		}
	}
	t.Logf("search: %v hedges; %d of %d stalled Gets hedged", kinds["hedge"], hedged, stalled)
	assert.GreaterOrEqual(t, hedged, stalled/2, "most stalled Gets are hedged")
	assert.GreaterOrEqual(t, kinds["hedge"], float64(hedged))
	// Search's calls take real time: the simulated clock runs while they are
	// made (less than a tick each).
	searchA66 := map[string]string{"grpc_target": searchAddr}
	assert.Equal(t, map[string]float64{"OK": Ticks}, histCountBy(fams, "grpc_client_call_duration_seconds", searchA66, "grpc_status"))
	assert.Positive(t, histSum(fams, "grpc_client_call_duration_seconds", searchA66))
	assert.Less(t, histSum(fams, "grpc_client_call_duration_seconds", searchA66), float64(Ticks)*Step.Seconds())

	// The resource, as Prometheus's target_info.
	ti := sumBy(fams, "target_info", map[string]string{"service_name": ServiceName}, "")
	assert.Equal(t, map[string]float64{"": 1}, ti, "target_info{service_name=%q}", ServiceName)
}

// TestRealMain runs the command as `go -C examples/metrics run . -exit`
// does, on a free port, and checks what it prints.
func TestRealMain(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), runTimeout)
	defer cancel()
	var out bytes.Buffer
	require.NoError(t, realMain(ctx, &out, []string{"-listen", "127.0.0.1:0", "-exit"}))
	s := out.String()
	for _, want := range []string{
		"metrics: serving http://127.0.0.1:",
		"metrics: 2400 ticks on a simulated clock, 10ms per tick; orders at 127.0.0.1:",
		"phase     ticks      service  calls  ok    failed  attempts  per call  refusals by reason (ticks)",
		"flaky     0-299      orders   300    294   6       315       1.05      not_idempotent 6 (0-250)",
		"outage    300-1699   orders   1400   0     1400    918       0.66      not_idempotent 93 (300-1550), max_attempts 6 (301-306), budget 264 (307-599), breaker 1037 (601-1699)",
		"recovery  1700-2399  orders   700    417   283     417       0.60      breaker 283 (1700-1983)",
		"orders Notify breaker (tick state): 1200 open, 1310 half-open, 1310 open, 1550 half-open, 1550 open, 1980 half-open, 1980 closed",
		"orders Put breaker (tick state): 1201 open, 1321 half-open, 1321 open, 1543 half-open, 1543 open, 1984 half-open, 1984 closed",
		"search breakers: closed throughout",
		"metrics: traffic done in ",
		"incidents: ledger (3 replicas, outlier policy, 127.0.0.1:",
		"incidents: vault refused doomed 5, shed 4, dedupe_busy 3, retry_budget ",
		"metrics: incidents done in ",
	} {
		assert.Contains(t, s, want)
	}
	assert.NotContains(t, s, "until interrupted")
	t.Log("\n" + s)
}

// TestRealMainServesUntilInterrupted checks that without -exit the command
// keeps serving /metrics after the traffic and returns when its context
// ends (as on Ctrl-C).
func TestRealMainServesUntilInterrupted(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), runTimeout)
	defer cancel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close()) // realMain listens there itself
	out := &syncBuffer{}
	done := make(chan error, 1)
	go func() { done <- realMain(ctx, out, []string{"-listen", addr}) }()
	require.Eventually(t, func() bool { return strings.Contains(out.String(), "until interrupted") }, runTimeout, 10*time.Millisecond)
	fams := scrape(t, ctx, "http://"+addr+"/metrics")
	assert.Equal(t, float64(2*Ticks+LedgerCalls), sumBy(fams, "stormguard_client_calls_total", nil, "")[""], "the ticks' calls and the ledger's")
	cancel()
	require.NoError(t, <-done)
}

func TestRealMainRejectsBadArguments(t *testing.T) {
	for _, args := range [][]string{{"-nosuchflag"}, {"extra"}, {"-listen", "256.0.0.1:0"}} {
		var out bytes.Buffer
		assert.Error(t, realMain(t.Context(), &out, args), "%q", args)
	}
}

// httpClient keeps no idle connections, which goleak would report.
var httpClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

// scrape GETs a Prometheus text exposition and parses it.
func scrape(t *testing.T, ctx context.Context, url string) map[string]*dto.MetricFamily {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	require.NoError(t, err)
	resp, err := httpClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	return fams
}

// targetLabels are the labels of a target's series.
func targetLabels(target string) map[string]string {
	host, port, _ := net.SplitHostPort(target)
	return map[string]string{"server_address": host, "server_port": port}
}

// sumBy sums the samples of family name whose labels include match, by the
// value of label by ("" sums them all under "").
func sumBy(fams map[string]*dto.MetricFamily, name string, match map[string]string, by string) map[string]float64 {
	out := map[string]float64{}
	f := fams[name]
	if f == nil {
		return out
	}
next:
	for _, m := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		for k, v := range match {
			if labels[k] != v {
				continue next
			}
		}
		var v float64
		switch {
		case m.Counter != nil:
			v = m.GetCounter().GetValue()
		case m.Gauge != nil:
			v = m.GetGauge().GetValue()
		default:
			continue
		}
		key := ""
		if by != "" {
			key = labels[by]
		}
		out[key] += v
	}
	return out
}

// histSum returns the _sum of histogram family name over the samples whose
// labels include match.
func histSum(fams map[string]*dto.MetricFamily, name string, match map[string]string) float64 {
	var s float64
	for _, m := range histograms(fams, name, match) {
		s += m.GetHistogram().GetSampleSum()
	}
	return s
}

// histCountBy returns the _count of histogram family name over the samples
// whose labels include match, by the value of label by.
func histCountBy(fams map[string]*dto.MetricFamily, name string, match map[string]string, by string) map[string]float64 {
	out := map[string]float64{}
	for _, m := range histograms(fams, name, match) {
		key := ""
		for _, l := range m.GetLabel() {
			if l.GetName() == by {
				key = l.GetValue()
			}
		}
		out[key] += float64(m.GetHistogram().GetSampleCount())
	}
	return out
}

func histograms(fams map[string]*dto.MetricFamily, name string, match map[string]string) []*dto.Metric {
	var out []*dto.Metric
	f := fams[name]
	if f == nil {
		return nil
	}
next:
	for _, m := range f.GetMetric() {
		if m.Histogram == nil {
			continue
		}
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		for k, v := range match {
			if labels[k] != v {
				continue next
			}
		}
		out = append(out, m)
	}
	return out
}

// syncBuffer is a bytes.Buffer safe for one writer and concurrent readers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
