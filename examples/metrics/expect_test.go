package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"google.golang.org/grpc/codes"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
)

// What the example's traffic must produce on the simulated clock (the
// default, seed 1), checked on /metrics by TestTraffic and in Prometheus by
// TestPrometheusE2E. The orders numbers are the same in every run. The
// suite runs with its defaults: a breaker that opens when every attempt of
// its 10 s window (ten buckets of 1 s, from tick 0) failed, with at least
// 20, for 1 s, then 2 s, then 4 s (the cap) while its probes fail, each
// lengthened by up to 20% (seeded jitter); no retry when the target served
// nothing lately (its endpoints' window, four slots of 1 s of the Client's
// clock, aligned on whole seconds, holds ≥ 3 attempts, all failed); a
// budget of 10% of the calls that banks at most one retry and lends at
// least 5 (or a tenth of the last second's calls) ahead of the calls that
// repay them; 3 attempts at most. Derived by arithmetic (TestExpectationsAreDerived redoes
// it) unless marked PINNED: those come from the budget's bookkeeping and
// were identical in every run (go run . -exit three times, go test -count=5
// -run TestTraffic).
//
//   - flaky (ticks 0-299): 270 Puts, of which 15 (ticks ≡ 7 mod 20) fail
//     their first attempt and are retried: 15 retries, all granted (one
//     failure per 20 calls: half the budget's ratio); 30 Notifies, of which 6
//     (ticks ≡ 0 mod 50) fail and are not retried (not_idempotent). 315
//     attempts, 294 calls OK.
//   - outage (ticks 300-1699), the first 3 s (300-599): the endpoints'
//     window still holds the flaky phase's successes of ticks 200-299 (slot
//     2), so retries are the budget's. Every call is sent: 30 Notifies
//     (not_idempotent) and 270 Puts. PINNED: the budget's credit (one
//     retry) and its loan (a tenth of the last second's 100 calls) give the
//     first five Puts (ticks 301-305) two retries each, which fail, so they
//     stop at max_attempts (5); then it grants a retry each time the calls
//     have paid for one: 30 retries in all (a tenth of the 300 calls, and
//     the credit carried in), every other Put is refused a retry once:
//     budget 265 (ticks 306-599).
//   - outage, served nothing lately (600-1199): slot 2 has left the
//     endpoints' window (slots 3-6 hold failures only), so every Put's
//     retry is refused when it is due, after its backoff (breaker; 540
//     Puts), while the
//     breaker's own window, 10 s, still holds the flaky phase's successes
//     and every call is sent (60 Notifies: not_idempotent).
//   - outage, breaker open (1200-1699): at tick 1200 (a Notify) bucket 2 has
//     left the breaker's window too, which holds failures only (900+,
//     ≥ 20), and the first failure there opens it. Its seeded open periods
//     (1 s·(1+0.2·0.238), 2 s·(1+0.2·0.972), 4 s·(1+0.2·0.781)) end at
//     ticks 1305 and 1544, whose probes (Puts) fail, their retry refused by
//     the breaker, and at 2007. The 497 other calls are refused by the
//     breaker without being sent: breaker 540 + 497 + 2 = 1039 (ticks
//     1201-1699); 1200's Notify is the 91st not_idempotent. Attempts:
//     900 + 1 + 2 probes + 30 retries = 933.
//   - recovery (1700-2399): orders answers again, but the breaker, open
//     since 1544, refuses the calls of ticks 1700-2006 (307); the probe at
//     2007 succeeds and closes it: 393 calls, all OK, one attempt each.
//
// Every failed call records exactly one refusal. The budget's balance at
// the end is its credit of one retry and a loan of a tenth of the calls it
// counts as the last second's: 11, or 10 when the clock has moved into the
// next 100 ms slot of its window (a call counts for 0.9 to 1 s), which
// depends on the backoff timers still pending when the traffic stops. search answers
// every Get: 2,400 first attempts, and hedges whose number depends on the
// measured latencies (adaptive hedging), so only bounds are checked there.

// phaseWant is what one phase must do on orders, as the caller and the
// service see it.
type phaseWant struct {
	calls, ok, failed, attempts int
	refusedBy                   map[interceptor.Reason]int
	refusals                    map[interceptor.Reason]Seen
}

