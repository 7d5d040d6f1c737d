package idempotency

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strconv"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// MetadataKey is the request metadata key that carries an idempotency key.
//
// The client interceptor sends the same value on every attempt (first
// attempt, retries and hedges) of one logical call, and never a new value
// per attempt: that is what lets a server recognise a repeated write.
const MetadataKey = "idempotency-key"

// MaxKeyLen is the longest idempotency key accepted, in bytes.
const MaxKeyLen = 255

// Key charset: printable ASCII without the space, 0x21 ('!') to 0x7E ('~').
// Spaces are refused because HTTP/2 intermediaries and metadata libraries
// may trim or fold whitespace in header values, so a key with a space might
// not arrive as it was sent; a key is an opaque token and has no need of
// one. Control characters, DEL and anything outside ASCII (including UTF-8)
// are refused too: gRPC only carries printable ASCII in non-binary
// metadata.
const (
	minKeyByte = 0x21
	maxKeyByte = 0x7e
)

// NewKey returns a fresh idempotency key: a random (version 4) UUID in its
// canonical text form, such as "1b4e28ba-2fa1-41d2-883f-0016d3cca427". The
// randomness comes from crypto/rand: 128 random bits of which, as RFC 9562
// requires of version 4, 6 are overwritten by the version and variant, so a
// key has 122 random bits.
//
// NewKey is safe for concurrent use. It is meant to be called once per
// logical call, not once per attempt.
func NewKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:])  // never fails: crypto/rand crashes the program instead
	b[6] = b[6]&0x0f | 0x40 // version 4
	b[8] = b[8]&0x3f | 0x80 // variant 10 (RFC 9562)
	var s [36]byte
	hex.Encode(s[0:8], b[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], b[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], b[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], b[8:10])
	s[23] = '-'
	hex.Encode(s[24:36], b[10:16])
	return string(s[:])
}

// ValidateKey reports whether key is an acceptable idempotency key: 1 to
// MaxKeyLen bytes, each printable ASCII other than the space (0x21 '!'
// through 0x7E '~'). It returns nil, or a gRPC status error with
// codes.InvalidArgument that says what is wrong. The message never repeats
// the key itself.
//
// ValidateKey does not allocate for a valid key and is safe for concurrent
// use.
func ValidateKey(key string) error {
	if key == "" {
		return status.Error(codes.InvalidArgument, "idempotency: empty "+MetadataKey)
	}
	if len(key) > MaxKeyLen {
		return status.Error(codes.InvalidArgument, "idempotency: "+MetadataKey+" is "+
			strconv.Itoa(len(key))+" bytes long; at most "+strconv.Itoa(MaxKeyLen)+" are allowed")
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < minKeyByte || c > maxKeyByte {
			return status.Error(codes.InvalidArgument, "idempotency: "+MetadataKey+" has byte 0x"+
				strconv.FormatUint(uint64(c), 16)+" at offset "+strconv.Itoa(i)+
				"; only printable ASCII without spaces (0x21-0x7e) is allowed")
		}
	}
	return nil
}

// ctxKey is the context key of the caller's own idempotency key.
type ctxKey struct{}

// WithKey returns a copy of ctx that asks the client interceptor to use key
// as the idempotency key of the calls made with it, instead of generating
// one. The client interceptor sends it on every attempt of such a call and,
// when the caller asks for a key this way, also on methods that are not
// marked retry_with_key (which are still attempted only once unless their
// policy allows more).
//
// WithKey does not validate key: the client interceptor does, and fails the
// call with codes.InvalidArgument, nothing sent, when [ValidateKey] refuses
// it. An empty key means "no key of my own": it hides a key set by an
// enclosing WithKey.
func WithKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, ctxKey{}, key)
}

// KeyFromContext returns the key set by [WithKey], if any. An empty key is
// reported as absent.
func KeyFromContext(ctx context.Context) (string, bool) {
	k, _ := ctx.Value(ctxKey{}).(string)
	return k, k != ""
}

// KeyCallOption is a grpc.CallOption that carries the caller's own
// idempotency key for one call, like [WithKey] but per call. Create one
// with [CallKey]; it does nothing by itself: the client interceptor looks
// for it with [KeyFromCallOptions] and gives it precedence over a key from
// WithKey. The zero KeyCallOption (empty Key) means "no key of my own".
type KeyCallOption struct {
	grpc.EmptyCallOption
	// Key is the idempotency key; it is validated by the client
	// interceptor, as with WithKey.
	Key string
}

// CallKey returns a call option that makes key the idempotency key of
// that call (all its attempts).
func CallKey(key string) KeyCallOption { return KeyCallOption{Key: key} }

// KeyFromCallOptions returns the key of the last non-empty [KeyCallOption]
// in opts, if any.
func KeyFromCallOptions(opts []grpc.CallOption) (string, bool) {
	for i := len(opts) - 1; i >= 0; i-- {
		switch o := opts[i].(type) {
		case KeyCallOption:
			if o.Key != "" {
				return o.Key, true
			}
		case *KeyCallOption:
			if o != nil && o.Key != "" {
				return o.Key, true
			}
		}
	}
	return "", false
}

// KeyFromIncoming returns the idempotency key of an incoming request, for
// servers. ok is false when the request carries no idempotency-key
// metadata; then err is nil. When it carries some, ok is true and err is
// nil only if there is exactly one value and [ValidateKey] accepts it;
// otherwise err is a gRPC status error with codes.InvalidArgument (several
// values are refused, even if they are equal: one logical call has one
// key) and key is "".
//
// A request without the key costs one metadata lookup and no allocation.
func KeyFromIncoming(ctx context.Context) (key string, ok bool, err error) {
	vals := metadata.ValueFromIncomingContext(ctx, MetadataKey)
	switch len(vals) {
	case 0:
		return "", false, nil
	case 1:
	default:
		return "", true, status.Error(codes.InvalidArgument, "idempotency: "+strconv.Itoa(len(vals))+
			" "+MetadataKey+" values; a request may carry only one")
	}
	if err := ValidateKey(vals[0]); err != nil {
		return "", true, err
	}
	return vals[0], true, nil
}
