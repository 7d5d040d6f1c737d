package interceptor

import (
	"strings"
	"time"

	"github.com/stormguard/stormguard/semconv"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/stormguard/stormguard/breaker"
)

// Reason says why a retry, a hedge or a call was not sent.
type Reason string

// Reasons for a refused retry, hedge or call.
const (
	ReasonBudget        Reason = "budget"         // the retry budget had no token
	ReasonBreaker       Reason = "breaker"        // the method's breaker is open, or the target has served nothing lately
	ReasonDeadline      Reason = "deadline"       // not enough time left before the deadline
	ReasonPushback      Reason = "pushback"       // the server said not to retry
	ReasonNotIdempotent Reason = "not_idempotent" // the method may not be repeated
	ReasonMaxAttempts   Reason = "max_attempts"   // the attempt limit is reached
	ReasonCode          Reason = "code"           // the status code is not retryable
	ReasonRetryIf       Reason = "retry_if"       // the RetryPolicy.If predicate said no
	ReasonGRPCRetry     Reason = "grpc_retry"     // grpc-go's own retry policy covers the method
	ReasonThrottle      Reason = "throttle"       // the service config's retryThrottling refused it
	// ReasonOverload: a hedge, or a retry beside a slow attempt (a
	// per-attempt timeout), not sent because the target is overloaded: it
	// said so lately (a pushback, RESOURCE_EXHAUSTED), or most recent calls
	// ran past the delay. The slow attempt runs on.
	ReasonOverload Reason = "overload"
)

// reasonInfo is one row of the refusal table: what a refusal for a reason
// means to the client that made it and to the server whose handler made
// the call.
type reasonInfo struct {
	// firstEvent is the span event when the reason refuses a call's first
	// attempt ("" for reasons that only refuse retries and hedges).
	firstEvent string
	// annotates: the status the caller gets carries an ErrorInfo
	// RETRY_REFUSED with the reason, so that code above can act on it
	// (RefusedBy).
	annotates bool
	// propagates: when a handler's outgoing call was refused for this
	// reason (or returns such an annotated status), the server interceptor
	// answers grpc-retry-pushback-ms: -1, so that the layers above do not
	// retry what the layer next to the failure already gave up on.
	propagates bool
	// fatal: the attempt's own answer settles the call; a hedged call
	// ends with it even while other attempts run.
	fatal bool
}

// refusals is the refusal table.
var refusals = map[Reason]reasonInfo{
	ReasonBudget:        {annotates: true, propagates: true},
	ReasonBreaker:       {firstEvent: semconv.EventBreakerRejected, annotates: true, propagates: true},
	ReasonDeadline:      {firstEvent: semconv.EventDeadlineFast, annotates: true},
	ReasonPushback:      {annotates: true, propagates: true},
	ReasonNotIdempotent: {fatal: true},
	ReasonMaxAttempts:   {propagates: true},
	ReasonCode:          {fatal: true},
	ReasonRetryIf:       {fatal: true},
	ReasonGRPCRetry:     {fatal: true},
	ReasonThrottle:      {annotates: true, propagates: true},
	ReasonOverload:      {},
}

func (r Reason) info() reasonInfo { return refusals[r] }

// propagates reports whether a refusal for r makes a stormguard server
// answer grpc-retry-pushback-ms: -1 when its handler's call was refused:
// budget, breaker, pushback, throttle and max_attempts do; the others do
// not.
func (r Reason) propagates() bool { return r.info().propagates }