var wantPhases = []phaseWant{
	{
		calls: 300, ok: 294, failed: 6, attempts: 315,
		refusedBy: map[interceptor.Reason]int{},
		refusals:  map[interceptor.Reason]Seen{interceptor.ReasonNotIdempotent: {6, 0, 250}},
	},
	{
		calls: 1400, ok: 0, failed: 1400, attempts: 933,
		refusedBy: map[interceptor.Reason]int{interceptor.ReasonBreaker: 1039, interceptor.ReasonBudget: 265},
		refusals: map[interceptor.Reason]Seen{
			interceptor.ReasonNotIdempotent: {91, 300, 1200},
			interceptor.ReasonMaxAttempts:   {5, 301, 305},
			interceptor.ReasonBudget:        {265, 306, 599},
			interceptor.ReasonBreaker:       {1039, 601, 1699},
		},
	},
	{
		calls: 700, ok: 393, failed: 307, attempts: 393,
		refusedBy: map[interceptor.Reason]int{interceptor.ReasonBreaker: 307},
		refusals:  map[interceptor.Reason]Seen{interceptor.ReasonBreaker: {307, 1700, 2006}},
	},
}

// wantBreaker is orders' breaker, tick by tick: opened at 1200, probes at
// 1305 and 1544 (failed) and at 2007 (succeeded). search's never opens.
var wantBreaker = []BreakerChange{
	{1200, "orders", breaker.StateClosed, breaker.StateOpen},
	{1305, "orders", breaker.StateOpen, breaker.StateHalfOpen},
	{1305, "orders", breaker.StateHalfOpen, breaker.StateOpen},
	{1544, "orders", breaker.StateOpen, breaker.StateHalfOpen},
	{1544, "orders", breaker.StateHalfOpen, breaker.StateOpen},
	{2007, "orders", breaker.StateOpen, breaker.StateHalfOpen},
	{2007, "orders", breaker.StateHalfOpen, breaker.StateClosed},
}

// wantRetries is the number of retries sent to orders (15 + 30, PINNED).
const wantRetries = 45

// ordersWant is what the metrics of the orders target must say at the end:
// the phases' sums.
var ordersWant = struct {
	callsByStatus    map[string]float64 // rpc.response.status_code
	attemptsByKind   map[string]float64 // stormguard.attempt.kind
	refusalsByReason map[string]float64 // stormguard.reason
	budgetBalance    []float64          // at the end, on the simulated clock: one of these
}{
	callsByStatus:    map[string]float64{"OK": 687, "UNAVAILABLE": 1713},
	attemptsByKind:   map[string]float64{"first": 1596, "retry": wantRetries},
	refusalsByReason: map[string]float64{"breaker": 1346, "budget": 265, "max_attempts": 5, "not_idempotent": 97},
	budgetBalance:    []float64{10, 11},
}

// ordersAmplification is attempts per call on orders: (315+933+393)/2400.
const ordersAmplification = 1641.0 / 2400.0

