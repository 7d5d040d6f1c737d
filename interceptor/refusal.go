package interceptor

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"strings"

	"github.com/stormguard/stormguard/semconv"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
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
// not retried, sealed by this process (see seal), when the table says the
// reason annotates; the code is unchanged, and the message gets the
// refusal marker at its end (see RefusedBy), unless the Client was made
// WithoutRefusalMarker (plain).
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
		Metadata: map[string]string{"refused_by": string(reason), sealKey: seal},
	})
	if derr != nil {
		return status.FromProto(p).Err()
	}
	return withInfo.Err()
}

// The refusal marker ends the message of a status whose retry the suite
// refused: " [stormguard: retry refused: budget #3f9a…]", with this
// process's seal. It survives a client that rebuilds errors from their
// code and message alone, dropping the details (etcd's clientv3 does), so
// that RefusedBy can still read it. A suite server forwarding the refusal
// up the chain drops the seal (unseal): " [stormguard: retry refused:
// budget]" is a refusal made elsewhere.
const (
	markerPrefix = " [stormguard: retry refused: "
	markerSuffix = "]"
	// circuitOpenPrefix begins the message of a call an open breaker
	// refused (circuitOpenError), which ends with sealPrefix, the seal
	// and markerSuffix.
	circuitOpenPrefix = "stormguard: circuit breaker open for "
	sealPrefix        = " [stormguard #"
	// sealKey is the ErrorInfo metadata key of the seal.
	sealKey = "seal"
)

// seal marks the refusals this process made, in their messages and
// ErrorInfo details: 16 hex digits drawn at random when the process
// starts. A server cannot guess it, so a marker or detail it sends, in
// the suite's format or not, is never taken for a refusal of this
// process; and a suite server drops it from what it forwards up the
// chain (unseal), so that the processes above it do not learn it.
var seal = newSeal()

func newSeal() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

func messageMarker(r Reason) string { return markerPrefix + string(r) + " #" + seal + markerSuffix }

// stripMarker removes a refusal marker, sealed or not, from the end of
// msg, so that a status refused twice (by two hops) carries one marker,
// the latest.
func stripMarker(msg string) string {
	if i := strings.LastIndex(msg, markerPrefix); i >= 0 && strings.HasSuffix(msg, markerSuffix) && !strings.Contains(msg[i+len(markerPrefix):len(msg)-1], "]") {
		return msg[:i]
	}
	return msg
}

// knownReason returns the Reason named name when it is one that annotates
// a status (the reasons RefusedBy reports), and "" otherwise: what comes
// out is always one of the package's constants, never a string of the
// sender's choosing.
func knownReason(name string) Reason {
	for _, r := range []Reason{ReasonBudget, ReasonBreaker, ReasonDeadline, ReasonPushback, ReasonThrottle} {
		if name == string(r) {
			return r
		}
	}
	return ""
}

// sealedBy reports whether s is this process's seal.
func sealedBy(s string) bool { return s == seal }

// markerIn returns the reason of the last refusal marker in msg (a known
// reason that annotates, or an open breaker's message), and whether this
// process sealed it; "" when msg has none.
func markerIn(msg string) (r Reason, local bool) {
	if i := strings.LastIndex(msg, markerPrefix); i >= 0 {
		rest := msg[i+len(markerPrefix):]
		if j := strings.Index(rest, markerSuffix); j > 0 {
			name, s, _ := strings.Cut(rest[:j], " #")
			if r := knownReason(name); r != "" {
				return r, sealedBy(s)
			}
		}
	}
	if i := strings.LastIndex(msg, circuitOpenPrefix); i >= 0 {
		rest := msg[i:]
		if k := strings.LastIndex(rest, sealPrefix); k >= 0 {
			s, _, _ := strings.Cut(rest[k+len(sealPrefix):], markerSuffix)
			return ReasonBreaker, sealedBy(s)
		}
		return ReasonBreaker, false
	}
	return "", false
}

