package interceptor

import (
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
	ReasonRetryIf       Reason = "retry_if"       // the WithRetryIf predicate said no
	ReasonGRPCRetry     Reason = "grpc_retry"     // grpc-go's own retry policy covers the method
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
	ReasonBreaker:       {firstEvent: EventBreakerRejected, annotates: true, propagates: true},
	ReasonDeadline:      {firstEvent: EventDeadlineFast, annotates: true},
	ReasonPushback:      {annotates: true, propagates: true},
	ReasonNotIdempotent: {fatal: true},
	ReasonMaxAttempts:   {propagates: true},
	ReasonCode:          {fatal: true},
	ReasonRetryIf:       {fatal: true},
	ReasonGRPCRetry:     {fatal: true},
}

func (r Reason) info() reasonInfo { return refusals[r] }

// Propagates reports whether a refusal for r makes a stormguard server
// answer grpc-retry-pushback-ms: -1 when its handler's call was refused:
// budget, breaker, pushback and max_attempts do; the others do not.
func (r Reason) Propagates() bool { return r.info().propagates }

// ErrorInfo reasons and domain of the details stormguard adds to statuses.
const (
	// ErrorDomain is the ErrorInfo domain of stormguard's details.
	ErrorDomain = "stormguard"
	// ErrorReasonCircuitOpen: the call was not sent because the breaker
	// of its method on its target is open (code Unavailable, with a
	// RetryInfo saying how long it stays open; the metadata keys "target"
	// and "method" name the breaker).
	ErrorReasonCircuitOpen = "CIRCUIT_OPEN"
	// ErrorReasonRetryRefused: the status is the last attempt's, unchanged;
	// a retry was refused, and the metadata key "refused_by" says why
	// (budget, breaker, deadline or pushback).
	ErrorReasonRetryRefused = "RETRY_REFUSED"
)

// annotate returns err with an ErrorInfo RETRY_REFUSED saying why it was
// not retried, when the table says the reason annotates; code and message
// are unchanged.
func annotate(err error, reason Reason) error {
	if err == nil || !reason.info().annotates {
		return err
	}
	st := status.Convert(err)
	withInfo, derr := st.WithDetails(&errdetails.ErrorInfo{
		Reason:   ErrorReasonRetryRefused,
		Domain:   ErrorDomain,
		Metadata: map[string]string{"refused_by": string(reason)},
	})
	if derr != nil {
		return err
	}
	return withInfo.Err()
}

// circuitOpenError is the status of a call on route r refused by its open
// breaker b.
func circuitOpenError(r *route, b *breaker.Breaker) error {
	target := canonicalTarget(r.target)
	st := status.New(codes.Unavailable, "stormguard: circuit breaker open for "+r.method+" on "+target)
	withInfo, err := st.WithDetails(
		&errdetails.ErrorInfo{Reason: ErrorReasonCircuitOpen, Domain: ErrorDomain, Metadata: map[string]string{"target": target, "method": r.method}},
		&errdetails.RetryInfo{RetryDelay: durationpb.New(b.RetryAfter())},
	)
	if err != nil {
		return st.Err()
	}
	return withInfo.Err()
}

// RefusedBy returns the reason stormguard attached to err when it refused a
// retry (budget, breaker, deadline or pushback), ReasonBreaker for a call
// refused by an open breaker, or "" when err carries no such detail.
func RefusedBy(err error) Reason {
	st, ok := status.FromError(err)
	if !ok || st.Code() == codes.OK {
		return ""
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == ErrorDomain {
			switch info.GetReason() {
			case ErrorReasonCircuitOpen:
				return ReasonBreaker
			case ErrorReasonRetryRefused:
				return Reason(info.GetMetadata()["refused_by"])
			}
		}
	}
	return ""
}
