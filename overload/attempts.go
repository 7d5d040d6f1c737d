package overload

// IsRetry reports whether the values of a request's
// grpc-previous-rpc-attempts metadata (gRFC A6) mark it as a retry or a
// hedge. No value, or one value of only zeros ("0"), is a first attempt;
// anything else, including a malformed value or several values, is a
// retry: a caller cannot buy priority with a bad header. IsRetry never
// allocates and reads at most the first 11 bytes of a value.
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
