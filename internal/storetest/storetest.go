// Package storetest is the conformance suite of dedupe.Store: what any
// store must do for the dedupe server to run each keyed write once, in one
// process (dedupe.MemoryStore) or across replicas (a shared store).
//
// A store's tests call [Run] with a function that builds a fresh, empty
// store from a [Config]:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T, c storetest.Config) dedupe.Store {
//			return newMyStore(t, c)
//		})
//	}
//
// The suite never waits on the real clock. [Run] runs each test in a
// synctest bubble, whose clock stands still until the suite moves it (by
// sleeping): a store that reads the real clock, as dedupe.MemoryStore
// does, is tested as it runs. A store that cannot run in a bubble (one
// that talks to a server over the network) runs on [RunOnClock]'s clock
// instead, which it must take every time it compares (TTL, retry horizon,
// lease) from: a shared store that reads the time from its server
// (redisstore reads Redis's, so that replicas share one clock) lets its
// tests put that clock in its server's clock's place.
package storetest

import (
	"context"
	"crypto/sha256"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/stormguard/stormguard/idempotency/dedupe"
)

// Config is what a store under test is built with. Its fields mean what
// dedupe.MemoryConfig's fields of the same names mean; the suite sets
// them all.
type Config struct {
	MaxEntries, MaxEntriesPerIdentity int
	MaxBytes, MaxBytesPerIdentity     int64
	TTL, RetryHorizon                 time.Duration
}

// NewStore builds a fresh, empty store for one test. It may register
// cleanups with t.
type NewStore func(t *testing.T, c Config) dedupe.Store

// NewStoreOnClock builds a fresh, empty store for one test, which takes
// every time it compares from now. It may register cleanups with t.
type NewStoreOnClock func(t *testing.T, c Config, now func() time.Time) dedupe.Store

// clock is the time a test runs on, which it moves.
type clock interface {
	Now() time.Time
	Advance(d time.Duration)
}

// bubbleClock is the real clock inside a synctest bubble: it stands still
// until every goroutine of the bubble waits, so the suite moves it by
// sleeping.
type bubbleClock struct{}

func (bubbleClock) Now() time.Time          { return time.Now() }
func (bubbleClock) Advance(d time.Duration) { time.Sleep(d) }

// manualClock is RunOnClock's clock: it moves only when told. It is safe
// for concurrent use.
type manualClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *manualClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// build makes a test's store and the clock it runs on.
type build func(t *testing.T, c Config) (dedupe.Store, clock)

// The suite's bounds: small, so that a test fills them in a few claims.
const (
	ttl       = 24 * time.Hour
	horizon   = time.Minute
	maxBytes  = 1 << 20
	bigRecord = 2 * maxBytes
)

// env is one test's store and clock.
type env struct {
	t     *testing.T
	store dedupe.Store
	clock clock
}

func setup(t *testing.T, b build, maxEntries, perIdentity int) *env {
	t.Helper()
	s, clock := b(t, Config{
		MaxEntries: maxEntries, MaxEntriesPerIdentity: perIdentity,
		MaxBytes: maxBytes, MaxBytesPerIdentity: maxBytes / 2,
		TTL: ttl, RetryHorizon: horizon,
	})
	return &env{t: t, store: s, clock: clock}
}

// Run runs the suite against the stores newStore builds, each test in a
// synctest bubble (see the package documentation): for a store that reads
// the real clock.
func Run(t *testing.T, newStore NewStore) {
	b := func(t *testing.T, c Config) (dedupe.Store, clock) { return newStore(t, c), bubbleClock{} }
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { tc.run(t, b) })
		})
	}
}

// RunOnClock runs the suite against the stores newStore builds, each on a
// clock that moves only when the suite says (see the package
// documentation): for a store that cannot run in a synctest bubble.
func RunOnClock(t *testing.T, newStore NewStoreOnClock) {
	b := func(t *testing.T, c Config) (dedupe.Store, clock) {
		// The clock starts at the wall clock's time, so that a context
		// deadline computed from it is in the future for the context
		// too.
		clock := &manualClock{t: time.Now()}
		return newStore(t, c, clock.Now), clock
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, b) })
	}
}

