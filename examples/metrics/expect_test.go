package main

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
)

// What the example's traffic must produce on the simulated clock (the
// default, seed 1), checked on /metrics by TestTraffic and in Prometheus by
// TestPrometheusE2E. The orders numbers are the same in every run. The
// suite runs with its defaults: a breaker per method of each target, which
// opens when every attempt of its 10 s window (ten buckets of 1 s, from
// tick 0) failed, with at least 20, for 1 s, then 2 s, then 4 s (the cap)
// while its probes fail, each lengthened by up to 20% (seeded jitter, one
// draw per opening, the breakers of both methods drawing from one
// sequence); no retry when the target served nothing lately (its
// endpoints' window, four slots of 1 s of the Client's clock, aligned on
// whole seconds, holds ≥ 3 attempts, all failed); a budget of 10% of the
// calls that banks at most two retries and lends at least 5 (or a tenth
// of the last second's calls) ahead of the calls that repay them; 3
// attempts at most.
// Derived by arithmetic (TestExpectationsAreDerived redoes it) unless
// marked PINNED: those come from the budget's bookkeeping and were
// identical in every run (go run . -exit three times, go test -count=5
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
//     (not_idempotent) and 270 Puts. PINNED: the budget's credit (two
//     retries) and its loan (a tenth of the last second's 100 calls) give
//     the first six Puts (ticks 301-306) two retries each, which fail, so
//     they stop at max_attempts (6): 12 retries in all. orders' server
//     answers those failures with stormguard-budget-dry (its own budget
//     for Put is spent), so the client pays any further retry from its
//     credit alone, starting no loan, and the calls of the outage only
//     repay what it lent (it would otherwise have granted a retry each
//     time they paid for one: 31 in all); every other Put is refused a
//     retry once: budget 264 (ticks 307-599).
//   - outage, served nothing lately (from 600): slot 2 has left the
//     endpoints' window (slots 3-6 hold failures only), so every Put's
//     retry is refused when it is due, after its backoff (breaker), while
//     the breakers' own windows, 10 s, still hold the flaky phase's
//     successes and every call is sent (Notifies: not_idempotent).
//   - outage, breakers open: bucket 2 leaves the breakers' windows at tick
//     1200, and each opens at its method's first failure from then on:
//     Notify's at tick 1200, Put's at 1201 (their last successes, ticks
//     290 and 299, were in bucket 2). Each then probes at its method's
//     first call at or after the end of its open period: Notify at 1310
//     and 1550, Put at 1321 and 1543 (their probes fail: a Put's retry is
//     refused by its breaker, a Notify is not_idempotent), and both close
//     in the recovery, Notify at 1980 and Put at 1984. Every other call of
//     a method whose breaker is open is refused without being sent
//     (breaker). So from tick 600 on, every Put records one breaker
//     refusal (990), and the Notifies after 1200 but the probes do (47):
//     breaker 1037 (ticks 601-1699); 91 + 2 Notifies are not_idempotent.
//     Attempts: 300 + 602 sent before the breakers opened, + 4 probes, +
//     12 retries = 918.
//   - recovery (1700-2399): orders answers again, but each breaker, still
//     open, refuses its method's calls until its probe succeeds and closes
//     it: 28 Notifies (1700-1970) and 255 Puts (1701-1983), breaker 283;
//     417 calls, all OK, one attempt each.
//
// Every failed call records exactly one refusal. The budget's balance at
// the end is its credit and a loan of a tenth of the calls it counts as the
// last second's: one of budgetBalance, which one depending on where the
// clock stands in the 100 ms slot of its window (a call counts for 0.9 to
// 1 s) when the traffic stops, with its backoff timers. search answers
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
		calls: 1400, ok: 0, failed: 1400, attempts: 918,
		refusedBy: map[interceptor.Reason]int{interceptor.ReasonBreaker: 1037, interceptor.ReasonBudget: 264},
		refusals: map[interceptor.Reason]Seen{
			interceptor.ReasonNotIdempotent: {93, 300, 1550},
			interceptor.ReasonMaxAttempts:   {6, 301, 306},
			interceptor.ReasonBudget:        {264, 307, 599},
			interceptor.ReasonBreaker:       {1037, 601, 1699},
		},
	},
	{
		calls: 700, ok: 417, failed: 283, attempts: 417,
		refusedBy: map[interceptor.Reason]int{interceptor.ReasonBreaker: 283},
		refusals:  map[interceptor.Reason]Seen{interceptor.ReasonBreaker: {283, 1700, 1983}},
	},
}

