package overload

// IsRetry reports whether the values of a request's
// grpc-previous-rpc-attempts metadata (gRFC A6) mark it as a retry or a
// hedge: one value that is a number above zero, or anything that is not a
// first attempt's header (a value that is not 1 to 10 ASCII digits, or
// several values). No value, or one value of only zeros ("0"), is a first
// attempt. IsRetry never allocates and reads at most the first 11 bytes of
// a value.
//
// The header is what the caller says, and protects the server from the
// retries and hedges of clients that send it, as the suite's client and
// grpc-go's retries and hedging do: retry-aware shedding sheds those
// before first attempts. A malformed or repeated header buys nothing: it
// is taken for a retry. But nothing in a request proves it is a first
// attempt: a retry whose client omits the header, or sends "0", is served
// as a first attempt, shed only where first attempts are (at
// MaxConcurrency, or at an adaptive limit when it has no deadline the
// Guard believes) and admitted as one otherwise. Only what bounds a
// caller's calls (MaxConcurrency, quotas by caller outside this package)
// bounds the retries of a client that hides them.
func IsRetry(values []string) bool {
	switch len(values) {
	case 0:
		return false
	case 1:
	default:
		return true
	}
	v := values[0]
	if len(v) == 0 || len(v) > 10 {
		return true
	}
	for i := 0; i < len(v); i++ {
		if v[i] != '0' {
			return true
		}
	}
	return false
}
