package interceptor

import (
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/stormguard/stormguard/internal/engine"
	"github.com/stormguard/stormguard/semconv"
)

// May an attempt be sent, or paid for, now? The engine's admission
// decides (internal/engine/gates.go: time left, the breaker, whether the
// target serves nothing, the service config's throttle, the budget, the
// endpoints, shadow mode); here is what its answers become for a grpc-go
// caller: the status a call refused before it sent anything fails with,
// and the events of shadow mode, of probes and of hedges.

// admitted records what the engine's admission said of attempt a at now
// (a refusal that did not stand in shadow mode, a probe, a hedge sent),
// and returns why a may not be sent ("" when it may), with the status a
// call refused before it sent anything fails with.
func (c *call) admitted(a *engine.Attempt, adm engine.Admission, now time.Time) (Reason, error) {
	if adm.Would != 0 {
		c.wouldRefuse(reasonOf(adm.Would))
	}
	if adm.Probe != 0 {
		c.event(semconv.EventOuterProbe, semconv.AttrReason.String(adm.Probe.String()))
	}
	switch {
	case adm.Refused != 0:
		return reasonOf(adm.Refused), c.gateError(adm, now)
	case a.Kind == engine.Hedge:
		c.event(semconv.EventHedgeSent, semconv.AttrPreviousAttempts.Int(c.e.Sent()-1))
	}
	return "", nil
}

// gateError is the status of a call refused at now, before it sent
// anything, by the gate that refused it: time left, or the open breaker.
// Other refusals leave the call with its last attempt's status (nil).
func (c *call) gateError(adm engine.Admission, now time.Time) error {
	if !adm.Fails {
		return nil
	}
	switch adm.Refused {
	case engine.ReasonDeadline:
		return c.client.dl.Check(c.e.Deadline.Sub(now))
	case engine.ReasonBreaker:
		return circuitOpenError(c.route, adm.RetryAfter)
	}
	return nil
}

// circuitOpenError is the status of a call on route r refused by its
// open breaker, which lets a probe through after retryAfter, sealed by
// this process.
func circuitOpenError(r *route, retryAfter time.Duration) error {
	target := r.key
	st := status.New(codes.Unavailable, circuitOpenPrefix+r.method+" on "+target+sealPrefix+seal+markerSuffix)
	withInfo, err := st.WithDetails(
		&errdetails.ErrorInfo{Reason: semconv.ErrorReasonCircuitOpen, Domain: semconv.ErrorDomain, Metadata: map[string]string{"target": target, "method": r.method, sealKey: seal}},
		&errdetails.RetryInfo{RetryDelay: durationpb.New(retryAfter)},
	)
	if err != nil {
		return st.Err()
	}
	return withInfo.Err()
}
