package interceptor

import (
	"strconv"
	"testing"
	"time"

	"github.com/stormguard/stormguard/semconv"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
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

// FuzzParseRetryInfo: a status's details come from the server, untrusted.
// Whatever bytes its RetryInfo holds, parseRetryInfo does not panic, never
// both delays and stops, and a delay it honours is within [0, MaxPushback].
func FuzzParseRetryInfo(f *testing.F) {
	for _, d := range []*durationpb.Duration{
		durationpb.New(0), durationpb.New(time.Millisecond), durationpb.New(MaxPushback), durationpb.New(MaxPushback + 1),
		durationpb.New(-time.Second), {Seconds: 1, Nanos: -1}, {Seconds: 1 << 62}, {Nanos: 2e9},
	} {
		b, err := proto.Marshal(&errdetails.RetryInfo{RetryDelay: d})
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, false)
		f.Add(b, true)
	}
	f.Add([]byte{0x0a, 0xff}, false) // truncated
	f.Fuzz(func(t *testing.T, b []byte, twice bool) {
		detail := &anypb.Any{TypeUrl: retryInfoTypeURL, Value: b}
		details := []*anypb.Any{detail}
		if twice {
			details = append(details, detail)
		}
		err := status.FromProto(&spb.Status{Code: int32(codes.Unavailable), Details: details}).Err()
		delay, has, stop := parseRetryInfo(err)
		if has && stop {
			t.Fatalf("both a delay (%v) and a stop", delay)
		}
		if has && (delay < 0 || delay > MaxPushback) {
			t.Fatalf("delay %v out of [0, MaxPushback]", delay)
		}
		var ri errdetails.RetryInfo
		valid := proto.Unmarshal(b, &ri) == nil && ri.GetRetryDelay() != nil && ri.GetRetryDelay().CheckValid() == nil && ri.GetRetryDelay().AsDuration() >= 0
		if valid && ri.GetRetryDelay().AsDuration() <= MaxPushback && (!has || delay != ri.GetRetryDelay().AsDuration()) {
			t.Fatalf("a valid delay %v was not honoured: %v %v %v", ri.GetRetryDelay().AsDuration(), delay, has, stop)
		}
		if !valid && (has || stop) {
			t.Fatalf("an invalid RetryInfo was not ignored: %v %v %v", delay, has, stop)
		}
	})
}
