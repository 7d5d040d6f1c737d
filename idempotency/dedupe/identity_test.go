package dedupe_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/stormguard/stormguard/idempotency/dedupe"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// testPKI is a certificate authority, a server certificate and client
// certificates, made in memory for one test.
type testPKI struct {
	t      testing.TB
	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	pool   *x509.CertPool
	serial int64
}

const tlsServerName = "origin.stormguard.test"

func newTestPKI(t testing.TB) *testPKI {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "stormguard test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	ca, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return &testPKI{t: t, ca: ca, caKey: key, pool: pool, serial: 1}
}

// issue returns a certificate for cn signed by the CA, for a server (with
// tlsServerName as its DNS name) or a client.
func (p *testPKI) issue(cn string, server bool) tls.Certificate {
	p.t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(p.t, err)
	p.serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(p.serial),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.DNSNames = []string{tlsServerName}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	require.NoError(p.t, err)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// serverCreds requires and verifies client certificates.
func (p *testPKI) serverCreds() credentials.TransportCredentials {
	return credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{p.issue("server", true)},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    p.pool,
		MinVersion:   tls.VersionTLS13,
	})
}

// clientCreds presents a client certificate for cn.
func (p *testPKI) clientCreds(cn string) credentials.TransportCredentials {
	return credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{p.issue(cn, false)},
		RootCAs:      p.pool,
		ServerName:   tlsServerName,
		MinVersion:   tls.VersionTLS13,
	})
}

// assertOwnExecutions checks the cross-caller scenario: A charges with a
// key; B sends A's key and A's request; B must get an execution of its
// own, never A's response or A's session header; each then replays its
// own.
func assertOwnExecutions(t *testing.T, o *origin.Origin, a, b echov1.EchoServiceClient, ctxA, ctxB context.Context) {
	t.Helper()
	req := &echov1.ChargeRequest{RequestId: "order-1001", Account: "shared-merchant", AmountCents: 2500}
	ka := metadata.AppendToOutgoingContext(ctxA, "idempotency-key", "order-1001")
	kb := metadata.AppendToOutgoingContext(ctxB, "idempotency-key", "order-1001")

	first := charge(ka, a, req)
	require.NoError(t, first.err)
	require.Len(t, first.session, 1)

	stolen := charge(kb, b, req)
	require.NoError(t, stolen.err)
	assert.NotEqual(t, first.resp.GetChargeId(), stolen.resp.GetChargeId(), "B got A's stored response")
	assert.NotEqual(t, first.session, stolen.session, "B got A's response header")
	assert.Equal(t, 2, o.CountID(echov1.EchoService_Charge_FullMethodName, "order-1001"), "B's own call ran")

	// Each caller's retry replays its own outcome.
	againA, againB := charge(ka, a, req), charge(kb, b, req)
	require.NoError(t, againA.err)
	require.NoError(t, againB.err)
	assert.True(t, proto.Equal(first.resp, againA.resp))
	assert.Equal(t, first.session, againA.session)
	assert.True(t, proto.Equal(stolen.resp, againB.resp))
	assert.Equal(t, stolen.session, againB.session)
	assert.Equal(t, 2, o.CountID(echov1.EchoService_Charge_FullMethodName, "order-1001"), "retries did not run")
}

// TestDefaultsScopeKeysByClientCertificate: with the defaults, keys are
// scoped by the caller's TLS client certificate.
func TestDefaultsScopeKeysByClientCertificate(t *testing.T) {
	pki := newTestPKI(t)
	o := sessionOrigin()
	l := serveDefaults(t, o, grpc.Creds(pki.serverCreds()))
	a := dialClient(t, l, grpc.WithTransportCredentials(pki.clientCreds("alice")))
	b := dialClient(t, l, grpc.WithTransportCredentials(pki.clientCreds("bob")))
	assertOwnExecutions(t, o, a, b, context.Background(), context.Background())
}

// TestDefaultsScopeKeysByAuthorization: without a client certificate, keys
// are scoped by a hash of the authorization metadata.
func TestDefaultsScopeKeysByAuthorization(t *testing.T) {
	o := sessionOrigin()
	l := serveDefaults(t, o)
	c := dialClient(t, l)
	as := func(token string) context.Context {
		return metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+token)
	}
	assertOwnExecutions(t, o, c, c, as("token-of-alice"), as("token-of-bob"))
}

