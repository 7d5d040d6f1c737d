package redisstore

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"math"
	"reflect"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/stormguard/stormguard/idempotency/dedupe"
)

var codecFP = dedupe.Fingerprint{Method: "/pkg.Svc/M", RequestHash: sha256.Sum256([]byte("r"))}

// codecRecords are records with every part set and unset, and the byte
// strings gRPC allows where the schema says string: a status message, a
// type URL and binary metadata that are not UTF-8, and an empty key.
func codecRecords(t testing.TB) []*dedupe.Record {
	detail, err := anypb.New(wrapperspb.String("why"))
	if err != nil {
		t.Fatal(err)
	}
	return []*dedupe.Record{
		{Fingerprint: codecFP},
		{Fingerprint: codecFP, Response: []byte("resp")},
		{Fingerprint: codecFP, Responses: [][]byte{}},
		{Fingerprint: codecFP, Responses: [][]byte{{}}},
		{Fingerprint: codecFP, Responses: [][]byte{[]byte("a"), {}, []byte("c")}, Code: codes.Aborted},
		{Fingerprint: codecFP, Code: codes.FailedPrecondition, Message: "no", Details: []*anypb.Any{detail, {}}},
		{Fingerprint: codecFP, Code: codes.Code(math.MaxUint32), Message: "\xff\xfe not UTF-8",
			Details: []*anypb.Any{{TypeUrl: "\xc3\x28"}, {Value: []byte{0}}}},
		{Fingerprint: codecFP, Response: []byte{0}, Header: metadata.Pairs("a", "1", "a", "2", "b", ""),
			Trailer: metadata.MD{"t": {"x"}, "bin-bin": {"\x00\xff"}}},
		{Fingerprint: codecFP, Header: metadata.MD{"": {"empty key"}, "no-values": nil}, Trailer: metadata.MD{"": nil}},
	}
}

