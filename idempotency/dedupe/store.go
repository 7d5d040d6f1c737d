package dedupe

import (
	"context"
	"crypto/sha256"
	"strconv"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Fingerprint identifies the request an idempotency key was first used
// with. A key may only ever be answered for the same Fingerprint: a
// request with the same key but another method or another request hash is
// refused with codes.InvalidArgument.
//
// The zero Fingerprint matches no real request (Method is never empty).
// Fingerprints are comparable with ==.
type Fingerprint struct {
	// Method is the full method name, "/pkg.Service/Method".
	Method string
	// RequestHash is the SHA-256 of the request message in protobuf's
	// deterministic serialization (proto.MarshalOptions{Deterministic:
	// true}), so equal messages hash equally whatever field order or map
	// order the client sent them in. Unknown fields are part of the hash.
	RequestHash [sha256.Size]byte
}

// Record is the stored outcome of one execution of a keyed request: what
// the server interceptor replays, without running the handler, when the
// same request arrives again with the same key.
//
// A Record is immutable once passed to [Store.Complete]: a Store may hand
// the same *Record to any number of callers, and none may modify it.
type Record struct {
	// Fingerprint is the request the record answers.
	Fingerprint
	// Response is the response message of a unary method in protobuf
	// wire format; empty when Code is not OK, and for streams.
	Response []byte
	// Responses are the response messages of a server-streaming method,
	// in protobuf wire format, in the order the handler sent them,
	// whatever Code is (a stream may fail after sending some); nil for
	// unary methods and for a stream that sent none.
	Responses [][]byte
	// Code and Message are the status the handler returned (codes.OK on
	// success).
	Code    codes.Code
	Message string
	// Details are the status details, as in google.rpc.Status.
	Details []*anypb.Any
	// Header and Trailer are the response metadata the handler (and the
	// interceptors inside this one) set with grpc.SetHeader, grpc.SendHeader
	// and grpc.SetTrailer.
	Header, Trailer metadata.MD
}

// ClaimState is the answer of [Store.Claim].
type ClaimState uint8

const (
	// Owned: first sight of the key (or its previous execution was
	// released). The caller must run the request and then call exactly
	// one of Store.Complete or Store.Release with the Claim.
	Owned ClaimState = iota + 1
	// InFlight: another execution holds the key and has not finished.
	// The caller may wait for it with Store.Wait.
	InFlight
	// Done: the key has a stored Record, in Claim.Record.
	Done
)

// String returns the state's name.
func (s ClaimState) String() string {
	switch s {
	case Owned:
		return "OWNED"
	case InFlight:
		return "IN_FLIGHT"
	case Done:
		return "DONE"
	}
	return "ClaimState(" + strconv.Itoa(int(s)) + ")"
}

// Scope is where an idempotency key lives: the same key in two scopes
// names two unrelated requests. Scopes are comparable with ==.
type Scope struct {
	// Identity is the caller, as Config.Identity (by default
	// [DefaultIdentity]) saw it; "" is the one key space that callers
	// without identity share when Config.AllowAnonymous is set.
	Identity string
	// Key is the idempotency key.
	Key string
}

// Claim is what [Store.Claim] found for a scope.
type Claim struct {
	// State says whether the caller owns the key, must wait, or has an
	// answer.
	State ClaimState
	// Scope is the scope that was claimed.
	Scope Scope
	// Holder is the request that holds the key: the caller's own
	// Fingerprint when State is Owned, the first request's otherwise.
	// The caller compares it with its own before waiting or replaying.
	Holder Fingerprint
	// Record is the stored outcome when State is Done; nil otherwise.
	Record *Record
	// Token is the store's handle on the execution (Owned: the caller's
	// own; InFlight: the one to wait for). It is opaque to callers and
	// passed back to Complete, Release and Wait.
	Token any
}

// Store keeps idempotency records. It is the seam between the server
// interceptor and where records live: [MemoryStore] in one process, or a
// shared store (Redis, a database) so that every replica of a service sees
// the same keys.
//
// A Scope's identity and key are opaque strings of at most MaxIdentityLen
// and idempotency.MaxKeyLen bytes.
//
// The protocol, for one request:
//
//	c, err := store.Claim(ctx, scope, fp)
//	Owned    → run the handler; then Complete(ctx, c, rec) to store its
//	           outcome, or Release(ctx, c) to forget it (retryable failure,
//	           panic), so that the next attempt runs again.
//	InFlight → (if c.Holder == fp) Wait(ctx, c): the record once the other
//	           execution completes, or nil once it is released, in which
//	           case Claim again.
//	Done     → (if c.Holder == fp) replay c.Record.
//
// Implementations must be safe for concurrent use, and must make Claim
// atomic: of any number of concurrent Claims of one scope, at most one gets
// Owned until that claim is completed or released. An owned claim should
// not be taken from its owner while the owner runs (MemoryStore never
// evicts one); a shared store should still give it a lease, renewed or long
// enough for the slowest handler, so that a crashed process does not hold a
// key forever. Completed records are kept for a TTL and may be evicted
// earlier to bound memory.
//
// Errors should be gRPC status errors; the server interceptor returns them
// to the caller as they are, and turns any other error into
// codes.Unavailable (the handler has not run, so the caller may retry).
type Store interface {
	// Claim looks scope up and, if it is free, takes it for fp. It does
	// not block for other executions.
	Claim(ctx context.Context, scope Scope, fp Fingerprint) (Claim, error)
	// Complete stores rec (whose Fingerprint is c.Holder) as the outcome
	// of the owned claim c and wakes its waiters. The server passes a
	// context that is not cancelled when the caller leaves.
	Complete(ctx context.Context, c Claim, rec *Record) error
	// Release gives the owned claim c up without storing anything and
	// wakes its waiters, which then Claim again.
	Release(ctx context.Context, c Claim) error
	// Wait blocks until the execution of the InFlight claim c completes
	// (it returns the Record) or is released (it returns nil, nil), or
	// until ctx is done (it returns a status error from the context:
	// codes.DeadlineExceeded or codes.Canceled).
	Wait(ctx context.Context, c Claim) (*Record, error)
}

// resourceExhausted returns a ResourceExhausted status error with msg and
// a RetryInfo of wait: how a Store refuses a claim for want of room.
func resourceExhausted(msg string, wait time.Duration) error {
	st, err := status.New(codes.ResourceExhausted, msg).WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(wait)})
	if err != nil { // cannot happen: RetryInfo always marshals
		return status.Error(codes.ResourceExhausted, msg)
	}
	return st.Err()
}

// retryDelay returns the RetryInfo delay of st, if it has one.
func retryDelay(st *status.Status) (time.Duration, bool) {
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay() != nil {
			return max(ri.GetRetryDelay().AsDuration(), 0), true
		}
	}
	return 0, false
}