// TestDefaultsRefuseAnonymousKeyedWrites: a keyed request to a
// deduplicated method from a caller the server cannot tell apart from
// others is refused before the handler runs, unless the server opts in to
// one shared anonymous key space.
func TestDefaultsRefuseAnonymousKeyedWrites(t *testing.T) {
	o := sessionOrigin()
	c := dialClient(t, serveDefaults(t, o))
	req := &echov1.ChargeRequest{RequestId: "anon", Account: "acct", AmountCents: 1}
	got := charge(metadata.AppendToOutgoingContext(context.Background(), "idempotency-key", "order-1"), c, req)
	assert.Equal(t, codes.FailedPrecondition, status.Code(got.err), "%v", got.err)
	assert.Contains(t, status.Convert(got.err).Message(), "AllowAnonymous")
	assert.Zero(t, o.Count(echov1.EchoService_Charge_FullMethodName), "the handler never runs unguarded")

	// Without a key there is nothing to deduplicate: the call runs.
	got = charge(context.Background(), c, req)
	require.NoError(t, got.err)
	assert.Equal(t, 1, o.Count(echov1.EchoService_Charge_FullMethodName))
}

// A gateway that holds one client certificate and forwards the requests of
// many users, each with their own token: the users do not share keys.
func TestDefaultsScopeKeysByCertificateAndAuthorization(t *testing.T) {
	pki := newTestPKI(t)
	o := sessionOrigin()
	l := serveDefaults(t, o, grpc.Creds(pki.serverCreds()))
	gateway := dialClient(t, l, grpc.WithTransportCredentials(pki.clientCreds("gateway")))
	as := func(token string) context.Context {
		return metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+token)
	}
	assertOwnExecutions(t, o, gateway, gateway, as("token-of-alice"), as("token-of-bob"))
}

func TestDefaultIdentity(t *testing.T) {
	pki := newTestPKI(t)
	certOf := func(cn string) *x509.Certificate {
		c, err := x509.ParseCertificate(pki.issue(cn, false).Certificate[0])
		require.NoError(t, err)
		return c
	}
	alice, bob := certOf("alice"), certOf("bob")
	ctx := func(cert *x509.Certificate, auth ...string) context.Context {
		ctx := context.Background()
		if cert != nil {
			ctx = peer.NewContext(ctx, &peer.Peer{AuthInfo: credentials.TLSInfo{
				State: tls.ConnectionState{PeerCertificates: []*x509.Certificate{cert, pki.ca}},
			}})
		}
		md := metadata.MD{}
		for _, a := range auth {
			md.Append("authorization", a)
		}
		return metadata.NewIncomingContext(ctx, md)
	}
	ids := map[string]string{
		"none":                dedupe.DefaultIdentity(ctx(nil)),
		"alice":               dedupe.DefaultIdentity(ctx(alice)),
		"bob":                 dedupe.DefaultIdentity(ctx(bob)),
		"token a":             dedupe.DefaultIdentity(ctx(nil, "Bearer a")),
		"token b":             dedupe.DefaultIdentity(ctx(nil, "Bearer b")),
		"tokens a, b":         dedupe.DefaultIdentity(ctx(nil, "Bearer a", "Bearer b")),
		"tokens b, a":         dedupe.DefaultIdentity(ctx(nil, "Bearer b", "Bearer a")),
		"token ab":            dedupe.DefaultIdentity(ctx(nil, "Bearer aBearer b")),
		"alice with token a":  dedupe.DefaultIdentity(ctx(alice, "Bearer a")),
		"alice with token b":  dedupe.DefaultIdentity(ctx(alice, "Bearer b")),
		"bob with token a":    dedupe.DefaultIdentity(ctx(bob, "Bearer a")),
		"peer without TLS":    dedupe.DefaultIdentity(peer.NewContext(context.Background(), &peer.Peer{})),
		"TLS without a cert":  dedupe.DefaultIdentity(peer.NewContext(context.Background(), &peer.Peer{AuthInfo: credentials.TLSInfo{}})),
		"empty authorization": dedupe.DefaultIdentity(ctx(nil, "")),
	}
	assert.Empty(t, ids["none"])
	assert.Empty(t, ids["peer without TLS"])
	assert.Empty(t, ids["TLS without a cert"])
	assert.Empty(t, ids["empty authorization"])
	assert.Empty(t, dedupe.DefaultIdentity(ctx(nil, "", "")))
	assert.Equal(t, ids["tokens a, b"], dedupe.DefaultIdentity(ctx(nil, "Bearer a", "", "Bearer b")))
	seen := map[string]string{}
	for name, id := range ids {
		if id == "" {
			continue
		}
		if other, dup := seen[id]; dup {
			t.Errorf("%q and %q share the identity %q", name, other, id)
		}
		seen[id] = name
		assert.LessOrEqual(t, len(id), dedupe.MaxIdentityLen, name)
	}
	assert.Regexp(t, `^tls:[A-Za-z0-9_-]{43}$`, ids["alice"])
	assert.Regexp(t, `^auth:[A-Za-z0-9_-]{43}$`, ids["token a"])
	assert.Regexp(t, `^tls\+auth:[A-Za-z0-9_-]{43}$`, ids["alice with token a"])
	assert.Equal(t, ids["alice"], dedupe.DefaultIdentity(ctx(alice)), "stable")
	assert.NotContains(t, ids["token a"], "Bearer", "the credentials are hashed, never kept")
}