// tests is the suite.
var tests = []struct {
	name string
	run  func(t *testing.T, b build)
}{
	{"ClaimCompleteReplay", testClaimCompleteReplay},
	{"HolderIsTheFirstRequest", testHolderIsTheFirstRequest},
	{"ConcurrentClaimsHaveOneOwner", testConcurrentClaimsHaveOneOwner},
	{"WaitForCompletion", testWaitForCompletion},
	{"WaitForRelease", testWaitForRelease},
	{"WaitBoundedByContext", testWaitBoundedByContext},
	{"ReleaseFreesTheScope", testReleaseFreesTheScope},
	{"FinishedClaimsCannotFinishAgain", testFinishedClaimsCannotFinishAgain},
	{"IdentitiesAreSeparate", testIdentitiesAreSeparate},
	{"TTL", testTTL},
	{"LeaseLastsUntilTheDeadline", testLeaseLastsUntilTheDeadline},
	{"InFlightIsNeverEvicted", testInFlightIsNeverEvicted},
	{"YoungRecordsAreNeverEvicted", testYoungRecordsAreNeverEvicted},
	{"ShareEvictsItsOwnOldest", testShareEvictsItsOwnOldest},
	{"StoreEvictsTheOldest", testStoreEvictsTheOldest},
	{"OversizedRecordKeepsATombstone", testOversizedRecordKeepsATombstone},
}

var bg = context.Background()

func fingerprint(req string) dedupe.Fingerprint {
	return dedupe.Fingerprint{Method: "/storetest.v1.Payments/Charge", RequestHash: sha256.Sum256([]byte(req))}
}

func scope(identity, key string) dedupe.Scope { return dedupe.Scope{Identity: identity, Key: key} }

// record returns a record of fp holding a bit of everything.
func record(t *testing.T, fp dedupe.Fingerprint, resp string) *dedupe.Record {
	t.Helper()
	detail, err := anypb.New(wrapperspb.String("detail of " + resp))
	if err != nil {
		t.Fatal(err)
	}
	return &dedupe.Record{
		Fingerprint: fp,
		Response:    []byte(resp),
		Responses:   [][]byte{[]byte("one"), []byte("two")},
		Code:        codes.OK,
		Message:     "",
		Details:     []*anypb.Any{detail},
		Header:      metadata.Pairs("x-session", resp),
		Trailer:     metadata.Pairs("x-receipt", resp, "x-receipt", "again"),
	}
}

// sameRecord fails t unless got holds what want holds (a shared store
// returns a copy).
func sameRecord(t *testing.T, want, got *dedupe.Record) {
	t.Helper()
	if got == nil {
		t.Fatalf("got no record, want %+v", want)
	}
	if got.Fingerprint != want.Fingerprint || string(got.Response) != string(want.Response) ||
		got.Code != want.Code || got.Message != want.Message ||
		!reflect.DeepEqual(got.Responses, want.Responses) ||
		!sameMD(got.Header, want.Header) || !sameMD(got.Trailer, want.Trailer) ||
		len(got.Details) != len(want.Details) {
		t.Fatalf("got record %+v, want %+v", got, want)
	}
	for i := range want.Details {
		if !proto.Equal(want.Details[i], got.Details[i]) {
			t.Fatalf("detail %d: got %v, want %v", i, got.Details[i], want.Details[i])
		}
	}
}

func sameMD(a, b metadata.MD) bool {
	return len(a) == len(b) && (len(a) == 0 || reflect.DeepEqual(a, b))
}

func (e *env) claim(sc dedupe.Scope, fp dedupe.Fingerprint) dedupe.Claim {
	e.t.Helper()
	c, err := e.store.Claim(bg, sc, fp)
	if err != nil {
		e.t.Fatalf("Claim(%v): %v", sc, err)
	}
	return c
}

func (e *env) owned(sc dedupe.Scope, fp dedupe.Fingerprint) dedupe.Claim {
	e.t.Helper()
	c := e.claim(sc, fp)
	if c.State != dedupe.Owned {
		e.t.Fatalf("Claim(%v) = %v, want OWNED", sc, c.State)
	}
	if c.Holder != fp {
		e.t.Fatalf("Claim(%v): holder %v, want the claimer's %v", sc, c.Holder, fp)
	}
	return c
}