// annotate returns err with an ErrorInfo RETRY_REFUSED saying why it was
// not retried, when the table says the reason annotates; the code is
// unchanged, and the message gets the refusal marker at its end (see
// RefusedBy), unless the Client was made WithoutRefusalMarker (plain).
func annotate(err error, reason Reason, plain bool) error {
	if err == nil || !reason.info().annotates {
		return err
	}
	p := status.Convert(err).Proto() // a copy
	if !plain {
		p.Message = stripMarker(p.Message) + messageMarker(reason)
	}
	withInfo, derr := status.FromProto(p).WithDetails(&errdetails.ErrorInfo{
		Reason:   semconv.ErrorReasonRetryRefused,
		Domain:   semconv.ErrorDomain,
		Metadata: map[string]string{"refused_by": string(reason)},
	})
	if derr != nil {
		return status.FromProto(p).Err()
	}
	return withInfo.Err()
}

// The refusal marker ends the message of a status whose retry the suite
// refused: " [stormguard: retry refused: budget]". It survives a client
// that rebuilds errors from their code and message alone, dropping the
// details (etcd's clientv3 does), so that RefusedBy can still read it.
const (
	markerPrefix = " [stormguard: retry refused: "
	markerSuffix = "]"
	// circuitOpenPrefix begins the message of a call an open breaker
	// refused (circuitOpenError).
	circuitOpenPrefix = "stormguard: circuit breaker open for "
)

func messageMarker(r Reason) string { return markerPrefix + string(r) + markerSuffix }

// stripMarker removes a refusal marker from the end of msg, so that a
// status refused twice (by two hops) carries one marker, the latest.
func stripMarker(msg string) string {
	if i := strings.LastIndex(msg, markerPrefix); i >= 0 && strings.HasSuffix(msg, markerSuffix) && !strings.Contains(msg[i+len(markerPrefix):len(msg)-1], "]") {
		return msg[:i]
	}
	return msg
}

// reasonInMessage returns the reason of the last refusal marker in msg
// (ReasonBreaker for an open breaker's message), or "" when it has none
// naming a known reason that annotates.
func reasonInMessage(msg string) Reason {
	if i := strings.LastIndex(msg, markerPrefix); i >= 0 {
		rest := msg[i+len(markerPrefix):]
		if j := strings.Index(rest, markerSuffix); j > 0 {
			if r := Reason(rest[:j]); r.info().annotates {
				return r
			}
		}
	}
	if strings.Contains(msg, circuitOpenPrefix) {
		return ReasonBreaker
	}
	return ""
}

// circuitOpenError is the status of a call on route r refused at now by
// its open breaker b.
func circuitOpenError(r *route, b *breaker.Breaker, now time.Time) error {
	target := r.key
	st := status.New(codes.Unavailable, circuitOpenPrefix+r.method+" on "+target)
	withInfo, err := st.WithDetails(
		&errdetails.ErrorInfo{Reason: semconv.ErrorReasonCircuitOpen, Domain: semconv.ErrorDomain, Metadata: map[string]string{"target": target, "method": r.method}},
		&errdetails.RetryInfo{RetryDelay: durationpb.New(b.RetryAfterAt(now))},
	)
	if err != nil {
		return st.Err()
	}
	return withInfo.Err()
}

// RefusedBy returns the reason stormguard attached to err when it refused a
// retry (budget, breaker, deadline or pushback), ReasonBreaker for a call
// refused by an open breaker, or "" when err carries no such mark.
//
// It reads the status's ErrorInfo details and, when a client between the
// suite and the caller dropped them (rebuilding the error from its code
// and message, or wrapping the message in an error of its own), the
// message: a refused retry's message ends with the marker
// " [stormguard: retry refused: <reason>]", and an open breaker's begins
// with "stormguard: circuit breaker open for ". A message with neither
// yields "".
func RefusedBy(err error) Reason {
	if err == nil {
		return ""
	}
	st, ok := status.FromError(err)
	if ok && st.Code() == codes.OK {
		return ""
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == semconv.ErrorDomain {
			switch info.GetReason() {
			case semconv.ErrorReasonCircuitOpen:
				return ReasonBreaker
			case semconv.ErrorReasonRetryRefused:
				return Reason(info.GetMetadata()["refused_by"])
			}
		}
	}
	return reasonInMessage(st.Message()) // err.Error() when err is no status
}