// TestExpectationsAreDerived redoes the arithmetic of the comment above
// from the phases, the scripts, the seed and the breaker's defaults, and
// checks the expectations against it (and their sums against the totals),
// so that a change to any of them says which numbers to derive again.
func TestExpectationsAreDerived(t *testing.T) {
	const seed = 1
	flaky, outage, recovery := Phases[0], Phases[1], Phases[2]
	failsFirst := func(kind string, tick int) bool {
		return ordersScript(origin.Call{RequestID: requestID(kind, tick), Attempt: 1}).Code != codes.OK
	}
	kindAt := func(tick int) string {
		if tick%10 == 0 {
			return "notify"
		}
		return "put"
	}

	// flaky: failed Puts are retried once and succeed; failed Notifies fail.
	var calls, notifyFailed, putRetried int
	var notifyTicks []int
	for tick := flaky.From; tick < flaky.To; tick++ {
		calls++
		switch k := kindAt(tick); {
		case k == "notify" && failsFirst(k, tick):
			notifyFailed++
			notifyTicks = append(notifyTicks, tick)
		case k == "put" && failsFirst(k, tick):
			putRetried++
		}
	}
	assert.Equal(t, wantPhases[0].calls, calls)
	assert.Equal(t, wantPhases[0].failed, notifyFailed)
	assert.Equal(t, wantPhases[0].ok, calls-notifyFailed)
	assert.Equal(t, wantPhases[0].attempts, calls+putRetried)
	assert.Equal(t, Seen{notifyFailed, notifyTicks[0], notifyTicks[len(notifyTicks)-1]}, wantPhases[0].refusals[interceptor.ReasonNotIdempotent])

	// The breaker opens at the first tick of the first bucket after the
	// one holding the flaky phase's last success, plus the window.
	bucket := breaker.DefaultWindow / 10
	lastOK := time.Duration(flaky.To-1) * Step
	opened := int((lastOK/bucket + 10) * bucket / Step)
	// Then each open period ends at the first tick at or after its end.
	u := lockedRand(seed)
	period, at := breaker.DefaultOpenTimeout, opened
	var probes []int
	for {
		jittered := period + time.Duration(float64(period)*breaker.DefaultJitter*u())
		end := time.Duration(at)*Step + jittered
		at = int((end + Step - 1) / Step)
		probes = append(probes, at)
		if at >= outage.To {
			break // orders answers again: the probe closes the breaker
		}
		period = min(2*period, breaker.DefaultMaxOpenFactor*breaker.DefaultOpenTimeout)
	}
	var want []BreakerChange
	want = append(want, BreakerChange{opened, "orders", breaker.StateClosed, breaker.StateOpen})
	for i, p := range probes {
		to := breaker.StateOpen
		if i == len(probes)-1 {
			to = breaker.StateClosed
		}
		want = append(want, BreakerChange{p, "orders", breaker.StateOpen, breaker.StateHalfOpen}, BreakerChange{p, "orders", breaker.StateHalfOpen, to})
	}
	assert.Equal(t, want, wantBreaker)
	closedAt := probes[len(probes)-1]

	// Retries stop being the budget's once the endpoints' window (the last
	// epSlots slots of 1 s) no longer holds the flaky phase's last success.
	const epSlots, epSlot = 4, time.Second
	servedNothing := int((lastOK/epSlot + epSlots) * epSlot / Step)

	// outage until the breaker opens: every first attempt is sent.
	var notifies, budgetPuts, refusedPuts int
	for tick := outage.From; tick < opened; tick++ {
		switch {
		case kindAt(tick) == "notify":
			notifies++
		case tick < servedNothing:
			budgetPuts++
		default:
			refusedPuts++ // their retry is refused: served nothing lately
		}
	}
	ph := wantPhases[1]
	sentInOutage := []int{opened} // the opener, then the failed probes
	for _, p := range probes {
		if p < outage.To {
			sentInOutage = append(sentInOutage, p)
		}
	}
	probeRetries := 0
	for _, tick := range sentInOutage {
		if kindAt(tick) == "notify" {
			notifies++
		} else {
			probeRetries++ // a Put's retry, refused by the breaker
		}
	}
	assert.Equal(t, outage.To-outage.From, ph.calls)
	assert.Equal(t, ph.calls, ph.failed)
	assert.Equal(t, Seen{notifies, outage.From, opened}, ph.refusals[interceptor.ReasonNotIdempotent])
	refusedCalls := ph.calls - (opened - outage.From) - len(sentInOutage)
	assert.Equal(t, Seen{refusedPuts + refusedCalls + probeRetries, servedNothing + 1, outage.To - 1}, ph.refusals[interceptor.ReasonBreaker],
		"tick %d is a Notify", servedNothing)
	// The budget's share (PINNED): 30 retries; the 5 Puts that used two of
	// them stopped at max_attempts, every other Put was refused once.
	const outageRetries = wantRetries - 15
	maxed := ph.refusals[interceptor.ReasonMaxAttempts].N
	assert.Equal(t, budgetPuts-maxed, ph.refusals[interceptor.ReasonBudget].N, "every Put not maxed out is refused by the budget once")
	assert.Equal(t, servedNothing-1, ph.refusals[interceptor.ReasonBudget].Last)
	assert.Equal(t, (opened-outage.From)+len(sentInOutage)+outageRetries, ph.attempts)
	assert.Equal(t, map[interceptor.Reason]int{
		interceptor.ReasonBudget:  ph.refusals[interceptor.ReasonBudget].N,
		interceptor.ReasonBreaker: ph.refusals[interceptor.ReasonBreaker].N,
	}, ph.refusedBy)

	// recovery: refused until the probe that closes the breaker.
	ph = wantPhases[2]
	assert.Equal(t, Ticks-recovery.From, ph.calls)
	assert.Equal(t, Seen{closedAt - recovery.From, recovery.From, closedAt - 1}, ph.refusals[interceptor.ReasonBreaker])
	assert.Equal(t, Ticks-closedAt, ph.ok)
	assert.Equal(t, ph.ok, ph.attempts)

	// The totals are the phases' sums.
	var ok, failed, attempts int
	byReason := map[string]float64{}
	for _, w := range wantPhases {
		ok += w.ok
		failed += w.failed
		attempts += w.attempts
		for r, s := range w.refusals {
			byReason[string(r)] += float64(s.N)
		}
	}
	assert.Equal(t, map[string]float64{"OK": float64(ok), "UNAVAILABLE": float64(failed)}, ordersWant.callsByStatus)
	assert.Equal(t, float64(attempts), ordersWant.attemptsByKind["first"]+ordersWant.attemptsByKind["retry"])
	assert.Equal(t, float64(wantPhases[0].attempts-wantPhases[0].calls+outageRetries), ordersWant.attemptsByKind["retry"])
	assert.Equal(t, byReason, ordersWant.refusalsByReason)
	assert.Equal(t, float64(failed), sum(byReason), "one refusal per failed call")
	assert.InDelta(t, float64(attempts)/float64(Ticks), ordersAmplification, 1e-15)
}

func sum(m map[string]float64) float64 {
	var s float64
	for _, v := range m {
		s += v
	}
	return s
}
