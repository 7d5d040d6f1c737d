package dedupe

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

// authorizationKey is the request metadata key whose values
// DefaultIdentity hashes: the credentials a caller sends with each
// request, such as "Bearer <token>".
const authorizationKey = "authorization"

// MaxIdentityLen is the longest identity kept as it is, in bytes. A longer
// identity from Config.Identity is replaced by its SHA-256, so that what
// the server stores per identity stays small.
const MaxIdentityLen = 128

// DefaultIdentity returns who is calling, as far as the server can tell
// without knowing its authentication: a SHA-256 of the leaf TLS client
// certificate the caller presented, of its authorization metadata, or of
// both when it sent both (a gateway with one certificate may forward the
// requests of many users, each with their own token). Empty authorization
// values are ignored. It returns "" when the caller presented neither.
//
// The result is "tls:", "auth:" or "tls+auth:" followed by 43 characters
// of unpadded URL-safe base64. A caller whose token changes between two
// attempts of one call (a refreshed token) is seen as a new caller, and
// its retry runs again: servers whose callers rotate tokens should set
// Config.Identity to the authenticated principal instead.
//
// DefaultIdentity is safe for concurrent use.
func DefaultIdentity(ctx context.Context) string {
	var cert, auth [sha256.Size]byte
	hasCert, hasAuth := false, false
	if p, ok := peer.FromContext(ctx); ok {
		var certs []*x509.Certificate
		switch ti := p.AuthInfo.(type) {
		case credentials.TLSInfo: // as grpc's TLS credentials set it
			certs = ti.State.PeerCertificates
		case *credentials.TLSInfo:
			certs = ti.State.PeerCertificates
		}
		if len(certs) > 0 && certs[0] != nil {
			cert, hasCert = sha256.Sum256(certs[0].Raw), true
		}
	}
	if vals := metadata.ValueFromIncomingContext(ctx, authorizationKey); len(vals) > 0 {
		auth, hasAuth = hashValues(vals)
	}
	switch {
	case hasCert && hasAuth:
		var both [2 * sha256.Size]byte
		copy(both[:], cert[:])
		copy(both[sha256.Size:], auth[:])
		return encodeIdentity("tls+auth:", sha256.Sum256(both[:]))
	case hasCert:
		return encodeIdentity("tls:", cert)
	case hasAuth:
		return encodeIdentity("auth:", auth)
	}
	return ""
}

// hashValues returns the SHA-256 of the non-empty values, each followed by
// a NUL (metadata values are printable ASCII: the NUL separates them), and
// whether there was one.
func hashValues(vals []string) (sum [sha256.Size]byte, ok bool) {
	bp := hashBufs.Get().(*[]byte)
	b := (*bp)[:0]
	for _, v := range vals {
		if v != "" {
			b = append(append(b, v...), 0)
		}
	}
	if ok = len(b) > 0; ok {
		sum = sha256.Sum256(b)
	}
	if cap(b) <= maxPooledBuf {
		*bp = b[:0]
		hashBufs.Put(bp)
	}
	return sum, ok
}

// encodeIdentity returns prefix (at most 16 bytes) and sum in base64.
func encodeIdentity(prefix string, sum [sha256.Size]byte) string {
	var b [16 + 43]byte // 43: base64.RawURLEncoding.EncodedLen(sha256.Size)
	n := copy(b[:16], prefix)
	base64.RawURLEncoding.Encode(b[n:], sum[:])
	return string(b[:n+43])
}

// boundIdentity replaces an identity longer than MaxIdentityLen by its
// SHA-256.
func boundIdentity(id string) string {
	if len(id) <= MaxIdentityLen {
		return id
	}
	return encodeIdentity("sha256:", sha256.Sum256([]byte(id)))
}
