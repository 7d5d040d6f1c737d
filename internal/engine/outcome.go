package engine

import (
	"net"
	"time"
)

// Code is an attempt's status code, numbered as gRPC numbers them (Connect
// uses the same numbers).
type Code uint32

// The status codes.
const (
	OK Code = iota
	Canceled
	Unknown
	InvalidArgument
	DeadlineExceeded
	NotFound
	AlreadyExists
	PermissionDenied
	ResourceExhausted
	FailedPrecondition
	Aborted
	OutOfRange
	Unimplemented
	Internal
	Unavailable
	DataLoss
	Unauthenticated
)

// CodeSet is a set of codes, one bit a code (bit c for code c: the layout
// of idempotency.CodeSet, so that one converts to the other). The zero
// CodeSet is empty.
type CodeSet uint32

// Codes returns the set of cs; OK and codes beyond Unauthenticated are
// left out.
func Codes(cs ...Code) CodeSet {
	var s CodeSet
	for _, c := range cs {
		if c > OK && c <= Unauthenticated {
			s |= 1 << c
		}
	}
	return s
}

// Has reports whether c is in s.
func (s CodeSet) Has(c Code) bool { return c < 32 && s&(1<<c) != 0 }

// Delay is what a server said of when a failed attempt may be retried: a
// pushback (grpc-retry-pushback-ms), or the retry delay of a
// google.rpc.RetryInfo, as the adapter parsed it. The zero Delay is "the
// server said nothing".
type Delay struct {
	After time.Duration // when Set: how long to wait, at most MaxPushback
	Set   bool          // the server gave a delay the client takes
	Stop  bool          // the server said not to retry (a negative, malformed or too long value)
	// Sent: the server sent one at all. A value that neither sets nor
	// stops (a RetryInfo without a valid delay) is ignored by the rules,
	// but still says the target is loaded (see Yield).
	Sent bool
}

// MaxPushback is the longest delay before a retry the client takes from a
// server: a longer one means "do not retry" (the adapter parses it so).
const MaxPushback = time.Minute

// Outcome is how an attempt ended, as the engine sees it: the status code,
// what the server said of retrying, the endpoint the attempt went to and
// the time. The adapter fills it from its transport's answer.
type Outcome struct {
	Code      Code
	Pushback  Delay    // the trailer's grpc-retry-pushback-ms
	RetryInfo Delay    // the status's google.rpc.RetryInfo
	Endpoint  net.Addr // nil: not known (the attempt failed before its pick, say)
	At        time.Time
	// TimedOut: the attempt was cut at its per-attempt timeout, so that
	// its DeadlineExceeded is retryable whatever the retryable codes.
	TimedOut bool
	// CallerLeft: the caller's context was done when the attempt ended
	// (the adapter reads it for failures only): nothing is decided, and a
	// cancellation says nothing of the target.
	CallerLeft bool
	// BudgetDry: the server said its retry budget for the method could
	// not pay for a retry of the attempt now (a stormguard server's
	// stormguard-budget-dry trailer). It speaks for the endpoint that
	// answered: the retry goes neither there nor to an endpoint that
	// failed lately, and is paid from the budget's credit alone.
	BudgetDry bool
	// Err is the adapter's own error for the attempt: the engine never
	// reads it, and hands it back (Host.RetryIf, Verdict).
	Err error
}

// Reason says why a retry, a hedge or a call was not sent; the zero
// Reason is none. The adapter shows it to its users by its name (String:
// interceptor.Reason has the same values).
type Reason uint8

// The reasons.
const (
	ReasonBudget Reason = iota + 1
	ReasonBreaker
	ReasonDeadline
	ReasonPushback
	ReasonNotIdempotent
	ReasonMaxAttempts
	ReasonCode
	ReasonRetryIf
	ReasonGRPCRetry
	ReasonThrottle
	ReasonOverload
	numReasons
)

var reasonNames = [numReasons]string{"", "budget", "breaker", "deadline", "pushback", "not_idempotent",
	"max_attempts", "code", "retry_if", "grpc_retry", "throttle", "overload"}

// String returns the reason's name ("budget", "breaker", ...; "" for
// none).
func (r Reason) String() string {
	if r >= numReasons {
		return ""
	}
	return reasonNames[r]
}

// Kind says why an attempt was sent.
type Kind uint8

// The kinds of attempts.
const (
	First Kind = iota
	Retry
	Hedge
	NumKinds
)

var kindNames = [NumKinds]string{"first", "retry", "hedge"}

// String returns "first", "retry" or "hedge".
func (k Kind) String() string { return kindNames[k] }
