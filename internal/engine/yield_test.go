package engine

import (
	"testing"
	"time"
)

// TestYieldRules drives a target's yield on explicit time: an overload
// signal holds hedges back for yieldHold, and a majority of late calls
// among at least yieldMinCalls recent ones for as long as they stay in the
// window; a failure that says nothing of load changes nothing.
func TestYieldRules(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	for _, c := range []struct {
		name   string
		o      Outcome
		signal bool
	}{
		{"unavailable", Outcome{Code: Unavailable}, false},
		{"pushback -1", Outcome{Code: Unavailable, Pushback: Delay{Stop: true, Sent: true}}, true},
		{"pushback 100", Outcome{Code: Unavailable, Pushback: Delay{After: 100 * time.Millisecond, Set: true, Sent: true}}, true},
		{"RetryInfo", Outcome{Code: Unavailable, RetryInfo: Delay{After: time.Second, Set: true, Sent: true}}, true},
		{"RetryInfo without a delay", Outcome{Code: Unavailable, RetryInfo: Delay{Sent: true}}, true},
		{"resource exhausted", Outcome{Code: ResourceExhausted}, true},
	} {
		y := NewYield()
		c.o.At = t0
		y.overloaded(&c.o)
		if got := y.yields(t0); got != c.signal {
			t.Errorf("%s: yields %v, want %v", c.name, got, c.signal)
		}
		if c.signal && (!y.yields(t0.Add(yieldHold-time.Millisecond)) || y.yields(t0.Add(yieldHold))) {
			t.Errorf("%s: the signal does not hold for exactly %v", c.name, yieldHold)
		}
	}
	var nilYield *Yield // beyond maxRoutes targets: never yields
	nilYield.overloaded(&Outcome{Code: ResourceExhausted, At: t0})
	nilYield.watched(t0)
	nilYield.late(t0)
	if nilYield.yields(t0) {
		t.Error("a nil yield yields")
	}

	late := func(watched, late int) *Yield {
		y := NewYield()
		for i := range watched {
			y.watched(t0)
			if i < late {
				y.late(t0)
			}
		}
		return y
	}
	for _, c := range []struct {
		watched, late int
		want          bool
	}{
		{20, 10, false}, {20, 11, true}, {3, 3, false}, {4, 3, true}, {4, 2, false},
	} {
		if got := late(c.watched, c.late).yields(t0); got != c.want {
			t.Errorf("%d of %d calls late: yields %v, want %v", c.late, c.watched, got, c.want)
		}
	}
	if late(20, 20).yields(t0.Add(yieldSlots * yieldSlot)) {
		t.Error("late calls a whole window ago still hold hedges back")
	}
}
