package deadline

import (
	"strconv"
	"sync"
	"time"
)

// MetadataKey is the request metadata key that carries the caller's
// remaining time: a plain non-negative decimal count of whole milliseconds
// left when the attempt was sent, e.g. "250" (see [FormatHeader] for the
// rounding: "0" means no time was left).
const MetadataKey = "stormguard-deadline-ms"

// MaxHeader is the largest duration [ParseHeader] returns and
// [FormatHeader] writes: 30 days (2,592,000,000 ms). A header may have up
// to 10 digits (9,999,999,999 ms, about 115 days); a larger value is no
// more useful than "no deadline", so ParseHeader clamps it to MaxHeader
// rather than reject it, and FormatHeader never writes more, so whatever a
// stormguard client sends a stormguard server accepts.
const MaxHeader = 30 * 24 * time.Hour

// maxDigits is the longest header value ParseHeader accepts.
const maxDigits = 10

// ParseHeader parses one value of the [MetadataKey] header: a plain
// non-negative decimal number of milliseconds, 1 to 10 ASCII digits (leading
// zeros allowed), with no sign, space, unit, fraction, exponent or other
// character. A value above [MaxHeader] is clamped to MaxHeader. Anything
// else, including the empty string, gives ok == false and d == 0.
//
// ParseHeader never panics and never allocates; it looks at no more than
// the first 11 bytes of v.
func ParseHeader(v string) (d time.Duration, ok bool) {
	if len(v) == 0 || len(v) > maxDigits {
		return 0, false
	}
	var n int64
	for i := 0; i < len(v); i++ {
		c := v[i] - '0' // bytes below '0' wrap around to > 9
		if c > 9 {
			return 0, false
		}
		n = n*10 + int64(c)
	}
	// n <= 9,999,999,999: n ms in nanoseconds is below 1e16, far from
	// overflowing a time.Duration.
	return min(time.Duration(n)*time.Millisecond, MaxHeader), true
}

// headerMillis is the header value for d: whole milliseconds, rounded
// down, in [0, MaxHeader]; 1 for a positive d under a millisecond.
func headerMillis(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return max(int64(min(d, MaxHeader)/time.Millisecond), 1)
}

// FormatHeader returns the [MetadataKey] value for a remaining duration d:
// whole milliseconds, rounded down, except that a positive d under a
// millisecond gives "1": "0" means no time is left, and a server refuses
// it, so a call with 0.9 ms left is not made to look expired (the
// header's deadline then lands at most a millisecond late; grpc-timeout,
// which a stormguard server also reads, is exact). A d of zero or less
// gives "0" and one above [MaxHeader] gives MaxHeader. [ParseHeader]
// accepts every value it returns.
//
// Values below 10 s (10,000 ms) are sliced from one shared, lazily built
// string of 38,890 bytes and cost no allocation; larger ones allocate the
// string.
func FormatHeader(d time.Duration) string {
	ms := headerMillis(d)
	if ms < smallDecimalsN {
		return smallDecimal(ms)
	}
	return strconv.FormatInt(ms, 10)
}

// AppendHeader appends the [FormatHeader] value for d to dst and returns
// the extended buffer.
func AppendHeader(dst []byte, d time.Duration) []byte {
	return strconv.AppendInt(dst, headerMillis(d), 10)
}

// smallDecimalsN bounds the numbers that smallDecimal serves without
// allocating: milliseconds below 10 s, which covers most per-call deadlines.
const smallDecimalsN = 10_000

// smallDecimals holds "0123456789101112...9999": every number below
// smallDecimalsN in decimal, one after the other. Numbers with the same
// count of digits are consecutive, so a number's position is arithmetic.
var smallDecimals = sync.OnceValue(func() string {
	b := make([]byte, 0, 10*1+90*2+900*3+9000*4)
	for i := range int64(smallDecimalsN) {
		b = strconv.AppendInt(b, i, 10)
	}
	return string(b)
})

// smallDecimal returns the decimal form of n, 0 <= n < smallDecimalsN,
// without allocating.
func smallDecimal(n int64) string {
	s := smallDecimals()
	var off, w int64
	switch {
	case n < 10:
		off, w = n, 1
	case n < 100:
		off, w = 10+(n-10)*2, 2
	case n < 1000:
		off, w = 10+180+(n-100)*3, 3
	default:
		off, w = 10+180+2700+(n-1000)*4, 4
	}
	return s[off : off+w]
}
