package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stormguard/stormguard/semconv"
)

// wantVault is what the vault's Server refuses, by reason, but for its
// retry budget, whose refusals depend on when grpc-go's retries arrive.
var wantVault = map[string]int{
	semconv.ServerReasonDoomed:     VaultDoomed,
	semconv.ServerReasonShed:       VaultShed,
	semconv.ServerReasonDedupeBusy: VaultBusy,
}

// vaultMethods is the method each of the vault's refusals is for.
var vaultMethods = map[string]string{
	semconv.ServerReasonDoomed:      "echo.v1.EchoService/Put",
	semconv.ServerReasonShed:        "echo.v1.EchoService/Put",
	semconv.ServerReasonDedupeBusy:  "echo.v1.EchoService/Charge",
	semconv.ServerReasonRetryBudget: "echo.v1.EchoService/Notify",
}

// ledgerTarget is the ledger ClientConn's target, its grpc_target label.
const ledgerTarget = "ledger:///replicas"

// checkIncidents checks the incidents' report: the vault's refusals of
// each reason, the ledger's retries and its dead replica's ejection.
func checkIncidents(t *testing.T, rep IncidentReport) {
	t.Helper()
	var b bytes.Buffer
	PrintIncidents(&b, rep)
	t.Logf("\n%s", b.String())
	assert.Equal(t, LedgerCalls, rep.LedgerOK, "every ledger call succeeds, on a live replica if not at first")
	assert.Positive(t, rep.Retried, "the dead replica's failures were retried")
	assert.LessOrEqual(t, rep.Retried, rep.DeadRequests, "each call that failed on the dead replica was retried")
	assert.Less(t, rep.DeadRequests, LedgerCalls/3, "the policy ejected the dead replica before its round-robin third")
	for r, n := range wantVault {
		assert.Equal(t, n, rep.Refused[r], r)
	}
	assert.Positive(t, rep.Refused[semconv.ServerReasonRetryBudget], "grpc-go's retries of a failing method were refused")
	assert.Equal(t, VaultDoomed+VaultShed+VaultBusy+1+VaultNotifies, rep.Handled+sumInts(rep.Refused), "one outcome per call")
}

func sumInts(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// TestIncidents runs the incidents and checks, on /metrics as Prometheus
// reads it: the ledger's retry delay (gRFC A96) against the backoffs the
// Client reported, the outlier policy's ejection (gRFC A91), and the
// vault Server's refusals by reason and method against what its callers
// saw.
func TestIncidents(t *testing.T) {
	d := startDemo(t, Config{})
	ctx, cancel := context.WithTimeout(t.Context(), runTimeout)
	defer cancel()
	rep, err := d.RunIncidents(ctx)
	require.NoError(t, err)
	checkIncidents(t, rep)
	fams := scrape(t, ctx, "http://"+d.MetricsAddr()+"/metrics")

	ledger := map[string]string{"grpc_target": ledgerTarget}
	assert.Equal(t, map[string]float64{"OK": LedgerCalls}, histCountBy(fams, "grpc_client_call_duration_seconds", ledger, "grpc_status"))
	assert.Equal(t, map[string]float64{"": float64(rep.Retried)}, histCountBy(fams, "grpc_client_call_retry_delay_seconds", ledger, ""),
		"one retry delay per call that retried")
	delay := histSum(fams, "grpc_client_call_retry_delay_seconds", ledger)
	assert.GreaterOrEqual(t, delay, rep.Backoff.Seconds(), "the backoffs, at least")
	assert.Less(t, delay, rep.Backoff.Seconds()+1, "the backoffs and the client's own time between attempts")

	ejected := sumBy(fams, "grpc_lb_outlier_detection_ejections_enforced_total", map[string]string{
		"grpc_target": ledgerTarget, "grpc_lb_outlier_detection_detection_method": "failure_percentage",
		"otel_scope_name": semconv.OutlierScopeName,
	}, "")
	assert.GreaterOrEqual(t, ejected[""], 1.0, "the dead replica was ejected")
	assert.Empty(t, sumBy(fams, "grpc_lb_outlier_detection_ejections_unenforced_total", nil, ""), "one dead replica of three: the cap is never full")

	refusals := sumBy(fams, "stormguard_server_refusals_total", nil, "stormguard_reason")
	want := map[string]float64{}
	for r, n := range rep.Refused {
		want[r] = float64(n)
		assert.Equal(t, map[string]float64{vaultMethods[r]: float64(n)},
			sumBy(fams, "stormguard_server_refusals_total", map[string]string{"stormguard_reason": r}, "rpc_method"), r)
	}
	assert.Equal(t, want, refusals, "the refusals the vault's callers saw")
}