// wantBreaker is the breakers of orders' two methods, tick by tick: each
// opened once, probed twice in vain and closed by its third probe.
// search's never opens.
var wantBreaker = []BreakerChange{
	{1200, "orders", "Notify", breaker.StateClosed, breaker.StateOpen},
	{1201, "orders", "Put", breaker.StateClosed, breaker.StateOpen},
	{1310, "orders", "Notify", breaker.StateOpen, breaker.StateHalfOpen},
	{1310, "orders", "Notify", breaker.StateHalfOpen, breaker.StateOpen},
	{1321, "orders", "Put", breaker.StateOpen, breaker.StateHalfOpen},
	{1321, "orders", "Put", breaker.StateHalfOpen, breaker.StateOpen},
	{1543, "orders", "Put", breaker.StateOpen, breaker.StateHalfOpen},
	{1543, "orders", "Put", breaker.StateHalfOpen, breaker.StateOpen},
	{1550, "orders", "Notify", breaker.StateOpen, breaker.StateHalfOpen},
	{1550, "orders", "Notify", breaker.StateHalfOpen, breaker.StateOpen},
	{1980, "orders", "Notify", breaker.StateOpen, breaker.StateHalfOpen},
	{1980, "orders", "Notify", breaker.StateHalfOpen, breaker.StateClosed},
	{1984, "orders", "Put", breaker.StateOpen, breaker.StateHalfOpen},
	{1984, "orders", "Put", breaker.StateHalfOpen, breaker.StateClosed},
}

// wantRetries is the number of retries sent to orders (15 + 12, PINNED).
const wantRetries = 27

// ordersWant is what the metrics of the orders target must say at the end:
// the phases' sums.
var ordersWant = struct {
	callsByStatus    map[string]float64 // rpc.response.status_code
	attemptsByKind   map[string]float64 // stormguard.attempt.kind
	refusalsByReason map[string]float64 // stormguard.reason
	budgetBalance    []float64          // at the end, on the simulated clock: one of these
}{
	callsByStatus:    map[string]float64{"OK": 711, "UNAVAILABLE": 1689},
	attemptsByKind:   map[string]float64{"first": 1623, "retry": wantRetries},
	refusalsByReason: map[string]float64{"breaker": 1320, "budget": 264, "max_attempts": 6, "not_idempotent": 99},
	budgetBalance:    []float64{11, 12},
}

