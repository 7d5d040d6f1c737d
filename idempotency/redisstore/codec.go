package redisstore

import (
	"errors"
	"math"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/stormguard/stormguard/idempotency/dedupe"
)

// A record is stored as a protobuf-wire message (no .proto: the fields
// below), without its fingerprint, which the entry keeps beside it.
const (
	fieldResponse  = 1 // bytes
	fieldResponses = 2 // repeated bytes; an empty list is fieldNoResponses
	fieldCode      = 3 // varint
	fieldMessage   = 4 // string
	fieldDetail    = 5 // repeated Any, wire format
	fieldHeader    = 6 // repeated pair
	fieldTrailer   = 7 // repeated pair
	// fieldNoResponses marks a stream record with an empty, non-nil
	// Responses.
	fieldNoResponses = 8
)

// A metadata pair: key, then each value.
const (
	pairKey   = 1
	pairValue = 2
)

var errCorrupt = errors.New("redisstore: corrupt record")

// encodeRecord appends the wire form of rec to b.
func encodeRecord(b []byte, rec *dedupe.Record) []byte {
	if len(rec.Response) > 0 {
		b = protowire.AppendTag(b, fieldResponse, protowire.BytesType)
		b = protowire.AppendBytes(b, rec.Response)
	}
	if rec.Responses != nil && len(rec.Responses) == 0 {
		b = protowire.AppendTag(b, fieldNoResponses, protowire.VarintType)
		b = protowire.AppendVarint(b, 1)
	}
	for _, r := range rec.Responses {
		b = protowire.AppendTag(b, fieldResponses, protowire.BytesType)
		b = protowire.AppendBytes(b, r)
	}
	if rec.Code != codes.OK {
		b = protowire.AppendTag(b, fieldCode, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(rec.Code))
	}
	if rec.Message != "" {
		b = protowire.AppendTag(b, fieldMessage, protowire.BytesType)
		b = protowire.AppendString(b, rec.Message)
	}
	for _, d := range rec.Details {
		b = protowire.AppendTag(b, fieldDetail, protowire.BytesType)
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
	b = appendMD(b, fieldHeader, rec.Header)
	return appendMD(b, fieldTrailer, rec.Trailer)
}

func appendMD(b []byte, field protowire.Number, md metadata.MD) []byte {
	for k, vs := range md {
		n := protowire.SizeTag(pairKey) + protowire.SizeBytes(len(k))
		for _, v := range vs {
			n += protowire.SizeTag(pairValue) + protowire.SizeBytes(len(v))
		}
		b = protowire.AppendTag(b, field, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(n))
		b = protowire.AppendTag(b, pairKey, protowire.BytesType)
		b = protowire.AppendString(b, k)
		for _, v := range vs {
			b = protowire.AppendTag(b, pairValue, protowire.BytesType)
			b = protowire.AppendString(b, v)
		}
	}
	return b
}

// decodeRecord returns the record b encodes, with fingerprint fp. It
// fails, without panicking, on any input encodeRecord did not produce.
func decodeRecord(b []byte, fp dedupe.Fingerprint) (*dedupe.Record, error) {
	rec := &dedupe.Record{Fingerprint: fp}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, errCorrupt
		}
		b = b[n:]
		switch {
		case num == fieldCode && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 || v > math.MaxUint32 {
				return nil, errCorrupt
			}
			rec.Code = codes.Code(v)
			b = b[n:]
		case num == fieldNoResponses && typ == protowire.VarintType:
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
			if err := setBytes(rec, num, v); err != nil {
				return nil, err
			}
		default:
			return nil, errCorrupt
		}
	}
	return rec, nil
}

// setBytes sets the length-delimited field num of rec to v.
func setBytes(rec *dedupe.Record, num protowire.Number, v []byte) error {
	switch num {
	case fieldResponse:
		rec.Response = v
	case fieldResponses:
		rec.Responses = append(rec.Responses, v)
	case fieldMessage:
		rec.Message = string(v)
	case fieldDetail:
		d, err := decodeAny(v)
		if err != nil {
			return err
		}
		rec.Details = append(rec.Details, d)
	case fieldHeader, fieldTrailer:
		md := &rec.Header
		if num == fieldTrailer {
			md = &rec.Trailer
		}
		if err := decodePair(md, v); err != nil {
			return err
		}
	default:
		return errCorrupt
	}
	return nil
}

func decodeAny(b []byte) (*anypb.Any, error) {
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

func decodePair(md *metadata.MD, b []byte) error {
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
		case num == pairKey && first:
			key = string(v)
		case num == pairValue && !first:
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