// mustEncode returns the encoding of rec.
func mustEncode(t testing.TB, rec *dedupe.Record) []byte {
	t.Helper()
	b, err := encodeRecord(nil, rec)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestCodecRoundTrip: every part of a record survives encoding.
func TestCodecRoundTrip(t *testing.T) {
	for i, rec := range codecRecords(t) {
		got, err := decodeRecord(mustEncode(t, rec), codecFP)
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		if !sameRecord(rec, got) {
			t.Errorf("record %d: got %+v, want %+v", i, got, rec)
		}
	}
}

// TestCodecAppends: encodeRecord appends to the buffer it is given.
func TestCodecAppends(t *testing.T) {
	rec := codecRecords(t)[1]
	b, err := encodeRecord([]byte("prefix"), rec)
	if err != nil {
		t.Fatal(err)
	}
	if want := append([]byte("prefix"), mustEncode(t, rec)...); !bytes.Equal(b, want) {
		t.Errorf("got %x, want %x", b, want)
	}
}

// TestCodecReadsFirstEncoding: records written by the first, hand-written
// encoder (firstEncode, kept below as it was), as Redis may still hold
// them, decode to the same records.
func TestCodecReadsFirstEncoding(t *testing.T) {
	for i, rec := range codecRecords(t) {
		got, err := decodeRecord(firstEncode(nil, rec), codecFP)
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		if !sameRecord(rec, got) {
			t.Errorf("record %d: got %+v, want %+v", i, got, rec)
		}
	}
}

// TestCodecReadByFirstDecoder: a replica still running the first decoder
// (during a rolling upgrade, or after a rollback) reads what this encoder
// writes, and the encoding has the first encoding's length, so that the
// store counts a record's bytes as it did.
func TestCodecReadByFirstDecoder(t *testing.T) {
	for i, rec := range codecRecords(t) {
		data := mustEncode(t, rec)
		got, err := firstDecode(data, codecFP)
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		if !sameRecord(rec, got) {
			t.Errorf("record %d: got %+v, want %+v", i, got, rec)
		}
		if n := len(firstEncode(nil, rec)); len(data) != n {
			t.Errorf("record %d: %d bytes, the first encoding %d", i, len(data), n)
		}
	}
}

// codecGolden are encodings the first encoder wrote (at the commit that
// introduced the .proto), with the records they hold. Their fields are in
// the order both encoders write them, so that the encoder must reproduce
// them byte for byte.
var codecGolden = []struct {
	hex string
	rec dedupe.Record
}{
	{"", dedupe.Record{}},
	{"4001", dedupe.Record{Responses: [][]byte{}}},
	{"120161120012016318022202ff00", dedupe.Record{Responses: [][]byte{[]byte("a"), {}, []byte("c")}, Code: 2, Message: "\xff\x00"}},
	{"0a0472657370180a22026e6f2a060a01741201762a0032090a01611201311201323a0b0a05742d62696e120200ff", dedupe.Record{
		Response: []byte("resp"), Code: codes.Aborted, Message: "no", Details: []*anypb.Any{{TypeUrl: "t", Value: []byte("v")}, {}},
		Header: metadata.MD{"a": {"1", "2"}}, Trailer: metadata.MD{"t-bin": {"\x00\xff"}}}},
}

// TestCodecGolden: the bytes of the first encoding decode to their
// records, and the encoder writes the same bytes.
func TestCodecGolden(t *testing.T) {
	for i, g := range codecGolden {
		data, err := hex.DecodeString(g.hex)
		if err != nil {
			t.Fatal(err)
		}
		g.rec.Fingerprint = codecFP
		got, err := decodeRecord(data, codecFP)
		if err != nil {
			t.Fatalf("golden %d: %v", i, err)
		}
		if !sameRecord(&g.rec, got) {
			t.Errorf("golden %d: got %+v, want %+v", i, got, &g.rec)
		}
		if b := mustEncode(t, &g.rec); !bytes.Equal(b, data) {
			t.Errorf("golden %d: encoded %x, want %s", i, b, g.hex)
		}
	}
}

// TestCodecRejects: input that is not a record is an error, as it was
// for the first decoder.
func TestCodecRejects(t *testing.T) {
	for _, c := range []struct{ name, hex string }{
		{"truncated tag", "ff"},
		{"truncated length", "0a"},
		{"length past the end", "0a0561"},
		{"unknown field", "4a0161"},
		{"unknown varint field", "5001"},
		{"response as a varint", "0801"},
		{"code as bytes", "1a0101"},
		{"group", "0b0c"},
		{"detail with an unknown field", "2a021800"},
		{"detail value as a varint", "2a021001"},
		{"pair without a key", "3203120178"},
		{"empty pair", "3200"},
		{"pair with an unknown field", "32040a0118" + "00"},
		{"trailer pair without a key", "3a03120178"},
	} {
		data, err := hex.DecodeString(c.hex)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := firstDecode(data, codecFP); err == nil {
			t.Fatalf("%s: the first decoder accepts %s: not a case of corrupt input", c.name, c.hex)
		}
		if rec, err := decodeRecord(data, codecFP); !errors.Is(err, errCorrupt) {
			t.Errorf("%s: decodeRecord(%s) = %+v, %v, want errCorrupt", c.name, c.hex, rec, err)
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
		if a.Details[i].GetTypeUrl() != b.Details[i].GetTypeUrl() ||
			string(a.Details[i].GetValue()) != string(b.Details[i].GetValue()) {
			return false
		}
	}
	return true
}

// norm maps an empty MD to nil, and a key's empty list of values to nil.
func norm(md metadata.MD) metadata.MD {
	if len(md) == 0 {
		return nil
	}
	out := make(metadata.MD, len(md))
	for k, vs := range md {
		if len(vs) > 0 {
			out[k] = vs
		} else {
			out[k] = nil
		}
	}
	return out
}

// FuzzDecodeRecord: any bytes decode to a record or an error, never a
// panic. What the first decoder read, the decoder reads the same. What
// decodes re-encodes to something that decodes the same, with this
// decoder and with the first.
func FuzzDecodeRecord(f *testing.F) {
	for _, rec := range codecRecords(f) {
		f.Add(mustEncode(f, rec))
		f.Add(firstEncode(nil, rec))
	}
	for _, g := range codecGolden {
		b, _ := hex.DecodeString(g.hex)
		f.Add(b)
	}
	f.Add([]byte{0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		rec, err := decodeRecord(b, codecFP)
		if first, ferr := firstDecode(b, codecFP); ferr == nil {
			if err != nil {
				t.Fatalf("the first decoder reads %x, this one fails: %v", b, err)
			}
			if !sameRecord(first, rec) {
				t.Fatalf("%x: the first decoder reads %+v, this one %+v", b, first, rec)
			}
		}
		if err != nil {
			return
		}
		data := mustEncode(t, rec)
		again, err := decodeRecord(data, codecFP)
		if err != nil {
			t.Fatalf("re-encoded record does not decode: %v", err)
		}
		if !sameRecord(rec, again) {
			t.Fatalf("round trip changed %+v into %+v", rec, again)
		}
		first, err := firstDecode(data, codecFP)
		if err != nil {
			t.Fatalf("the first decoder cannot read re-encoded %+v: %v", rec, err)
		}
		if !sameRecord(rec, first) {
			t.Fatalf("the first decoder reads re-encoded %+v as %+v", rec, first)
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
		data := mustEncode(b, rec)
		b.Run("encode/"+name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				if _, err := encodeRecord(nil, rec); err != nil {
					b.Fatal(err)
				}
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

// The first encoding of a record, hand-written with protowire, kept as it
// was (only renamed) so that the tests can show the generated codec reads
// what it wrote and writes what it reads: a protobuf-wire message (no
// .proto: the fields below), without its fingerprint, which the entry
// keeps beside it.
const (
	firstResponse  = 1 // bytes
	firstResponses = 2 // repeated bytes; an empty list is firstNoResponses
	firstCode      = 3 // varint
	firstMessage   = 4 // string
	firstDetail    = 5 // repeated Any, wire format
	firstHeader    = 6 // repeated pair
	firstTrailer   = 7 // repeated pair
	// firstNoResponses marks a stream record with an empty, non-nil
	// Responses.
	firstNoResponses = 8
)

// A metadata pair: key, then each value.
const (
	firstPairKey   = 1
	firstPairValue = 2
)

// firstEncode appends the wire form of rec to b.
func firstEncode(b []byte, rec *dedupe.Record) []byte {
	if len(rec.Response) > 0 {
		b = protowire.AppendTag(b, firstResponse, protowire.BytesType)
		b = protowire.AppendBytes(b, rec.Response)
	}
	if rec.Responses != nil && len(rec.Responses) == 0 {
		b = protowire.AppendTag(b, firstNoResponses, protowire.VarintType)
		b = protowire.AppendVarint(b, 1)
	}
	for _, r := range rec.Responses {
		b = protowire.AppendTag(b, firstResponses, protowire.BytesType)
		b = protowire.AppendBytes(b, r)
	}
	if rec.Code != codes.OK {
		b = protowire.AppendTag(b, firstCode, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(rec.Code))
	}
	if rec.Message != "" {
		b = protowire.AppendTag(b, firstMessage, protowire.BytesType)
		b = protowire.AppendString(b, rec.Message)
	}
	for _, d := range rec.Details {
		b = protowire.AppendTag(b, firstDetail, protowire.BytesType)
		// An Any is two fields: type_url (1) and value (2).
		var n int
		if d.GetTypeUrl() != "" {
			n += protowire.SizeTag(1) + protowire.SizeBytes(len(d.GetTypeUrl()))
		}
		if len(d.GetValue()) > 0 {
			n += protowire.SizeTag(2) + protowire.SizeBytes(len(d.GetValue()))
		}
		b = protowire.AppendVarint(b, uint64(n))
		if d.GetTypeUrl() != "" {
			b = protowire.AppendTag(b, 1, protowire.BytesType)
			b = protowire.AppendString(b, d.GetTypeUrl())
		}
		if len(d.GetValue()) > 0 {
			b = protowire.AppendTag(b, 2, protowire.BytesType)
			b = protowire.AppendBytes(b, d.GetValue())
		}
	}
	b = firstAppendMD(b, firstHeader, rec.Header)
	return firstAppendMD(b, firstTrailer, rec.Trailer)
}

func firstAppendMD(b []byte, field protowire.Number, md metadata.MD) []byte {
	for k, vs := range md {
		n := protowire.SizeTag(firstPairKey) + protowire.SizeBytes(len(k))
		for _, v := range vs {
			n += protowire.SizeTag(firstPairValue) + protowire.SizeBytes(len(v))
		}
		b = protowire.AppendTag(b, field, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(n))
		b = protowire.AppendTag(b, firstPairKey, protowire.BytesType)
		b = protowire.AppendString(b, k)
		for _, v := range vs {
			b = protowire.AppendTag(b, firstPairValue, protowire.BytesType)
			b = protowire.AppendString(b, v)
		}
	}
	return b
}

// firstDecode returns the record b encodes, with fingerprint fp. It
// fails, without panicking, on any input firstEncode did not produce.
func firstDecode(b []byte, fp dedupe.Fingerprint) (*dedupe.Record, error) {
	rec := &dedupe.Record{Fingerprint: fp}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, errCorrupt
		}
		b = b[n:]
		switch {
		case num == firstCode && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 || v > math.MaxUint32 {
				return nil, errCorrupt
			}
			rec.Code = codes.Code(v)
			b = b[n:]
		case num == firstNoResponses && typ == protowire.VarintType:
			_, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return nil, errCorrupt
			}
			if rec.Responses == nil {
				rec.Responses = [][]byte{}
			}
			b = b[n:]
		case typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return nil, errCorrupt
			}
			b = b[n:]
			if err := firstSetBytes(rec, num, v); err != nil {
				return nil, err
			}
		default:
			return nil, errCorrupt
		}
	}
	return rec, nil
}

// firstSetBytes sets the length-delimited field num of rec to v.
func firstSetBytes(rec *dedupe.Record, num protowire.Number, v []byte) error {
	switch num {
	case firstResponse:
		rec.Response = v
	case firstResponses:
		rec.Responses = append(rec.Responses, v)
	case firstMessage:
		rec.Message = string(v)
	case firstDetail:
		d, err := firstDecodeAny(v)
		if err != nil {
			return err
		}
		rec.Details = append(rec.Details, d)
	case firstHeader, firstTrailer:
		md := &rec.Header
		if num == firstTrailer {
			md = &rec.Trailer
		}
		if err := firstDecodePair(md, v); err != nil {
			return err
		}
	default:
		return errCorrupt
	}
	return nil
}

func firstDecodeAny(b []byte) (*anypb.Any, error) {
	d := &anypb.Any{}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || typ != protowire.BytesType {
			return nil, errCorrupt
		}
		b = b[n:]
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return nil, errCorrupt
		}
		b = b[n:]
		switch num {
		case 1:
			d.TypeUrl = string(v)
		case 2:
			d.Value = v
		default:
			return nil, errCorrupt
		}
	}
	return d, nil
}

func firstDecodePair(md *metadata.MD, b []byte) error {
	var key string
	var vals []string
	first := true
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || typ != protowire.BytesType {
			return errCorrupt
		}
		b = b[n:]
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return errCorrupt
		}
		b = b[n:]
		switch {
		case num == firstPairKey && first:
			key = string(v)
		case num == firstPairValue && !first:
			vals = append(vals, string(v))
		default:
			return errCorrupt
		}
		first = false
	}
	if first {
		return errCorrupt
	}
	if *md == nil {
		*md = metadata.MD{}
	}
	(*md)[key] = append((*md)[key], vals...)
	return nil
}
