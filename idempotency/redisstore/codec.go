package redisstore

import (
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/stormguard/stormguard/idempotency/dedupe"
	redisstorev1 "github.com/stormguard/stormguard/idempotency/redisstore/internal/proto/stormguard/redisstore/v1"
)

// A record is stored as a stormguard.redisstore.v1.Record (the .proto is
// internal/proto/stormguard/redisstore/v1/record.proto; regenerate with
// `go tool -modfile=tools/go.mod buf generate` from the repository root),
// without its fingerprint, which the entry keeps beside it.

var errCorrupt = errors.New("redisstore: corrupt record")

// present is the value of a field whose presence is what counts. The
// encoder points at it and never writes it.
var present = true

// encodeRecord appends the wire form of rec to b. It fails only if the
// protobuf runtime refuses the message, which this schema gives it no
// reason to do (no required fields, no UTF-8 checks).
func encodeRecord(b []byte, rec *dedupe.Record) ([]byte, error) {
	m := &redisstorev1.Record{
		Response:  rec.Response,
		Responses: rec.Responses,
		Code:      uint32(rec.Code),
		Message:   rec.Message,
		Header:    pairs(rec.Header),
		Trailer:   pairs(rec.Trailer),
	}
	if rec.Responses != nil && len(rec.Responses) == 0 {
		m.NoResponses = &present
	}
	if len(rec.Details) > 0 {
		ds := make([]redisstorev1.Detail, len(rec.Details))
		m.Details = make([]*redisstorev1.Detail, len(rec.Details))
		for i, d := range rec.Details {
			ds[i].TypeUrl, ds[i].Value = d.GetTypeUrl(), d.GetValue()
			m.Details[i] = &ds[i]
		}
	}
	return proto.MarshalOptions{}.MarshalAppend(b, m)
}

// pairs returns md as one Pair per key, which shares md's strings.
func pairs(md metadata.MD) []*redisstorev1.Pair {
	if len(md) == 0 {
		return nil
	}
	ps := make([]redisstorev1.Pair, len(md))
	keys := make([]string, len(md))
	out := make([]*redisstorev1.Pair, len(md))
	i := 0
	for k, vs := range md {
		keys[i] = k
		ps[i].Key, ps[i].Values = &keys[i], vs
		out[i] = &ps[i]
		i++
	}
	return out
}

// decodeRecord returns the record b encodes, with fingerprint fp. It
// fails, without panicking, on input that is not a Record: malformed wire
// data, a field the schema does not have (or with another wire type), or
// a metadata pair without a key. The record it returns holds no part of
// b.
func decodeRecord(b []byte, fp dedupe.Fingerprint) (*dedupe.Record, error) {
	var m redisstorev1.Record
	if err := proto.Unmarshal(b, &m); err != nil || unknown(&m) {
		return nil, errCorrupt
	}
	rec := &dedupe.Record{
		Fingerprint: fp,
		Response:    m.Response,
		Code:        codes.Code(m.Code),
		Message:     m.Message,
	}
	switch {
	case len(m.Responses) > 0:
		rec.Responses = m.Responses
	case m.NoResponses != nil:
		rec.Responses = [][]byte{}
	}
	if len(m.Details) > 0 {
		ds := make([]anypb.Any, len(m.Details))
		rec.Details = make([]*anypb.Any, len(m.Details))
		for i, d := range m.Details {
			if unknown(d) {
				return nil, errCorrupt
			}
			ds[i].TypeUrl, ds[i].Value = d.TypeUrl, d.Value
			rec.Details[i] = &ds[i]
		}
	}
	var err error
	if rec.Header, err = metadataOf(m.Header); err != nil {
		return nil, err
	}
	if rec.Trailer, err = metadataOf(m.Trailer); err != nil {
		return nil, err
	}
	return rec, nil
}

// metadataOf returns the metadata ps hold; a key in several pairs gets
// their values in order.
func metadataOf(ps []*redisstorev1.Pair) (metadata.MD, error) {
	if len(ps) == 0 {
		return nil, nil
	}
	md := make(metadata.MD, len(ps))
	for _, p := range ps {
		if p.Key == nil || unknown(p) {
			return nil, errCorrupt
		}
		if vs, ok := md[*p.Key]; ok {
			md[*p.Key] = append(vs, p.Values...)
		} else {
			md[*p.Key] = p.Values
		}
	}
	return md, nil
}

// unknown reports whether m holds fields the schema does not have. The
// store rejects them rather than serve a record it may not understand.
func unknown(m proto.Message) bool {
	return len(m.ProtoReflect().GetUnknown()) > 0
}
