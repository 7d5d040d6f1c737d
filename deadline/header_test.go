package deadline_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/stormguard/stormguard/deadline"
)

func TestParseHeader(t *testing.T) {
	ok := map[string]time.Duration{
		"0":          0,
		"1":          time.Millisecond,
		"250":        250 * time.Millisecond,
		"007":        7 * time.Millisecond,
		"0000000000": 0,
		"2592000000": deadline.MaxHeader, // exactly the clamp
		"2592000001": deadline.MaxHeader, // clamped
		"9999999999": deadline.MaxHeader, // the largest accepted value, clamped
		"4294967296": deadline.MaxHeader,
		"86400000":   24 * time.Hour,
	}
	for v, want := range ok {
		d, good := deadline.ParseHeader(v)
		assert.True(t, good, "%q", v)
		assert.Equal(t, want, d, "%q", v)
	}
	for _, v := range malformed {
		d, good := deadline.ParseHeader(v)
		assert.False(t, good, "%q", v)
		assert.Zero(t, d, "%q", v)
	}
}

// malformed lists header values that must be rejected; it seeds the fuzzer.
var malformed = []string{
	"", " ", "-1", "+1", "-0", " 1", "1 ", "1\t", "\t1", "1\n", "1ms", "1s", "1m", "1S",
	"1.5", "1.", ".5", "1e3", "1E3", "0x10", "0b1", "1_000", "1,000", "1,2", "1 2",
	"12345678901", "00000000001", "99999999999", "18446744073709551616",
	"9223372036854775807", "-9223372036854775808", "NaN", "inf", "Infinity",
	"\x00", "1\x00", "\xff", "٣", "１", "¹", "1٣", "null", "true", "'1'", `"1"`,
}

func TestFormatHeader(t *testing.T) {
	cases := map[time.Duration]string{
		-time.Hour:           "0",
		0:                    "0",
		1:                    "1", // time left is never written as "0" (expired)
		time.Millisecond - 1: "1",
		time.Millisecond:     "1",
		9*time.Millisecond + 999*time.Microsecond: "9",
		10 * time.Millisecond:                     "10",
		99 * time.Millisecond:                     "99",
		100 * time.Millisecond:                    "100",
		999 * time.Millisecond:                    "999",
		time.Second:                               "1000",
		9999 * time.Millisecond:                   "9999",
		10 * time.Second:                          "10000",
		time.Hour:                                 "3600000",
		deadline.MaxHeader:                        "2592000000",
		deadline.MaxHeader + time.Hour:            "2592000000",
		time.Duration(1<<63 - 1):                  "2592000000",
	}
	for d, want := range cases {
		assert.Equal(t, want, deadline.FormatHeader(d), "%v", d)
		assert.Equal(t, "x"+want, string(deadline.AppendHeader([]byte("x"), d)), "%v", d)
	}
	// Every value below the allocation-free table bound, and its edges.
	for ms := range int64(12_000) {
		d := time.Duration(ms)*time.Millisecond + 999*time.Microsecond
		if got, want := deadline.FormatHeader(d), strconv.FormatInt(max(ms, 1), 10); got != want {
			t.Fatalf("FormatHeader(%v) = %q, want %q", d, got, want)
		}
	}
}

func TestHeaderAllocations(t *testing.T) {
	var sink time.Duration
	assert.Zero(t, testing.AllocsPerRun(100, func() {
		d, _ := deadline.ParseHeader("1234567890")
		sink += d
	}))
	_ = deadline.FormatHeader(0) // build the table outside the measurement
	var s string
	assert.Zero(t, testing.AllocsPerRun(100, func() { s = deadline.FormatHeader(4321 * time.Millisecond) }))
	assert.Equal(t, "4321", s)
	buf := make([]byte, 0, 16)
	assert.Zero(t, testing.AllocsPerRun(100, func() { buf = deadline.AppendHeader(buf[:0], time.Hour) }))
}

// FuzzParseDeadlineHeader checks ParseHeader against a reference parser:
// accepted exactly when the value is 1 to 10 ASCII digits, equal to the
// value (clamped at MaxHeader), and round-tripping through FormatHeader.
func FuzzParseDeadlineHeader(f *testing.F) {
	for _, v := range malformed {
		f.Add(v)
	}
	for _, v := range []string{"0", "1", "250", "007", "9999999999", "2592000000", "2592000001"} {
		f.Add(v)
	}
	f.Fuzz(func(t *testing.T, v string) {
		d, ok := deadline.ParseHeader(v)
		digits := len(v) >= 1 && len(v) <= 10
		for i := 0; digits && i < len(v); i++ {
			digits = v[i] >= '0' && v[i] <= '9'
		}
		if ok != digits {
			t.Fatalf("ParseHeader(%q) ok = %v, want %v", v, ok, digits)
		}
		if !ok {
			if d != 0 {
				t.Fatalf("ParseHeader(%q) = %v, false; want 0", v, d)
			}
			return
		}
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("ParseHeader(%q) accepted what strconv rejects: %v", v, err)
		}
		want := min(time.Duration(n)*time.Millisecond, deadline.MaxHeader)
		if d != want {
			t.Fatalf("ParseHeader(%q) = %v, want %v", v, d, want)
		}
		back, ok := deadline.ParseHeader(deadline.FormatHeader(d))
		if !ok || back != d {
			t.Fatalf("round trip of %q: %v -> %q -> %v, %v", v, d, deadline.FormatHeader(d), back, ok)
		}
	})
}