// complete claims sc for fp and completes it with a record of resp.
func (e *env) complete(sc dedupe.Scope, fp dedupe.Fingerprint, resp string) *dedupe.Record {
	e.t.Helper()
	c := e.owned(sc, fp)
	rec := record(e.t, fp, resp)
	if err := e.store.Complete(bg, c, rec); err != nil {
		e.t.Fatalf("Complete(%v): %v", sc, err)
	}
	return rec
}

// state returns the state of sc for fp, releasing it if the probe took it.
func (e *env) state(sc dedupe.Scope, fp dedupe.Fingerprint) dedupe.ClaimState {
	e.t.Helper()
	c := e.claim(sc, fp)
	if c.State == dedupe.Owned {
		if err := e.store.Release(bg, c); err != nil {
			e.t.Fatal(err)
		}
	}
	return c.State
}

// refused fails t unless err is a ResourceExhausted status with a
// RetryInfo, and returns its delay.
func refused(t *testing.T, err error) time.Duration {
	t.Helper()
	st := status.Convert(err)
	if err == nil || st.Code() != codes.ResourceExhausted {
		t.Fatalf("got %v, want a ResourceExhausted refusal", err)
	}
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration()
		}
	}
	t.Fatalf("refusal %v has no RetryInfo", err)
	return 0
}

func testClaimCompleteReplay(t *testing.T, b build) {
	e := setup(t, b, 100, 100)
	fp := fingerprint("req")
	want := e.complete(scope("alice", "k"), fp, "resp")
	for range 2 { // a hit changes nothing
		c := e.claim(scope("alice", "k"), fp)
		if c.State != dedupe.Done || c.Holder != fp {
			t.Fatalf("got %v held by %v, want DONE held by %v", c.State, c.Holder, fp)
		}
		sameRecord(t, want, c.Record)
	}
}

func testHolderIsTheFirstRequest(t *testing.T, b build) {
	e := setup(t, b, 100, 100)
	first, other := fingerprint("first"), fingerprint("other")
	owner := e.owned(scope("alice", "k"), first)
	c := e.claim(scope("alice", "k"), other)
	if c.State != dedupe.InFlight || c.Holder != first {
		t.Fatalf("got %v held by %v, want IN_FLIGHT held by the first request", c.State, c.Holder)
	}
	if err := e.store.Complete(bg, owner, record(t, first, "r")); err != nil {
		t.Fatal(err)
	}
	c = e.claim(scope("alice", "k"), other)
	if c.State != dedupe.Done || c.Holder != first {
		t.Fatalf("got %v held by %v, want DONE held by the first request", c.State, c.Holder)
	}
}

func testConcurrentClaimsHaveOneOwner(t *testing.T, b build) {
	e := setup(t, b, 100, 100)
	fp := fingerprint("req")
	const n = 32
	states := make([]dedupe.ClaimState, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			var c dedupe.Claim
			c, errs[i] = e.store.Claim(bg, scope("alice", "k"), fp)
			states[i] = c.State
		})
	}
	wg.Wait()
	owners := 0
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("claim %d: %v", i, errs[i])
		}
		switch states[i] {
		case dedupe.Owned:
			owners++
		case dedupe.InFlight:
		default:
			t.Fatalf("claim %d: %v", i, states[i])
		}
	}
	if owners != 1 {
		t.Fatalf("%d owners of one scope, want 1", owners)
	}
}

// waitAsync waits for c in a goroutine.
func waitAsync(e *env, c dedupe.Claim) <-chan waited {
	ch := make(chan waited, 1)
	go func() {
		rec, err := e.store.Wait(bg, c)
		ch <- waited{rec, err}
	}()
	return ch
}

type waited struct {
	rec *dedupe.Record
	err error
}

