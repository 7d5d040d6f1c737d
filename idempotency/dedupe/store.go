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

// ClaimState is the answer of [Store.Claim]. The zero value is no state:
// a Store never returns it.
type ClaimState uint8

const (
	// Owned means the caller took the key: first sight of it, or its
	// previous execution was released. The caller must run the request and
	// then call exactly one of Store.Complete or Store.Release with the
	// Claim.
	Owned ClaimState = iota + 1
	// InFlight means another execution holds the key and has not
	// finished. The caller may wait for it with Store.Wait.
	InFlight
	// Done means the key has a stored Record, in Claim.Record.
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

// Store keeps the outcomes of keyed requests for a [Server]. [MemoryStore]
// keeps them in one process; a shared store (Redis, a database) lets every
// replica of a service see the same keys. The README in this directory
// states the contract in full; the conformance suite in internal/storetest
// checks it.
//
// A scope holds nothing, an execution in flight (owned by the one caller
// whose Claim took it), or a completed Record, kept for a TTL after
// completion and evictable to make room only once it is older than a
// retry horizon.
//
// Implementations must be safe for concurrent use. A Scope's identity and
// key are opaque strings of at most MaxIdentityLen and
// idempotency.MaxKeyLen bytes.
type Store interface {
	// Claim atomically looks scope up and, if it holds nothing, takes it
	// for fp: of concurrent Claims of one scope, one gets Owned, and the
	// others get InFlight until the owner completes or releases it, or
	// its lease ends. The lease lasts at least until ctx's deadline (or a
	// store-defined time without one); a store that outlives its owners
	// (a shared one) must end it eventually. A scope with a record gets
	// Done, with the record. Claim never waits for another execution.
	//
	// When taking the scope would evict an entry in flight or a record
	// younger than the retry horizon, Claim fails with
	// codes.ResourceExhausted and an errdetails.RetryInfo saying when to
	// come back. Any other error means the store could not answer; the
	// server then refuses the request with codes.Unavailable, and the
	// handler does not run.
	Claim(ctx context.Context, scope Scope, fp Fingerprint) (Claim, error)
	// Complete stores rec as the outcome of the owned claim c and wakes
	// its waiters; rec.Fingerprint is c.Holder, and rec is immutable from
	// then on. A record that does not fit is replaced by a tombstone: the
	// same Fingerprint, codes.Internal, a message saying the response was
	// too large, and nothing else; the scope is never freed before its TTL
	// once its request may have run. Complete fails for a claim that is
	// not an owned claim of the store, is finished, or whose lease ended;
	// the outcome is then lost. A store that cannot reach its backend
	// keeps trying while the claim's lease lasts, so that a handler that
	// completed never runs again because the store was briefly
	// unreachable. The server passes a context that is not cancelled when
	// the caller leaves.
	Complete(ctx context.Context, c Claim, rec *Record) error
	// Release gives the owned claim c up without an outcome (the handler
	// failed with a code not to store, or panicked): it frees the scope
	// and wakes the waiters, which then Claim again. It fails as Complete
	// does.
	Release(ctx context.Context, c Claim) error
	// Wait blocks until the execution of the InFlight claim c finishes:
	// it returns the record once completed, or nil, nil once released or
	// once its lease ended, so that the waiter claims again. When ctx is
	// done first, it returns the status of ctx's error
	// (codes.DeadlineExceeded or codes.Canceled).
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