// RefusedBy returns the reason this process's stormguard Client attached
// to err when it refused a retry (budget, breaker, deadline, pushback or
// throttle), ReasonBreaker for a call it refused by an open breaker, or
// "" when err carries no such refusal of this process.
//
// It reads the status's ErrorInfo details and, when a client between the
// suite and the caller dropped them (rebuilding the error from its code
// and message, or wrapping the message in an error of its own), the
// message: a refused retry's message ends with the marker
// " [stormguard: retry refused: <reason> #<seal>]", and an open breaker's
// reads "stormguard: circuit breaker open for <method> on <target>
// [stormguard #<seal>]". The seal is drawn at random when the process
// starts: what a server sends (a marker, an ErrorInfo in the suite's
// domain) never makes RefusedBy report a refusal, and what it reports is
// always one of the Reason constants. A refusal a suite server's own
// client made down the chain, forwarded in the server's status, is not
// this process's: RefusedDownstream reports it.
func RefusedBy(err error) Reason {
	local, _ := refusalsIn(err)
	return local
}

// RefusedDownstream returns the reason of a refusal made by another
// process down the chain (the client of a server whose handler returned
// its refused call's error), as err carries it, or "" when it carries
// none. It is the server's word: a reason RefusedBy could report, never a
// string of the server's choosing. It is independent of RefusedBy: a call
// this process refused to retry because the server said not to (pushback)
// may carry the refusal that made the server say so.
func RefusedDownstream(err error) Reason {
	_, forwarded := refusalsIn(err)
	return forwarded
}

// refusalsIn returns the refusal of this process that err carries, and
// that of another process, each "" when it carries none.
func refusalsIn(err error) (local, forwarded Reason) {
	if err == nil {
		return "", ""
	}
	st, ok := status.FromError(err)
	if ok && st.Code() == codes.OK {
		return "", ""
	}
	for _, d := range st.Proto().GetDetails() {
		if d.GetTypeUrl() != errorInfoTypeURL {
			continue
		}
		var info errdetails.ErrorInfo
		if d.UnmarshalTo(&info) != nil || info.GetDomain() != semconv.ErrorDomain {
			continue
		}
		var r Reason
		switch info.GetReason() {
		case semconv.ErrorReasonCircuitOpen:
			r = ReasonBreaker
		case semconv.ErrorReasonRetryRefused:
			r = knownReason(info.GetMetadata()["refused_by"])
		}
		switch {
		case r == "":
		case sealedBy(info.GetMetadata()[sealKey]):
			local = r
		default:
			forwarded = r
		}
	}
	if local == "" || forwarded == "" {
		// The details were dropped (or never there): the message.
		switch r, mine := markerIn(st.Message()); { // err.Error() when err is no status
		case r == "":
		case mine && local == "":
			local = r
		case !mine && forwarded == "":
			forwarded = r
		}
	}
	return local, forwarded
}

// errorInfoTypeURL is the type URL of google.rpc.ErrorInfo in a status's
// details.
const errorInfoTypeURL = "type.googleapis.com/google.rpc.ErrorInfo"

// unseal returns err as a suite server sends it up the chain: a refusal
// this process made (sealed) becomes one made elsewhere, its seal dropped
// from the message and the details, so that the callers above tell it
// apart (RefusedDownstream) and do not learn the seal. Any other error is
// returned as it is. An error that is no status is made the status grpc
// would send for it.
func unseal(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		if !strings.Contains(err.Error(), seal) {
			return err
		}
		st = status.FromContextError(err)
	}
	p := st.Proto() // a copy
	changed := false
	for sealed, open := " #"+seal+markerSuffix, sealPrefix+seal+markerSuffix; strings.Contains(p.Message, sealed) || strings.Contains(p.Message, open); {
		// Until none is left: dropping one may join the text around it
		// into another.
		p.Message = strings.ReplaceAll(strings.ReplaceAll(p.Message, sealed, markerSuffix), open, "")
		changed = true
	}
	for i, d := range p.GetDetails() {
		if d.GetTypeUrl() != errorInfoTypeURL || !bytes.Contains(d.GetValue(), []byte(seal)) {
			continue
		}
		var info errdetails.ErrorInfo
		if d.UnmarshalTo(&info) != nil || !sealedBy(info.GetMetadata()[sealKey]) {
			continue
		}
		delete(info.Metadata, sealKey)
		if a, aerr := anypb.New(&info); aerr == nil {
			p.Details[i], changed = a, true
		}
	}
	if !changed {
		return err
	}
	return status.FromProto(p).Err()
}
