package overload

// IsRetry reports whether the values of a request's
// grpc-previous-rpc-attempts metadata (gRFC A6) mark it as a retry or a
// hedge: one value that is a number above zero, or anything that is not a
// first attempt's header (a value that is not 1 to 10 ASCII digits, or
// several values). No value, or one value of only zeros ("0"), is a first
// attempt. IsRetry never allocates and reads at most the first 11 bytes of
// a value.
//
// The header is the caller's word. It protects the server from the retries
// and hedges of clients that send it, as the suite's client and grpc-go
// do, and a malformed or repeated one buys nothing; but a retry sent
// without it, or with "0", is a first attempt to the Guard. Only what
// bounds a caller's calls (MaxConcurrency, quotas by caller) bounds the
// retries of a client that hides them; see docs/overload.md.
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