func testWaitForCompletion(t *testing.T, b build) {
	e := setup(t, b, 100, 100)
	fp := fingerprint("req")
	owner := e.owned(scope("alice", "k"), fp)
	dup := e.claim(scope("alice", "k"), fp)
	if dup.State != dedupe.InFlight {
		t.Fatalf("got %v, want IN_FLIGHT", dup.State)
	}
	ch := waitAsync(e, dup)
	rec := record(t, fp, "r")
	if err := e.store.Complete(bg, owner, rec); err != nil {
		t.Fatal(err)
	}
	w := <-ch
	if w.err != nil {
		t.Fatal(w.err)
	}
	sameRecord(t, rec, w.rec)
	// Waiting on a finished execution returns at once.
	again, err := e.store.Wait(bg, dup)
	if err != nil {
		t.Fatal(err)
	}
	sameRecord(t, rec, again)
}

func testWaitForRelease(t *testing.T, b build) {
	e := setup(t, b, 100, 100)
	fp := fingerprint("req")
	owner := e.owned(scope("alice", "k"), fp)
	ch := waitAsync(e, e.claim(scope("alice", "k"), fp))
	if err := e.store.Release(bg, owner); err != nil {
		t.Fatal(err)
	}
	if w := <-ch; w.err != nil || w.rec != nil {
		t.Fatalf("Wait after Release = %v, %v; want nil, nil", w.rec, w.err)
	}
	e.owned(scope("alice", "k"), fp) // the waiter claims again, and owns it
}

func testWaitBoundedByContext(t *testing.T, b build) {
	e := setup(t, b, 100, 100)
	fp := fingerprint("req")
	owner := e.owned(scope("alice", "k"), fp)
	dup := e.claim(scope("alice", "k"), fp)
	canceled, cancel := context.WithCancel(bg)
	cancel()
	if _, err := e.store.Wait(canceled, dup); status.Code(err) != codes.Canceled {
		t.Fatalf("Wait with a canceled context: %v, want Canceled", err)
	}
	expired, cancel2 := context.WithDeadline(bg, time.Now().Add(-time.Second))
	defer cancel2()
	if _, err := e.store.Wait(expired, dup); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("Wait past its deadline: %v, want DeadlineExceeded", err)
	}
	if err := e.store.Release(bg, owner); err != nil {
		t.Fatal(err)
	}
}

func testReleaseFreesTheScope(t *testing.T, b build) {
	e := setup(t, b, 100, 100)
	fp := fingerprint("req")
	if err := e.store.Release(bg, e.owned(scope("alice", "k"), fp)); err != nil {
		t.Fatal(err)
	}
	e.owned(scope("alice", "k"), fingerprint("another request may take it"))
}

func testFinishedClaimsCannotFinishAgain(t *testing.T, b build) {
	e := setup(t, b, 100, 100)
	fp := fingerprint("req")
	done := e.owned(scope("alice", "done"), fp)
	rec := record(t, fp, "r")
	if err := e.store.Complete(bg, done, rec); err != nil {
		t.Fatal(err)
	}
	released := e.owned(scope("alice", "released"), fp)
	if err := e.store.Release(bg, released); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]dedupe.Claim{"completed": done, "released": released} {
		if err := e.store.Complete(bg, c, rec); err == nil {
			t.Errorf("Complete of a %s claim succeeded", name)
		}
		if err := e.store.Release(bg, c); err == nil {
			t.Errorf("Release of a %s claim succeeded", name)
		}
	}
	sameRecord(t, rec, e.claim(scope("alice", "done"), fp).Record)
	// A claim that is not owned does not finish either.
	dup := e.owned(scope("alice", "k"), fp)
	inFlight := e.claim(scope("alice", "k"), fp)
	if err := e.store.Complete(bg, inFlight, rec); err == nil {
		t.Error("Complete of an IN_FLIGHT claim succeeded")
	}
	if err := e.store.Release(bg, dup); err != nil {
		t.Fatal(err)
	}
}

func testIdentitiesAreSeparate(t *testing.T, b build) {
	e := setup(t, b, 100, 100)
	fp := fingerprint("req")
	alice := e.owned(scope("alice", "k"), fp)
	bob := e.owned(scope("bob", "k"), fp) // not IN_FLIGHT: another scope
	anon := e.owned(scope("", "k"), fp)
	recs := map[string]*dedupe.Record{"alice": record(t, fp, "alice's"), "bob": record(t, fp, "bob's"), "": record(t, fp, "anonymous")}
	for who, c := range map[string]dedupe.Claim{"alice": alice, "bob": bob, "": anon} {
		if err := e.store.Complete(bg, c, recs[who]); err != nil {
			t.Fatal(err)
		}
	}
	for who, rec := range recs {
		sameRecord(t, rec, e.claim(scope(who, "k"), fp).Record)
	}
	// An identity and a key that join into the same string are apart.
	e.complete(scope("a", "b:c"), fp, "1")
	if got := e.state(scope("a:b", "c"), fp); got != dedupe.Owned {
		t.Fatalf("(a:b, c) is %v, want OWNED: it is not (a, b:c)", got)
	}
}

