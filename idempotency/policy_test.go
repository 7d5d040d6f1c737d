package idempotency_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/internal/limits"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

func TestLookupDemoMethods(t *testing.T) {
	tests := []struct {
		method string
		want   idempotency.Policy
	}{
		{echov1.EchoService_Get_FullMethodName, idempotency.Policy{Level: idempotency.NoSideEffects, Known: true, Hedging: true}},
		{echov1.EchoService_Put_FullMethodName, idempotency.Policy{Level: idempotency.Idempotent, Known: true}},
		{echov1.EchoService_Charge_FullMethodName, idempotency.Policy{Level: idempotency.RetryWithKey, Known: true}},
		{echov1.EchoService_Notify_FullMethodName, idempotency.Policy{Level: idempotency.Unmarked, Known: true}},
		{echov1.EchoService_Transfer_FullMethodName, idempotency.Policy{Level: idempotency.Unmarked, Known: true, SendOnce: true}},
		{echov1.EchoService_List_FullMethodName, idempotency.Policy{Level: idempotency.NoSideEffects, Known: true, ServerStreaming: true}},
		{echov1.EchoService_Upload_FullMethodName, idempotency.Policy{Level: idempotency.Idempotent, Known: true, ClientStreaming: true}},
		{echov1.EchoService_Chat_FullMethodName, idempotency.Policy{Level: idempotency.Idempotent, Known: true, ClientStreaming: true, ServerStreaming: true}},
	}
	for _, tt := range tests {
		t.Run(tt.method, func(t *testing.T) {
			got := idempotency.Lookup(tt.method)
			assert.Equal(t, tt.want, got)
			// The cached answer is the same.
			assert.Equal(t, tt.want, idempotency.Lookup(tt.method))
		})
	}
}

func TestLookupMalformedAndUnknown(t *testing.T) {
	for _, name := range []string{
		"", "x", "/", "//", "/a/b/c", "echo.v1.EchoService/Get", "/echo.v1.EchoService/",
		"/echo.v1.EchoService", "/echo.v1.EchoService/Nope", "/no.such.Service/Get",
		"/echo.v1.GetRequest/Get", // a message, not a service
		"/echo.v1.EchoService/Get/", "\x00/\xff", "/ /Get",
	} {
		p := idempotency.Lookup(name)
		assert.Equal(t, idempotency.Policy{}, p, "Lookup(%q)", name)
		assert.False(t, p.Repeatable(true), "Lookup(%q) repeatable", name)
	}
}

func TestResolverOverrides(t *testing.T) {
	r := idempotency.NewResolver(idempotency.ResolverConfig{Idempotent: []string{
		echov1.EchoService_Notify_FullMethodName, // exact, with slash
		"other.v1.Svc/Do",                        // exact, without slash
		"/legacy.v1.Orders/",                     // whole service
		"billing.v1.Ledger",                      // whole service, bare
		"", "   ",
	}})
	tests := []struct {
		method string
		want   idempotency.Level
	}{
		{echov1.EchoService_Notify_FullMethodName, idempotency.Idempotent},
		{echov1.EchoService_Get_FullMethodName, idempotency.NoSideEffects}, // never lowered
		{echov1.EchoService_Charge_FullMethodName, idempotency.RetryWithKey},
		{"/other.v1.Svc/Do", idempotency.Idempotent},
		{"/other.v1.Svc/Other", idempotency.Unmarked},
		{"/legacy.v1.Orders/Create", idempotency.Idempotent},
		{"/legacy.v1.Orders/Cancel", idempotency.Idempotent},
		{"/billing.v1.Ledger/Append", idempotency.Idempotent},
		{"/billing.v1.LedgerX/Append", idempotency.Unmarked},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, r.Lookup(tt.method).Level, tt.method)
		assert.Equal(t, tt.want, r.Lookup(tt.method).Level, "cached "+tt.method)
	}
	// A send_once method is never raised, by a method or a whole-service
	// entry.
	once := idempotency.NewResolver(idempotency.ResolverConfig{Idempotent: []string{
		echov1.EchoService_Transfer_FullMethodName, "/echo.v1.EchoService/"}})
	p := once.Lookup(echov1.EchoService_Transfer_FullMethodName)
	assert.True(t, p.SendOnce)
	assert.Equal(t, idempotency.Unmarked, p.Level)
	assert.False(t, p.Repeatable(true))
	assert.Equal(t, idempotency.Idempotent, once.Lookup(echov1.EchoService_Notify_FullMethodName).Level)
	// The override is per resolver: the package default is untouched.
	assert.Equal(t, idempotency.Unmarked, idempotency.Lookup(echov1.EchoService_Notify_FullMethodName).Level)
}

func TestRepeatable(t *testing.T) {
	tests := []struct {
		level          idempotency.Level
		noKey, withKey bool
	}{
		{idempotency.Unmarked, false, false},
		{idempotency.RetryWithKey, false, true},
		{idempotency.Idempotent, true, true},
		{idempotency.NoSideEffects, true, true},
	}
	for _, tt := range tests {
		p := idempotency.Policy{Level: tt.level}
		assert.Equal(t, tt.noKey, p.Repeatable(false), tt.level.String())
		assert.Equal(t, tt.withKey, p.Repeatable(true), tt.level.String())
	}
	assert.Equal(t, "Level(9)", idempotency.Level(9).String())
}

func TestParseCodes(t *testing.T) {
	s := idempotency.ParseCodes("UNAVAILABLE", "resource_exhausted", " 4 ", "OK", "0", "17", "BOGUS", "")
	assert.True(t, s.Has(codes.Unavailable))
	assert.True(t, s.Has(codes.ResourceExhausted))
	assert.True(t, s.Has(codes.DeadlineExceeded))
	assert.False(t, s.Has(codes.OK))
	assert.False(t, s.Has(codes.Internal))
	assert.False(t, s.Has(codes.Code(40)))
	assert.Equal(t, idempotency.Codes(codes.Unavailable, codes.ResourceExhausted, codes.DeadlineExceeded), s)
	assert.Equal(t, idempotency.CodeSet(0), idempotency.Codes(codes.OK, codes.Code(99)))
}

func TestPolicyFieldsFromOptions(t *testing.T) {
	// The demo service leaves most fields unset; a dynamic file exercises
	// every field of MethodPolicy.
	files := policyTestFiles(t)
	r := idempotency.NewResolver(idempotency.ResolverConfig{Files: files})
	p := r.Lookup("/test.v1.TunedService/Tuned")
	require.True(t, p.Known)
	assert.Equal(t, idempotency.Policy{
		Level: idempotency.Idempotent, Known: true, MaxAttempts: 4, Hedging: true,
		HedgingDelay: 20 * time.Millisecond, MaxHedges: 2,
		RetryableCodes:    idempotency.Codes(codes.Unavailable, codes.ResourceExhausted),
		PerAttemptTimeout: 250 * time.Millisecond,
	}, p)
	capped := r.Lookup("/test.v1.TunedService/Capped")
	assert.Equal(t, limits.MaxAttempts, capped.MaxAttempts)
	assert.Equal(t, idempotency.RetryWithKey, capped.Level)
	assert.False(t, capped.Hedging)
}

func BenchmarkLookup(b *testing.B) {
	m := echov1.EchoService_Get_FullMethodName
	idempotency.Lookup(m)
	b.ReportAllocs()
	for b.Loop() {
		if idempotency.Lookup(m).Level != idempotency.NoSideEffects {
			b.Fatal("wrong policy")
		}
	}
}
