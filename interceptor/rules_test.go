package interceptor

import (
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/stormguard/stormguard/internal/engine"
	"github.com/stormguard/stormguard/semconv"
)

// TestTheServersWord: what the engine sees of a server's word on
// retrying, from a trailer and a status as grpc-go gives them: a pushback
// or a RetryInfo of any value is sent (the target says it is loaded, see
// engine.Yield), a valid one sets a delay, a negative pushback stops, and
// a RetryInfo without a delay is sent but says nothing of when.
func TestTheServersWord(t *testing.T) {
	withRetryInfo := func(d *durationpb.Duration) error {
		st, _ := status.New(codes.Unavailable, "busy").WithDetails(&errdetails.RetryInfo{RetryDelay: d})
		return st.Err()
	}
	for _, c := range []struct {
		name                string
		err                 error
		tr                  metadata.MD
		pushback, retryInfo engine.Delay
	}{
		{"unavailable", status.Error(codes.Unavailable, "down"), nil, engine.Delay{}, engine.Delay{}},
		{"pushback -1", status.Error(codes.Unavailable, "shed"), metadata.Pairs(semconv.PushbackKey, "-1"),
			engine.Delay{Stop: true, Sent: true}, engine.Delay{}},
		{"pushback 100", status.Error(codes.Unavailable, "shed"), metadata.Pairs(semconv.PushbackKey, "100"),
			engine.Delay{After: 100 * time.Millisecond, Set: true, Sent: true}, engine.Delay{}},
		{"RetryInfo", withRetryInfo(durationpb.New(time.Second)), nil,
			engine.Delay{}, engine.Delay{After: time.Second, Set: true, Sent: true}},
		{"RetryInfo without a delay", withRetryInfo(nil), nil, engine.Delay{}, engine.Delay{Sent: true}},
		{"RetryInfo beyond MaxPushback", withRetryInfo(durationpb.New(MaxPushback + time.Second)), nil,
			engine.Delay{}, engine.Delay{Stop: true, Sent: true}},
	} {
		if got := pushbackOf(c.tr); got != c.pushback {
			t.Errorf("%s: pushback %+v, want %+v", c.name, got, c.pushback)
		}
		if got := retryInfoOf(c.err); got != c.retryInfo {
			t.Errorf("%s: RetryInfo %+v, want %+v", c.name, got, c.retryInfo)
		}
	}
}