func testTTL(t *testing.T, b build) {
	e := setup(t, b, 100, 100)
	fp := fingerprint("req")
	e.complete(scope("alice", "a"), fp, "r")
	e.clock.Advance(ttl - time.Second)
	if got := e.state(scope("alice", "a"), fp); got != dedupe.Done {
		t.Fatalf("just before its TTL: %v, want DONE", got)
	}
	e.clock.Advance(time.Second) // a hit did not extend it
	if got := e.state(scope("alice", "a"), fp); got != dedupe.Owned {
		t.Fatalf("at its TTL: %v, want OWNED (expired)", got)
	}
}

func testLeaseLastsUntilTheDeadline(t *testing.T, b build) {
	e := setup(t, b, 100, 100)
	fp := fingerprint("req")
	ctx, cancel := context.WithDeadline(bg, e.clock.Now().Add(time.Hour))
	defer cancel()
	owner, err := e.store.Claim(ctx, scope("alice", "k"), fp)
	if err != nil || owner.State != dedupe.Owned {
		t.Fatalf("Claim = %v, %v", owner.State, err)
	}
	e.clock.Advance(59 * time.Minute)
	if got := e.claim(scope("alice", "k"), fp).State; got != dedupe.InFlight {
		t.Fatalf("within the owner's deadline: %v, want IN_FLIGHT", got)
	}
	if err := e.store.Complete(bg, owner, record(t, fp, "r")); err != nil {
		t.Fatalf("Complete within the lease: %v", err)
	}
}

func testInFlightIsNeverEvicted(t *testing.T, b build) {
	e := setup(t, b, 2, 2)
	fp := fingerprint("req")
	// Owners with an hour to run: their leases outlast the test.
	ctx, cancel := context.WithDeadline(bg, e.clock.Now().Add(time.Hour))
	defer cancel()
	var claims []dedupe.Claim
	for _, k := range []string{"a", "b"} {
		c, err := e.store.Claim(ctx, scope("alice", k), fp)
		if err != nil || c.State != dedupe.Owned {
			t.Fatalf("Claim(%s) = %v, %v", k, c.State, err)
		}
		claims = append(claims, c)
	}
	first, second := claims[0], claims[1]
	e.clock.Advance(2 * horizon) // older than any record may be kept from eviction
	_, err := e.store.Claim(bg, scope("alice", "c"), fp)
	refused(t, err)
	_, err = e.store.Claim(bg, scope("bob", "c"), fp)
	refused(t, err)
	for _, c := range []dedupe.Claim{first, second} {
		if got := e.claim(c.Scope, fp).State; got != dedupe.InFlight {
			t.Fatalf("%v: %v, want IN_FLIGHT", c.Scope, got)
		}
	}
	if err := e.store.Complete(bg, first, record(t, fp, "a")); err != nil {
		t.Fatal(err)
	}
	if err := e.store.Release(bg, second); err != nil {
		t.Fatal(err)
	}
}

