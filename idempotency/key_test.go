package idempotency_test

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/idempotency"
)

var uuidV4 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

func TestNewKey(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		k := idempotency.NewKey()
		require.Regexp(t, uuidV4, k)
		require.NoError(t, idempotency.ValidateKey(k))
		require.False(t, seen[k], "duplicate key %q", k)
		seen[k] = true
	}
}

func TestValidateKey(t *testing.T) {
	tests := []struct {
		name, key string
		ok        bool
		msg       string // part of the error message
	}{
		{"uuid", "1b4e28ba-2fa1-41d2-883f-0016d3cca427", true, ""},
		{"one byte", "x", true, ""},
		{"all printable", "!\"#$%&'()*+,-./0123456789:;<=>?@AZ[\\]^_`az{|}~", true, ""},
		{"max length", strings.Repeat("k", idempotency.MaxKeyLen), true, ""},
		{"empty", "", false, "empty"},
		{"too long", strings.Repeat("k", idempotency.MaxKeyLen+1), false, "256 bytes long; at most 255"},
		{"space inside", "order 42", false, "byte 0x20 at offset 5"},
		{"leading space", " order", false, "byte 0x20 at offset 0"},
		{"tab", "a\tb", false, "byte 0x9 at offset 1"},
		{"newline", "a\n", false, "byte 0xa at offset 1"},
		{"nul", "\x00", false, "byte 0x0 at offset 0"},
		{"del", "abc\x7f", false, "byte 0x7f at offset 3"},
		{"utf-8", "ключ", false, "byte 0xd0 at offset 0"},
		{"invalid utf-8", "ok\xff", false, "byte 0xff at offset 2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := idempotency.ValidateKey(tt.key)
			if tt.ok {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Equal(t, codes.InvalidArgument, status.Code(err))
			assert.Contains(t, status.Convert(err).Message(), tt.msg)
		})
	}
}

func TestValidateKeyDoesNotAllocate(t *testing.T) {
	k := idempotency.NewKey()
	assert.Zero(t, testing.AllocsPerRun(100, func() { _ = idempotency.ValidateKey(k) }))
}

func TestKeyContext(t *testing.T) {
	ctx := context.Background()
	_, ok := idempotency.KeyFromContext(ctx)
	assert.False(t, ok)

	ctx = idempotency.WithKey(ctx, "order-42")
	k, ok := idempotency.KeyFromContext(ctx)
	assert.True(t, ok)
	assert.Equal(t, "order-42", k)

	// An inner WithKey replaces it; an empty one hides it.
	k, _ = idempotency.KeyFromContext(idempotency.WithKey(ctx, "order-43"))
	assert.Equal(t, "order-43", k)
	_, ok = idempotency.KeyFromContext(idempotency.WithKey(ctx, ""))
	assert.False(t, ok)

	// Not the outgoing metadata: the client interceptor decides when to send it.
	_, has := metadata.FromOutgoingContext(ctx)
	assert.False(t, has)
}

func TestKeyFromCallOptions(t *testing.T) {
	_, ok := idempotency.KeyFromCallOptions(nil)
	assert.False(t, ok)
	opts := []grpc.CallOption{grpc.WaitForReady(true), idempotency.CallKey("a"), grpc.MaxCallRecvMsgSize(1)}
	k, ok := idempotency.KeyFromCallOptions(opts)
	assert.True(t, ok)
	assert.Equal(t, "a", k)
	// The last non-empty one wins; pointers work too; empty ones are ignored.
	b := idempotency.CallKey("b")
	k, _ = idempotency.KeyFromCallOptions(append(opts, &b, idempotency.CallKey(""), (*idempotency.KeyCallOption)(nil)))
	assert.Equal(t, "b", k)
	_, ok = idempotency.KeyFromCallOptions([]grpc.CallOption{idempotency.KeyCallOption{}})
	assert.False(t, ok)
}

func TestKeyFromIncoming(t *testing.T) {
	in := func(md metadata.MD) context.Context { return metadata.NewIncomingContext(context.Background(), md) }
	tests := []struct {
		name    string
		ctx     context.Context
		key     string
		ok      bool
		invalid bool
	}{
		{"no metadata", context.Background(), "", false, false},
		{"other metadata", in(metadata.Pairs("x-other", "1")), "", false, false},
		{"one key", in(metadata.Pairs(idempotency.MetadataKey, "order-42")), "order-42", true, false},
		{"mixed-case name", in(metadata.MD{"Idempotency-Key": {"order-42"}}), "order-42", true, false},
		{"two values", in(metadata.Pairs(idempotency.MetadataKey, "a", idempotency.MetadataKey, "b")), "", true, true},
		{"two equal values", in(metadata.Pairs(idempotency.MetadataKey, "a", idempotency.MetadataKey, "a")), "", true, true},
		{"empty value", in(metadata.Pairs(idempotency.MetadataKey, "")), "", true, true},
		{"space", in(metadata.Pairs(idempotency.MetadataKey, "a b")), "", true, true},
		{"too long", in(metadata.Pairs(idempotency.MetadataKey, strings.Repeat("x", 1<<20))), "", true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key, ok, err := idempotency.KeyFromIncoming(tt.ctx)
			assert.Equal(t, tt.key, key)
			assert.Equal(t, tt.ok, ok)
			if tt.invalid {
				assert.Equal(t, codes.InvalidArgument, status.Code(err))
			} else {
				assert.NoError(t, err)
			}
		})
	}
	noKey := in(metadata.Pairs("x-other", "1"))
	assert.Zero(t, testing.AllocsPerRun(100, func() { _, _, _ = idempotency.KeyFromIncoming(noKey) }))
}

// validKey is ValidateKey's rule written another way, over runes.
func validKey(k string) bool {
	return k != "" && len(k) <= 255 && !strings.ContainsFunc(k, func(r rune) bool { return r <= ' ' || r > '~' })
}

func FuzzKey(f *testing.F) {
	for _, s := range []string{
		"", "x", idempotency.NewKey(), strings.Repeat("k", 255), strings.Repeat("k", 256),
		"a b", " ", "lead", "trail ", "a\x00b", "\t", "\r\n", "\x1f", "\x7f", "ключ", "💳", "ok\xff",
		"!~", "order:42/charge", strings.Repeat("é", 128),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		err := idempotency.ValidateKey(key)
		if want := validKey(key); (err == nil) != want {
			t.Fatalf("ValidateKey(%q) = %v, want valid=%v", key, err, want)
		}
		if err != nil {
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("ValidateKey(%q): code %v, want InvalidArgument", key, status.Code(err))
			}
			if len(key) >= 16 && strings.Contains(status.Convert(err).Message(), key) {
				t.Fatalf("ValidateKey(%q): the message repeats the key", key)
			}
		}
		// The server's view agrees.
		ctx := metadata.NewIncomingContext(context.Background(), metadata.MD{idempotency.MetadataKey: {key}})
		got, ok, ierr := idempotency.KeyFromIncoming(ctx)
		if !ok || (ierr == nil) != (err == nil) || (ierr == nil && got != key) || (ierr != nil && got != "") {
			t.Fatalf("KeyFromIncoming(%q) = %q, %v, %v; ValidateKey: %v", key, got, ok, ierr, err)
		}
	})
}
