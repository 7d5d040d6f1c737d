package interceptor

import (
	"strconv"
	"testing"
	"time"

	"github.com/stormguard/stormguard/semconv"

	"google.golang.org/grpc/metadata"
)

// FuzzParsePushback: grpc-retry-pushback-ms from a server is untrusted
// input. Whatever it holds, parsePushback does not panic, and a value is
// honoured only when it is one decimal from 0 to MaxPushback; anything else
// stops retries.
func FuzzParsePushback(f *testing.F) {
	for _, s := range []string{"0", "1", "100", "-1", "-0", "+5", " 5", "5 ", "5ms", "1e3", "0x10",
		"2147483647", "2147483648", "99999999999999999999", "", "١٢", "\x00", "-9223372036854775808"} {
		f.Add(s, false)
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, v string, twice bool) {
		md := metadata.MD{semconv.PushbackKey: {v}}
		if twice {
			md[semconv.PushbackKey] = append(md[semconv.PushbackKey], v)
		}
		delay, has, stop := parsePushback(md)
		if has && stop {
			t.Fatalf("%q: both a delay and a stop", v)
		}
		if !has && !stop {
			t.Fatalf("%q: neither a delay nor a stop", v)
		}
		if twice {
			if !stop {
				t.Fatalf("two values must stop retries, got delay %v", delay)
			}
			return
		}
		n, err := strconv.ParseInt(v, 10, 32)
		wantHas := err == nil && n >= 0 && n <= MaxPushback.Milliseconds()
		if has != wantHas {
			t.Fatalf("%q: has = %v, want %v", v, has, wantHas)
		}
		if has && delay != time.Duration(n)*time.Millisecond {
			t.Fatalf("%q: delay %v", v, delay)
		}
		if delay < 0 {
			t.Fatalf("%q: negative delay %v", v, delay)
		}
	})
}