// A custom Identity that returns something long is kept short in the
// store: two long identities that differ only at the end stay apart.
func TestLongIdentityIsHashed(t *testing.T) {
	prefix := strings.Repeat("x", 4<<10)
	s := dedupe.NewServer(dedupe.Config{Identity: tenant})
	req := &echov1.ChargeRequest{RequestId: "p"}
	runs := 0
	h := func(context.Context, any) (any, error) {
		runs++
		return &echov1.ChargeResponse{ChargeId: strconv.Itoa(runs)}, nil
	}
	for _, who := range []string{prefix + "a", prefix + "b", prefix + "a"} {
		md := keyMD("k")
		md.Set("x-tenant", who)
		_, _, err := direct(s, chargeMethod, md, req, h)
		require.NoError(t, err)
	}
	assert.Equal(t, 2, runs)
	assert.Equal(t, dedupe.Stats{Hits: 1, Misses: 2}, s.Stats())
}

// With AllowAnonymous, callers without identity share one key space, as
// documented; without it they are refused, streams included.
func TestAnonymousCallers(t *testing.T) {
	req := &echov1.ChargeRequest{RequestId: "anon", Account: "acct", AmountCents: 1}
	t.Run("refused", func(t *testing.T) {
		o := origin.New(nil)
		s := dedupe.NewServer(dedupe.Config{Methods: []string{listMethod}})
		c := startEcho(t, o, dedupeOpts(s))
		_, err := c.Charge(keyed(context.Background(), "k"), req)
		assert.Equal(t, codes.FailedPrecondition, status.Code(err))
		got := list(keyed(context.Background(), "k"), c, &echov1.ListRequest{RequestId: "l", Count: 1})
		assert.Equal(t, codes.FailedPrecondition, status.Code(got.err))
		assert.Zero(t, o.Total(), "no handler ran")
		assert.Equal(t, dedupe.Stats{Anonymous: 2}, s.Stats())
	})
	t.Run("shared when allowed", func(t *testing.T) {
		o := origin.New(nil)
		s := dedupe.NewServer(dedupe.Config{AllowAnonymous: true})
		a := startEcho(t, o, dedupeOpts(s))
		first, err := a.Charge(keyed(context.Background(), "k"), req)
		require.NoError(t, err)
		again, err := a.Charge(keyed(context.Background(), "k"), req)
		require.NoError(t, err)
		assert.True(t, proto.Equal(first, again), "one anonymous key space")
		assert.Equal(t, dedupe.Stats{Hits: 1, Misses: 1}, s.Stats())
	})
}

// FuzzIdentity feeds DefaultIdentity authorization values of any shape,
// and a custom identity of any length to the server: never a panic, an
// identity of bounded length, "" only without credentials, and two
// different credentials never share an identity.
func FuzzIdentity(f *testing.F) {
	for _, s := range [][2]string{{"", ""}, {"Bearer a", ""}, {"Bearer a", "Bearer b"}, {"", "x"},
		{"\x00", "\x00\x00"}, {strings.Repeat("t", 4096), ""}, {"ключ", "💳"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		id := func(vals ...string) string {
			md := metadata.MD{}
			for _, v := range vals {
				md.Append("authorization", v)
			}
			return dedupe.DefaultIdentity(metadata.NewIncomingContext(context.Background(), md))
		}
		one := id(a)
		if (one == "") != (a == "") {
			t.Fatalf("DefaultIdentity(%q) = %q", a, one)
		}
		if len(one) > dedupe.MaxIdentityLen {
			t.Fatalf("DefaultIdentity(%q) is %d bytes long", a, len(one))
		}
		if a != b && a != "" && b != "" && one == id(b) {
			t.Fatalf("%q and %q share the identity %q", a, b, one)
		}
		if two := id(a, b); len(two) > dedupe.MaxIdentityLen || (two == "") != (a == "" && b == "") {
			t.Fatalf("DefaultIdentity(%q, %q) = %q", a, b, two)
		}

		// A custom identity of any content scopes the server's keys.
		s := dedupe.NewServer(dedupe.Config{Identity: func(context.Context) string { return a }})
		runs := 0
		h := func(context.Context, any) (any, error) { runs++; return &echov1.ChargeResponse{}, nil }
		for range 2 {
			_, _, err := direct(s, chargeMethod, keyMD("k"), &echov1.ChargeRequest{}, h)
			if a == "" {
				if status.Code(err) != codes.FailedPrecondition {
					t.Fatalf("no identity: %v", err)
				}
			} else if err != nil {
				t.Fatalf("identity %q: %v", a, err)
			}
		}
		if a != "" && runs != 1 {
			t.Fatalf("identity %q: %d runs of one keyed request", a, runs)
		}
	})
}