func testYoungRecordsAreNeverEvicted(t *testing.T, b build) {
	e := setup(t, b, 8, 2)
	fp := fingerprint("req")
	e.complete(scope("y", "y1"), fp, "y1")
	e.clock.Advance(10 * time.Second)
	e.complete(scope("x", "x1"), fp, "x1")
	e.complete(scope("x", "x2"), fp, "x2")
	// X holds its share in young records: X is refused, until its oldest
	// is past the horizon.
	_, err := e.store.Claim(bg, scope("x", "x3"), fp)
	if got := refused(t, err); got <= 0 || got > horizon {
		t.Fatalf("retry after %v, want within the horizon (%v)", got, horizon)
	}
	// Fill the store with young records of other identities: a new
	// identity is refused rather than evicting any of them.
	e.complete(scope("y", "y2"), fp, "y2")
	for _, who := range []string{"a", "b"} {
		e.complete(scope(who, "1"), fp, who+"1")
		e.complete(scope(who, "2"), fp, who+"2")
	}
	_, err = e.store.Claim(bg, scope("c", "1"), fp)
	if got := refused(t, err); got <= 0 || got > horizon-10*time.Second {
		t.Fatalf("retry after %v, want at most until y1 is past the horizon (%v)", got, horizon-10*time.Second)
	}
	for _, k := range [][2]string{{"y", "y1"}, {"y", "y2"}, {"x", "x1"}, {"x", "x2"}, {"a", "1"}, {"a", "2"}, {"b", "1"}, {"b", "2"}} {
		if got := e.state(scope(k[0], k[1]), fp); got != dedupe.Done {
			t.Fatalf("%v: %v, want DONE (never evicted while young)", k, got)
		}
	}
}

func testShareEvictsItsOwnOldest(t *testing.T, b build) {
	e := setup(t, b, 100, 2)
	fp := fingerprint("req")
	e.complete(scope("x", "x1"), fp, "x1")
	e.complete(scope("y", "y1"), fp, "y1")
	e.clock.Advance(time.Second)
	e.complete(scope("x", "x2"), fp, "x2")
	e.clock.Advance(horizon)
	e.complete(scope("x", "x3"), fp, "x3") // makes room within x's share
	for _, k := range [][2]string{{"y", "y1"}, {"x", "x2"}, {"x", "x3"}} {
		if got := e.state(scope(k[0], k[1]), fp); got != dedupe.Done {
			t.Fatalf("%v: %v, want DONE", k, got)
		}
	}
	if got := e.state(scope("x", "x1"), fp); got != dedupe.Owned {
		t.Fatalf("x1: %v, want OWNED (x's oldest, evicted for x3)", got)
	}
}

func testStoreEvictsTheOldest(t *testing.T, b build) {
	e := setup(t, b, 4, 4)
	fp := fingerprint("req")
	for i, who := range []string{"a", "b", "c", "d"} {
		e.complete(scope(who, "k"), fp, who)
		e.clock.Advance(time.Duration(i+1) * time.Second)
	}
	e.clock.Advance(horizon)
	e.complete(scope("e", "k"), fp, "e") // evicts a's, the oldest
	for _, who := range []string{"b", "c", "d", "e"} {
		if got := e.state(scope(who, "k"), fp); got != dedupe.Done {
			t.Fatalf("%s: %v, want DONE", who, got)
		}
	}
	if got := e.state(scope("a", "k"), fp); got != dedupe.Owned {
		t.Fatalf("a: %v, want OWNED (the oldest, evicted)", got)
	}
}

func testOversizedRecordKeepsATombstone(t *testing.T, b build) {
	e := setup(t, b, 100, 100)
	fp := fingerprint("req")
	c := e.owned(scope("alice", "huge"), fp)
	big := &dedupe.Record{Fingerprint: fp, Response: make([]byte, bigRecord), Header: metadata.Pairs("x", "y")}
	if err := e.store.Complete(bg, c, big); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		got := e.claim(scope("alice", "huge"), fp)
		if got.State != dedupe.Done {
			t.Fatalf("got %v, want DONE: the request ran and must not run again", got.State)
		}
		r := got.Record
		if r == nil || r.Fingerprint != fp || r.Code != codes.Internal || !strings.Contains(r.Message, "too large") ||
			len(r.Response) != 0 || len(r.Responses) != 0 || len(r.Header) != 0 || len(r.Trailer) != 0 || len(r.Details) != 0 {
			t.Fatalf("got %s, want a tombstone", describe(r))
		}
	}
	// Records that fit are kept beside it.
	rec := e.complete(scope("alice", "small"), fp, "ok")
	sameRecord(t, rec, e.claim(scope("alice", "small"), fp).Record)
}

func describe(r *dedupe.Record) string {
	if r == nil {
		return "no record"
	}
	return fmt.Sprintf("record %v %q with %d response bytes", r.Code, r.Message, len(r.Response))
}
