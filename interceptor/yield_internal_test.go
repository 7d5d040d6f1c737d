package interceptor

import (
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/stormguard/stormguard/semconv"
)

// TestYieldRules drives a target's yield on explicit time: an overload
// signal holds hedges back for yieldHold, and a majority of late calls
// among at least yieldMinCalls recent ones for as long as they stay in the
// window; a failure that says nothing of load changes nothing.
func TestYieldRules(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	withRetryInfo, _ := status.New(codes.Unavailable, "busy").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(time.Second)})
	for _, c := range []struct {
		name   string
		err    error
		tr     metadata.MD
		signal bool
	}{
		{"unavailable", status.Error(codes.Unavailable, "down"), nil, false},
		{"pushback -1", status.Error(codes.Unavailable, "shed"), metadata.Pairs(semconv.PushbackKey, "-1"), true},
		{"pushback 100", status.Error(codes.Unavailable, "shed"), metadata.Pairs(semconv.PushbackKey, "100"), true},
		{"RetryInfo", withRetryInfo.Err(), nil, true},
		{"resource exhausted", status.Error(codes.ResourceExhausted, "quota"), nil, true},
	} {
		y := newYield()
		y.overloaded(t0, c.err, c.tr)
		if got := y.yields(t0); got != c.signal {
			t.Errorf("%s: yields %v, want %v", c.name, got, c.signal)
		}
		if c.signal && (!y.yields(t0.Add(yieldHold-time.Millisecond)) || y.yields(t0.Add(yieldHold))) {
			t.Errorf("%s: the signal does not hold for exactly %v", c.name, yieldHold)
		}
	}
	var nilYield *yield // beyond maxRoutes targets: never yields
	nilYield.overloaded(t0, status.Error(codes.ResourceExhausted, ""), nil)
	nilYield.watched(t0)
	nilYield.late(t0)
	if nilYield.yields(t0) {
		t.Error("a nil yield yields")
	}

	late := func(watched, late int) *yield {
		y := newYield()
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
