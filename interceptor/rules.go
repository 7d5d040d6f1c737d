package interceptor

import (
	"strconv"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/internal/engine"
	"github.com/stormguard/stormguard/semconv"
)

// Should a failed attempt be retried, and when? The engine's rules decide
// (internal/engine/rules.go: the server's "do not retry", the code, the
// method, the attempt limit, RetryPolicy.If, the delay, the deadline, the
// fail-over); here is what they read from grpc-go: the server's word on
// retrying, in a trailer (grpc-retry-pushback-ms) or in the status
// (google.rpc.RetryInfo), and RetryPolicy.If itself (call.RetryIf).

// MaxPushback is the longest delay before a retry that the client takes
// from a server, by grpc-retry-pushback-ms or by google.rpc.RetryInfo: a
// server asking for a longer wait is taken to mean "do not retry", so that
// a call without a deadline never sleeps for days on a server's word.
const MaxPushback = time.Minute

// The engine takes the same longest delay (a constant overflow otherwise).
const _ = uint64(MaxPushback-engine.MaxPushback) + uint64(engine.MaxPushback-MaxPushback)

// pushbackOf reads grpc-retry-pushback-ms from trailers (see
// parsePushback).
func pushbackOf(tr metadata.MD) engine.Delay {
	d, has, stop := parsePushback(tr)
	return engine.Delay{After: d, Set: has, Stop: stop, Sent: len(tr[semconv.PushbackKey]) > 0}
}

// budgetDry reports whether trailer tr says the server's retry budget
// could not pay for a retry (semconv.BudgetDryKey).
func budgetDry(tr metadata.MD) bool {
	vs := tr[semconv.BudgetDryKey]
	return len(vs) == 1 && vs[0] == "1"
}

// parsePushback reads grpc-retry-pushback-ms from trailers: has is true for
// one value from 0 to MaxPushback (the delay); stop is true for a negative,
// malformed or larger value, or several values.
func parsePushback(tr metadata.MD) (delay time.Duration, has, stop bool) {
	vs := tr[semconv.PushbackKey]
	switch len(vs) {
	case 0:
		return 0, false, false
	case 1:
	default:
		return 0, false, true
	}
	ms, err := strconv.ParseInt(vs[0], 10, 32)
	if err != nil || ms < 0 || ms > MaxPushback.Milliseconds() {
		return 0, false, true
	}
	return time.Duration(ms) * time.Millisecond, true, false
}

// retryInfoTypeURL is the type URL of google.rpc.RetryInfo in a status's
// details.
const retryInfoTypeURL = "type.googleapis.com/google.rpc.RetryInfo"

// parseRetryInfo reads the google.rpc.RetryInfo among the details of err's
// status (see retryInfoOf).
func parseRetryInfo(err error) (delay time.Duration, has, stop bool) {
	d := retryInfoOf(err)
	return d.After, d.Set, d.Stop
}

// retryInfoOf reads the google.rpc.RetryInfo among the details of err's
// status, as any gRPC server may send it (AIP-194): Set for a retry_delay
// from 0 to MaxPushback (the delay); Stop for a longer one, or for several
// RetryInfo details that disagree; Sent for any RetryInfo. A RetryInfo
// without a valid retry_delay (absent, negative, or malformed) is
// otherwise ignored, as are details that do not unmarshal.
func retryInfoOf(err error) engine.Delay {
	st, ok := status.FromError(err)
	if !ok {
		return engine.Delay{}
	}
	var out engine.Delay
	for _, d := range st.Proto().GetDetails() {
		if d.GetTypeUrl() != retryInfoTypeURL {
			continue
		}
		out.Sent = true
		var ri errdetails.RetryInfo
		if d.UnmarshalTo(&ri) != nil || ri.GetRetryDelay() == nil || ri.GetRetryDelay().CheckValid() != nil {
			continue
		}
		v := ri.GetRetryDelay().AsDuration()
		switch {
		case v < 0:
			continue
		case v > MaxPushback, out.Set && v != out.After:
			return engine.Delay{Stop: true, Sent: true}
		}
		out.After, out.Set = v, true
	}
	return out
}

// RetryIf implements engine.Host: it asks RetryPolicy.If, if any, whether
// the failure o may be retried (o.Err, or, for an attempt about to run
// past its per-attempt timeout, DEADLINE_EXCEEDED).
func (c *call) RetryIf(o engine.Outcome) bool {
	f := c.client.o.retryIf
	if f == nil {
		return true
	}
	err := o.Err
	if err == nil {
		err = c.timeoutError()
	}
	return f(c.ctx, c.route.method, err)
}
