package main

import "github.com/stormguard/stormguard/interceptor"

// What the example's traffic must produce on the simulated clock (the
// default), checked on /metrics by TestTraffic and in Prometheus by
// TestPrometheusE2E. The orders numbers are the same in every run:
//
//   - flaky: 270 Puts, of which 15 (ticks ≡ 7 mod 20) fail their first
//     attempt and are retried: 15 retries, all granted (the budget has 10%
//     of 300 calls); 30 Notifies, of which 6 (ticks ≡ 0 mod 50) fail and are
//     not retried (not_idempotent). 315 attempts.
//   - outage: the breaker's window (10 s) still holds the flaky phase's 315
//     attempts with 21 failures, so it opens at the 273rd failed attempt of
//     the outage, when (21+273)/(315+273) = 50%. Those 273 attempts are 246
//     first attempts and 27 retries the budget funded (214 retries refused
//     by the budget, 6 calls stopped at max_attempts, 25 Notifies not
//     retried); the other 254 calls, and the retry that found the breaker
//     just opened, are refused by the breaker.
//   - recovery: the breaker stays open for its 5 s (plus jitter, seeded) and
//     refuses 269 more calls, then lets a probe through, which succeeds and
//     closes it: 331 calls, all OK.
//
// Every failed call records exactly one refusal. search answers every Get:
// 1,400 first attempts, and hedges whose number depends on the measured
// latencies (adaptive hedging), so only bounds are checked there.

// phaseWant is what one phase must do on orders, as the caller and the
// service see it.
type phaseWant struct {
	calls, ok, failed, attempts int
	refusedBy                   map[interceptor.Reason]int
}

var wantPhases = []phaseWant{
	{calls: 300, ok: 294, failed: 6, attempts: 315, refusedBy: map[interceptor.Reason]int{}},
	{calls: 500, ok: 0, failed: 500, attempts: 273, refusedBy: map[interceptor.Reason]int{interceptor.ReasonBreaker: 255, interceptor.ReasonBudget: 214}},
	{calls: 600, ok: 331, failed: 269, attempts: 331, refusedBy: map[interceptor.Reason]int{interceptor.ReasonBreaker: 269}},
}

// ordersWant is what the metrics of the orders target must say at the end.
var ordersWant = struct {
	callsByStatus    map[string]float64 // rpc.response.status_code
	attemptsByKind   map[string]float64 // stormguard.attempt.kind
	refusalsByReason map[string]float64 // stormguard.reason
	budgetBalance    float64            // at the last tick, on the simulated clock
}{
	callsByStatus:    map[string]float64{"OK": 625, "UNAVAILABLE": 775},
	attemptsByKind:   map[string]float64{"first": 877, "retry": 42},
	refusalsByReason: map[string]float64{"breaker": 524, "budget": 214, "max_attempts": 6, "not_idempotent": 31},
	budgetBalance:    10,
}

// ordersAmplification is attempts per call on orders: (315+273+331)/1400.
const ordersAmplification = 919.0 / 1400.0
