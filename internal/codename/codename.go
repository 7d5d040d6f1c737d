// Package codename maps gRPC status codes to and from their canonical
// names ("UNAVAILABLE"), as the gRPC service config, gRFC A6 and the
// OpenTelemetry rpc.response.status_code attribute spell them.
package codename

import (
	"strconv"

	"google.golang.org/grpc/codes"
)

// names holds the canonical name of every code, OK to Unauthenticated.
var names = [...]string{
	codes.OK:                 "OK",
	codes.Canceled:           "CANCELLED",
	codes.Unknown:            "UNKNOWN",
	codes.InvalidArgument:    "INVALID_ARGUMENT",
	codes.DeadlineExceeded:   "DEADLINE_EXCEEDED",
	codes.NotFound:           "NOT_FOUND",
	codes.AlreadyExists:      "ALREADY_EXISTS",
	codes.PermissionDenied:   "PERMISSION_DENIED",
	codes.ResourceExhausted:  "RESOURCE_EXHAUSTED",
	codes.FailedPrecondition: "FAILED_PRECONDITION",
	codes.Aborted:            "ABORTED",
	codes.OutOfRange:         "OUT_OF_RANGE",
	codes.Unimplemented:      "UNIMPLEMENTED",
	codes.Internal:           "INTERNAL",
	codes.Unavailable:        "UNAVAILABLE",
	codes.DataLoss:           "DATA_LOSS",
	codes.Unauthenticated:    "UNAUTHENTICATED",
}

// Name returns the canonical name of c, or "CODE(n)" for a code outside
// 0..16. It does not allocate for known codes.
func Name(c codes.Code) string {
	if int(c) < len(names) {
		return names[c]
	}
	return "CODE(" + strconv.FormatUint(uint64(c), 10) + ")"
}

// Parse returns the code with the canonical name s (exact, upper case).
func Parse(s string) (codes.Code, bool) {
	for c, n := range names {
		if n == s {
			return codes.Code(c), true
		}
	}
	return codes.OK, false
}
