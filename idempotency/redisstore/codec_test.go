package redisstore

import (
	"crypto/sha256"
	"reflect"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/stormguard/stormguard/idempotency/dedupe"
)

var codecFP = dedupe.Fingerprint{Method: "/pkg.Svc/M", RequestHash: sha256.Sum256([]byte("r"))}

func codecRecords(t testing.TB) []*dedupe.Record {
	detail, err := anypb.New(wrapperspb.String("why"))
	if err != nil {
		t.Fatal(err)
	}
	return []*dedupe.Record{
		{Fingerprint: codecFP},
		{Fingerprint: codecFP, Response: []byte("resp")},
		{Fingerprint: codecFP, Responses: [][]byte{}},
		{Fingerprint: codecFP, Responses: [][]byte{[]byte("a"), {}, []byte("c")}, Code: codes.Aborted},
		{Fingerprint: codecFP, Code: codes.FailedPrecondition, Message: "no", Details: []*anypb.Any{detail, {}}},
		{Fingerprint: codecFP, Response: []byte{0}, Header: metadata.Pairs("a", "1", "a", "2", "b", ""),
			Trailer: metadata.MD{"t": {"x"}, "bin-bin": {"\x00\xff"}}},
	}
}

// TestCodecRoundTrip: every part of a record survives encoding.
func TestCodecRoundTrip(t *testing.T) {
	for i, rec := range codecRecords(t) {
		got, err := decodeRecord(encodeRecord(nil, rec), codecFP)
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		if !sameRecord(rec, got) {
			t.Errorf("record %d: got %+v, want %+v", i, got, rec)
		}
	}
}

func sameRecord(a, b *dedupe.Record) bool {
	if a.Fingerprint != b.Fingerprint || string(a.Response) != string(b.Response) || a.Code != b.Code ||
		a.Message != b.Message || len(a.Details) != len(b.Details) || (a.Responses == nil) != (b.Responses == nil) ||
		len(a.Responses) != len(b.Responses) || !reflect.DeepEqual(norm(a.Header), norm(b.Header)) ||
		!reflect.DeepEqual(norm(a.Trailer), norm(b.Trailer)) {
		return false
	}
	for i := range a.Responses {
		if string(a.Responses[i]) != string(b.Responses[i]) {
			return false
		}
	}
	for i := range a.Details {
		if !proto.Equal(a.Details[i], b.Details[i]) {
			return false
		}
	}
	return true
}

// norm maps an empty MD to nil.
func norm(md metadata.MD) metadata.MD {
	if len(md) == 0 {
		return nil
	}
	return md
}

// FuzzDecodeRecord: any bytes decode to a record or an error, never a
// panic; what decodes re-encodes to something that decodes the same.
func FuzzDecodeRecord(f *testing.F) {
	for _, rec := range codecRecords(f) {
		f.Add(encodeRecord(nil, rec))
	}
	f.Add([]byte{0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		rec, err := decodeRecord(b, codecFP)
		if err != nil {
			return
		}
		again, err := decodeRecord(encodeRecord(nil, rec), codecFP)
		if err != nil {
			t.Fatalf("re-encoded record does not decode: %v", err)
		}
		if !sameRecord(rec, again) {
			t.Fatalf("round trip changed %+v into %+v", rec, again)
		}
	})
}

// benchRecords are records as a server stores them: a unary response with
// a header and a trailer, an error status with a detail, and a stream.
func benchRecords(b *testing.B) map[string]*dedupe.Record {
	detail, err := anypb.New(wrapperspb.String("retry later"))
	if err != nil {
		b.Fatal(err)
	}
	resp := make([]byte, 256)
	stream := make([][]byte, 16)
	for i := range stream {
		stream[i] = resp[:64]
	}
	return map[string]*dedupe.Record{
		"unary": {Fingerprint: codecFP, Response: resp,
			Header: metadata.Pairs("x-request-id", "0123456789abcdef"), Trailer: metadata.Pairs("x-served-by", "replica-3")},
		"status": {Fingerprint: codecFP, Code: codes.FailedPrecondition, Message: "balance too low",
			Details: []*anypb.Any{detail}},
		"stream": {Fingerprint: codecFP, Responses: stream},
	}
}

// BenchmarkCodec measures encoding a record (as Complete does, into a new
// buffer) and decoding it (as a replay does).
func BenchmarkCodec(b *testing.B) {
	for _, name := range []string{"unary", "status", "stream"} {
		rec := benchRecords(b)[name]
		data := encodeRecord(nil, rec)
		b.Run("encode/"+name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				encodeRecord(nil, rec)
			}
		})
		b.Run("decode/"+name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				if _, err := decodeRecord(data, codecFP); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