// ordersAmplification is attempts per call on orders: (315+918+417)/2400.
const ordersAmplification = 1650.0 / 2400.0

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
	method := map[string]string{"notify": "Notify", "put": "Put"}

	// flaky: failed Puts are retried once and succeed; failed Notifies fail.
	var calls, notifyFailed, putRetried int
	var notifyTicks []int
	lastOK := map[string]int{} // by kind: the tick of the last success
	for tick := flaky.From; tick < flaky.To; tick++ {
		calls++
		k := kindAt(tick)
		switch {
		case k == "notify" && failsFirst(k, tick):
			notifyFailed++
			notifyTicks = append(notifyTicks, tick)
			continue
		case k == "put" && failsFirst(k, tick):
			putRetried++
		}
		lastOK[k] = tick
	}
	assert.Equal(t, wantPhases[0].calls, calls)
	assert.Equal(t, wantPhases[0].failed, notifyFailed)
	assert.Equal(t, wantPhases[0].ok, calls-notifyFailed)
	assert.Equal(t, wantPhases[0].attempts, calls+putRetried)
	assert.Equal(t, Seen{notifyFailed, notifyTicks[0], notifyTicks[len(notifyTicks)-1]}, wantPhases[0].refusals[interceptor.ReasonNotIdempotent])

	// Each method's breaker opens at the method's first call (a failure)
	// from the first tick of the first bucket after the one holding its
	// last success, plus the window. Then it probes at the method's first
	// call at or after the end of each open period; openings draw their
	// jitter from one sequence, in the order they happen.
	bucket := breaker.DefaultWindow / 10
	opensFrom := map[string]int{}
	for k, ok := range lastOK {
		opensFrom[k] = int((time.Duration(ok)*Step/bucket + 10) * bucket / Step)
	}
	u := lockedRand(seed)
	type state struct {
		open      bool
		rounds    int
		until     time.Duration
		probes    []int // the ticks of its failed probes
		opened    int
		closedAt  int
		everOpen  bool
		closedYet bool
	}
	st := map[string]*state{"notify": {}, "put": {}}
	reopen := func(s *state, tick int) {
		period := breaker.DefaultOpenTimeout
		for range s.rounds {
			period = min(2*period, breaker.DefaultMaxOpenFactor*breaker.DefaultOpenTimeout)
		}
		s.open, s.until = true, time.Duration(tick)*Step+period+time.Duration(float64(period)*breaker.DefaultJitter*u())
	}
	var want []BreakerChange
	for tick := outage.From; tick < Ticks; tick++ {
		k := kindAt(tick)
		s := st[k]
		switch {
		case !s.everOpen && tick >= opensFrom[k]:
			s.everOpen, s.opened = true, tick
			reopen(s, tick)
			want = append(want, BreakerChange{tick, "orders", method[k], breaker.StateClosed, breaker.StateOpen})
		case s.open && time.Duration(tick)*Step >= s.until:
			want = append(want, BreakerChange{tick, "orders", method[k], breaker.StateOpen, breaker.StateHalfOpen})
			if tick < outage.To { // the probe fails
				s.rounds++
				s.probes = append(s.probes, tick)
				reopen(s, tick)
				want = append(want, BreakerChange{tick, "orders", method[k], breaker.StateHalfOpen, breaker.StateOpen})
				continue
			}
			s.open, s.closedAt, s.closedYet = false, tick, true
			want = append(want, BreakerChange{tick, "orders", method[k], breaker.StateHalfOpen, breaker.StateClosed})
		}
	}
	assert.Equal(t, want, wantBreaker)
	require.True(t, st["put"].closedYet && st["notify"].closedYet, "both breakers close in the recovery")

	// Retries stop being the budget's once the endpoints' window (the last
	// epSlots slots of 1 s) no longer holds the flaky phase's last success.
	const epSlots, epSlot = 4, time.Second
	lastAnyOK := max(lastOK["put"], lastOK["notify"])
	servedNothing := int((time.Duration(lastAnyOK)*Step/epSlot + epSlots) * epSlot / Step)

	// outage: a call is sent unless its method's breaker is open (its
	// opener and its probes are sent). A sent Put's retry is the budget's
	// before servedNothing, refused (breaker) after; a sent Notify is
	// not_idempotent; a call not sent is refused (breaker).
	ph := wantPhases[1]
	isProbe := func(k string, tick int) bool { return slices.Contains(st[k].probes, tick) }
	var notifies, budgetPuts, breakerRefusals, sent int
	firstBreaker := -1
	var lastNotify int
	for tick := outage.From; tick < outage.To; tick++ {
		k := kindAt(tick)
		s := st[k]
		sentNow := tick <= s.opened || isProbe(k, tick)
		if sentNow {
			sent++
		}
		switch {
		case k == "notify" && sentNow:
			notifies++
			lastNotify = tick
		case k == "put" && sentNow && tick < servedNothing:
			budgetPuts++
		default: // a Put's retry refused, or a call refused unsent
			breakerRefusals++
			if firstBreaker < 0 {
				firstBreaker = tick
			}
		}
	}
	assert.Equal(t, outage.To-outage.From, ph.calls)
	assert.Equal(t, ph.calls, ph.failed)
	assert.Equal(t, Seen{notifies, outage.From, lastNotify}, ph.refusals[interceptor.ReasonNotIdempotent])
	assert.Equal(t, Seen{breakerRefusals, firstBreaker, outage.To - 1}, ph.refusals[interceptor.ReasonBreaker])
	assert.Equal(t, servedNothing+1, firstBreaker, "tick %d is a Notify", servedNothing)
	// The budget's share (PINNED): 12 retries, two for each of the 6 Puts
	// that stopped at max_attempts; every other Put was refused once.
	const outageRetries = wantRetries - 15
	maxed := ph.refusals[interceptor.ReasonMaxAttempts].N
	assert.Equal(t, budgetPuts-maxed, ph.refusals[interceptor.ReasonBudget].N, "every Put not maxed out is refused by the budget once")
	assert.Equal(t, servedNothing-1, ph.refusals[interceptor.ReasonBudget].Last)
	assert.Equal(t, sent+outageRetries, ph.attempts)
	assert.Equal(t, map[interceptor.Reason]int{
		interceptor.ReasonBudget:  ph.refusals[interceptor.ReasonBudget].N,
		interceptor.ReasonBreaker: ph.refusals[interceptor.ReasonBreaker].N,
	}, ph.refusedBy)

	// recovery: a method's calls are refused until the probe that closes
	// its breaker.
	ph = wantPhases[2]
	var refused, lastRefused int
	for tick := recovery.From; tick < Ticks; tick++ {
		if tick < st[kindAt(tick)].closedAt {
			refused++
			lastRefused = tick
		}
	}
	assert.Equal(t, Ticks-recovery.From, ph.calls)
	assert.Equal(t, Seen{refused, recovery.From, lastRefused}, ph.refusals[interceptor.ReasonBreaker])
	assert.Equal(t, ph.calls-refused, ph.ok)
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
