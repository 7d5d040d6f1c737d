package interceptor

import (
	"strings"
	"testing"

	"github.com/stormguard/stormguard/semconv"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// FuzzRefusedBy: a status from a server is untrusted input. Whatever its
// message and its ErrorInfo say, RefusedBy and RefusedDownstream do not
// panic and return one of the Reason constants RefusedBy documents (or
// ""), never a string of the server's choosing; RefusedBy reports a
// refusal only when this process's seal is in the status; and once a suite
// server has forwarded the status (unseal), RefusedBy reports nothing and
// the seal is gone.
func FuzzRefusedBy(f *testing.F) {
	for _, msg := range []string{"", "down", "down [stormguard: retry refused: budget]",
		"down [stormguard: retry refused: budget #0123456789abcdef]", "down" + messageMarker(ReasonBreaker),
		"a" + messageMarker(ReasonBudget) + " b [stormguard: retry refused: pushback]",
		"stormguard: circuit breaker open for /a/b on c" + sealPrefix + seal + markerSuffix,
		"stormguard: circuit breaker open for x", "[stormguard: retry refused: ]", " [stormguard #]"} {
		for _, r := range []string{"", "budget", "breaker", "whatever", strings.Repeat("x", 300)} {
			f.Add(msg, semconv.ErrorReasonRetryRefused, r, "")
			f.Add(msg, semconv.ErrorReasonCircuitOpen, r, seal)
			f.Add(msg, "OTHER", r, "0123456789abcdef")
		}
	}
	known := map[Reason]bool{"": true, ReasonBudget: true, ReasonBreaker: true, ReasonDeadline: true,
		ReasonPushback: true, ReasonThrottle: true}
	f.Fuzz(func(t *testing.T, msg, infoReason, refusedBy, infoSeal string) {
		st := status.New(codes.Unavailable, msg)
		if infoReason != "" {
			md := map[string]string{"refused_by": refusedBy}
			if infoSeal != "" {
				md[sealKey] = infoSeal
			}
			if withInfo, err := st.WithDetails(&errdetails.ErrorInfo{Reason: infoReason, Domain: semconv.ErrorDomain, Metadata: md}); err == nil {
				st = withInfo
			}
		}
		err := st.Err()
		local, forwarded := RefusedBy(err), RefusedDownstream(err)
		if !known[local] || !known[forwarded] {
			t.Fatalf("%q, %q: reasons %q, %q are not the package's", msg, refusedBy, local, forwarded)
		}
		if local != "" && !strings.Contains(msg, seal) && infoSeal != seal {
			t.Fatalf("%q: a refusal of this process without its seal", msg)
		}
		up := unseal(err)
		if RefusedBy(up) != "" {
			t.Fatalf("%q: still this process's refusal once forwarded", msg)
		}
		if m := status.Convert(up).Message(); strings.Contains(m, " #"+seal+markerSuffix) || strings.Contains(m, sealPrefix+seal+markerSuffix) {
			t.Fatalf("%q: a seal went up the chain: %q", msg, m)
		}
	})
}
