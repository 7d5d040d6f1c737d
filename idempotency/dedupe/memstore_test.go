package dedupe_test

import (
	"context"
	"crypto/sha256"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/dedupe"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// pastHorizon is longer than the default retry horizon.
const pastHorizon = dedupe.DefaultRetryHorizon + time.Second

func fingerprint(method, req string) dedupe.Fingerprint {
	return dedupe.Fingerprint{Method: method, RequestHash: sha256.Sum256([]byte(req))}
}

func okRecord(fp dedupe.Fingerprint, resp string) *dedupe.Record {
	return &dedupe.Record{Fingerprint: fp, Response: []byte(resp), Trailer: metadata.Pairs("x-receipt", resp)}
}

var bg = context.Background()

// sc is the scope of key k for callers without identity.
func sc(k string) dedupe.Scope { return dedupe.Scope{Key: k} }

// claimComplete claims scope and completes it with a record of resp.
func claimComplete(t testing.TB, s dedupe.Store, key string, fp dedupe.Fingerprint, resp string) {
	t.Helper()
	c, err := s.Claim(bg, sc(key), fp)
	require.NoError(t, err)
	require.Equal(t, dedupe.Owned, c.State, key)
	require.NoError(t, s.Complete(bg, c, okRecord(fp, resp)))
}

func TestMemoryStoreClaimCompleteReplay(t *testing.T) {
	s := dedupe.NewMemoryStore(dedupe.MemoryConfig{})
	fp := fingerprint("/p.S/Charge", "req")

	c, err := s.Claim(bg, sc("k"), fp)
	require.NoError(t, err)
	assert.Equal(t, dedupe.Owned, c.State)
	assert.Equal(t, fp, c.Holder)
	inflight := s.Stats().Bytes
	assert.Positive(t, inflight)
	assert.Equal(t, dedupe.MemoryStats{Entries: 1, InFlight: 1, Identities: 1, Bytes: inflight}, s.Stats())

	// A duplicate, even of another request, sees it in flight with its holder.
	other := fingerprint("/p.S/Refund", "x")
	dup, err := s.Claim(bg, sc("k"), other)
	require.NoError(t, err)
	assert.Equal(t, dedupe.InFlight, dup.State)
	assert.Equal(t, fp, dup.Holder)

	rec := okRecord(fp, "resp")
	require.NoError(t, s.Complete(bg, c, rec))
	done, err := s.Claim(bg, sc("k"), fp)
	require.NoError(t, err)
	assert.Equal(t, dedupe.Done, done.State)
	assert.Equal(t, fp, done.Holder)
	assert.Same(t, rec, done.Record)
	st := s.Stats()
	assert.Equal(t, 1, st.Entries)
	assert.Zero(t, st.InFlight)
	assert.Equal(t, inflight+rec.Size()-emptyRecord, st.Bytes, "an entry in flight counts an empty record")

	// The claim is finished: it cannot be completed or released again.
	assert.Equal(t, codes.Internal, status.Code(s.Complete(bg, c, rec)))
	assert.Equal(t, codes.Internal, status.Code(s.Release(bg, c)))
	// Only owned claims of this store complete.
	assert.Equal(t, codes.Internal, status.Code(s.Complete(bg, done, rec)))
	assert.Equal(t, codes.Internal, status.Code(s.Release(bg, dedupe.Claim{State: dedupe.Owned, Token: "x"})))
	c2, err := dedupe.NewMemoryStore(dedupe.MemoryConfig{}).Claim(bg, sc("k2"), fp)
	require.NoError(t, err)
	assert.Equal(t, codes.Internal, status.Code(s.Complete(bg, c2, rec)))
	_, err = s.Wait(bg, c2)
	assert.Equal(t, codes.Internal, status.Code(err))
}

func TestMemoryStoreCompleteChecksRecord(t *testing.T) {
	s := dedupe.NewMemoryStore(dedupe.MemoryConfig{})
	fp := fingerprint("/p.S/Charge", "req")
	c, err := s.Claim(bg, sc("k"), fp)
	require.NoError(t, err)
	assert.Equal(t, codes.Internal, status.Code(s.Complete(bg, c, nil)))
	assert.Equal(t, codes.Internal, status.Code(s.Complete(bg, c, okRecord(fingerprint("/p.S/Charge", "other"), "x"))))
	// Still owned: it can be released.
	require.NoError(t, s.Release(bg, c))
	assert.Equal(t, dedupe.MemoryStats{}, s.Stats())
}

func TestMemoryStoreRelease(t *testing.T) {
	s := dedupe.NewMemoryStore(dedupe.MemoryConfig{})
	fp := fingerprint("/p.S/Charge", "req")
	c, err := s.Claim(bg, sc("k"), fp)
	require.NoError(t, err)
	require.NoError(t, s.Release(bg, c))
	assert.Equal(t, dedupe.MemoryStats{}, s.Stats())
	// The next attempt owns it again.
	c, err = s.Claim(bg, sc("k"), fp)
	require.NoError(t, err)
	assert.Equal(t, dedupe.Owned, c.State)
}

func TestMemoryStoreWait(t *testing.T) {
	s := dedupe.NewMemoryStore(dedupe.MemoryConfig{})
	fp := fingerprint("/p.S/Charge", "req")

	t.Run("completed", func(t *testing.T) {
		owner, err := s.Claim(bg, sc("done"), fp)
		require.NoError(t, err)
		dup, err := s.Claim(bg, sc("done"), fp)
		require.NoError(t, err)
		got := make(chan *dedupe.Record)
		go func() {
			rec, err := s.Wait(bg, dup)
			assert.NoError(t, err)
			got <- rec
		}()
		rec := okRecord(fp, "r")
		require.NoError(t, s.Complete(bg, owner, rec))
		assert.Same(t, rec, <-got)
		// Waiting again on a finished execution returns at once.
		again, err := s.Wait(bg, dup)
		require.NoError(t, err)
		assert.Same(t, rec, again)
	})
	t.Run("released", func(t *testing.T) {
		owner, err := s.Claim(bg, sc("rel"), fp)
		require.NoError(t, err)
		dup, err := s.Claim(bg, sc("rel"), fp)
		require.NoError(t, err)
		got := make(chan *dedupe.Record)
		go func() {
			rec, err := s.Wait(bg, dup)
			assert.NoError(t, err)
			got <- rec
		}()
		require.NoError(t, s.Release(bg, owner))
		assert.Nil(t, <-got)
	})
	t.Run("context", func(t *testing.T) {
		owner, err := s.Claim(bg, sc("ctx"), fp)
		require.NoError(t, err)
		dup, err := s.Claim(bg, sc("ctx"), fp)
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(bg)
		cancel()
		_, err = s.Wait(ctx, dup)
		assert.Equal(t, codes.Canceled, status.Code(err))
		dctx, dcancel := context.WithDeadline(bg, time.Now().Add(-time.Second))
		defer dcancel()
		_, err = s.Wait(dctx, dup)
		assert.Equal(t, codes.DeadlineExceeded, status.Code(err))
		require.NoError(t, s.Release(bg, owner))
	})
	t.Run("record survives eviction", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) { // time passes when the test sleeps
			small := dedupe.NewMemoryStore(dedupe.MemoryConfig{MaxEntries: 1})
			owner, err := small.Claim(bg, sc("a"), fp)
			require.NoError(t, err)
			dup, err := small.Claim(bg, sc("a"), fp)
			require.NoError(t, err)
			rec := okRecord(fp, "r")
			require.NoError(t, small.Complete(bg, owner, rec))
			time.Sleep(pastHorizon)
			claimComplete(t, small, "b", fp, "evicts a") // a is gone from the map
			assert.Equal(t, uint64(1), small.Stats().Evictions)
			got, err := small.Wait(bg, dup)
			require.NoError(t, err)
			assert.Same(t, rec, got)
		})
	})
}

func TestMemoryStoreConcurrentClaimOneOwner(t *testing.T) {
	s := dedupe.NewMemoryStore(dedupe.MemoryConfig{})
	fp := fingerprint("/p.S/Charge", "req")
	var wg sync.WaitGroup
	var mu sync.Mutex
	states := map[dedupe.ClaimState]int{}
	for range 50 {
		wg.Go(func() {
			c, err := s.Claim(bg, sc("k"), fp)
			assert.NoError(t, err)
			mu.Lock()
			states[c.State]++
			mu.Unlock()
		})
	}
	wg.Wait()
	assert.Equal(t, map[dedupe.ClaimState]int{dedupe.Owned: 1, dedupe.InFlight: 49}, states)
}

func TestMemoryStoreTTL(t *testing.T) {
	synctest.Test(t, func(t *testing.T) { // time passes when the test sleeps
		s := dedupe.NewMemoryStore(dedupe.MemoryConfig{TTL: time.Hour})
		fp := fingerprint("/p.S/Charge", "req")
		claimComplete(t, s, "a", fp, "r")
		time.Sleep(30 * time.Minute)
		claimComplete(t, s, "b", fp, "r")

		// A hit at 59m59s does not extend the TTL.
		time.Sleep(29*time.Minute + 59*time.Second)
		c, err := s.Claim(bg, sc("a"), fp)
		require.NoError(t, err)
		assert.Equal(t, dedupe.Done, c.State)

		time.Sleep(time.Second) // a is exactly TTL old
		c, err = s.Claim(bg, sc("a"), fp)
		require.NoError(t, err)
		assert.Equal(t, dedupe.Owned, c.State, "expired: first sight again")
		require.NoError(t, s.Release(bg, c))
		st := s.Stats()
		assert.Equal(t, uint64(1), st.Expirations)
		assert.Equal(t, 1, st.Entries)

		// Expiry is lazy but complete: claiming any key drops b once it is old.
		time.Sleep(30 * time.Minute)
		c, err = s.Claim(bg, sc("z"), fp)
		require.NoError(t, err)
		require.NoError(t, s.Release(bg, c))
		assert.Equal(t, dedupe.MemoryStats{Expirations: 2}, s.Stats())
	})
}

func TestMemoryStoreEvictsOldestFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) { // time passes when the test sleeps
		s := dedupe.NewMemoryStore(dedupe.MemoryConfig{MaxEntries: 3, MaxEntriesPerIdentity: 3})
		fp := fingerprint("/p.S/Charge", "req")
		for _, k := range []string{"a", "b", "c"} {
			claimComplete(t, s, k, fp, k)
			time.Sleep(time.Second)
		}
		c, err := s.Claim(bg, sc("a"), fp) // a hit does not make a younger
		require.NoError(t, err)
		require.Equal(t, dedupe.Done, c.State)

		time.Sleep(pastHorizon)
		claimComplete(t, s, "d", fp, "d") // evicts a, the oldest
		state := func(k string) dedupe.ClaimState {
			c, err := s.Claim(bg, sc(k), fp)
			require.NoError(t, err)
			if c.State == dedupe.Owned {
				require.NoError(t, s.Release(bg, c))
			}
			return c.State
		}
		assert.Equal(t, dedupe.Done, state("b"))
		assert.Equal(t, dedupe.Done, state("c"))
		assert.Equal(t, dedupe.Done, state("d"))
		assert.Equal(t, dedupe.Owned, state("a"))
		assert.Equal(t, uint64(2), s.Stats().Evictions) // a for d, then b (now the oldest) for the probe of a
	})
}

func TestMemoryStoreInFlightNeverEvicted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) { // time passes when the test sleeps
		s := dedupe.NewMemoryStore(dedupe.MemoryConfig{MaxEntries: 2, MaxEntriesPerIdentity: 2})
		fp := fingerprint("/p.S/Charge", "req")
		a, err := s.Claim(bg, sc("a"), fp)
		require.NoError(t, err)
		b, err := s.Claim(bg, sc("b"), fp)
		require.NoError(t, err)

		_, err = s.Claim(bg, sc("c"), fp)
		assert.Equal(t, codes.ResourceExhausted, status.Code(err))
		st := s.Stats()
		assert.Equal(t, dedupe.MemoryStats{Entries: 2, InFlight: 2, Identities: 1, Bytes: st.Bytes, OverQuota: 1}, st)

		// Once a completes and is past the retry horizon, it is the one
		// evicted for c; b stays in flight.
		require.NoError(t, s.Complete(bg, a, okRecord(fp, "a")))
		time.Sleep(pastHorizon)
		c, err := s.Claim(bg, sc("c"), fp)
		require.NoError(t, err)
		assert.Equal(t, dedupe.Owned, c.State)
		dup, err := s.Claim(bg, sc("b"), fp)
		require.NoError(t, err)
		assert.Equal(t, dedupe.InFlight, dup.State)
		require.NoError(t, s.Complete(bg, b, okRecord(fp, "b")))
		require.NoError(t, s.Release(bg, c))
	})
}

func TestMemoryStoreBytesBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) { // time passes when the test sleeps
		const maxBytes = 8 << 10
		s := dedupe.NewMemoryStore(dedupe.MemoryConfig{MaxBytes: maxBytes, MaxBytesPerIdentity: maxBytes})
		fp := fingerprint("/p.S/Charge", "req")
		big := string(make([]byte, 1500))
		for i := range 100 {
			claimComplete(t, s, strconv.Itoa(i), fp, big)
			time.Sleep(pastHorizon) // every record is older than the retry horizon by the next claim
			st := s.Stats()
			require.LessOrEqual(t, st.Bytes, int64(maxBytes))
		}
		st := s.Stats()
		assert.Greater(t, st.Evictions, uint64(90))
		assert.Zero(t, st.Oversized)
		assert.Equal(t, 100-int(st.Evictions), st.Entries)
	})
}

func TestMemoryStoreOversizedRecord(t *testing.T) {
	const maxBytes = 4 << 10
	s := dedupe.NewMemoryStore(dedupe.MemoryConfig{MaxBytes: maxBytes, MaxBytesPerIdentity: maxBytes})
	fp := fingerprint("/p.S/Charge", "req")
	claimComplete(t, s, "small", fp, "ok")

	c, err := s.Claim(bg, sc("huge"), fp)
	require.NoError(t, err)
	require.NoError(t, s.Complete(bg, c, okRecord(fp, string(make([]byte, maxBytes)))))
	st := s.Stats()
	assert.Equal(t, uint64(1), st.Oversized)
	assert.Zero(t, st.Evictions, "a record that cannot fit does not evict others")
	assert.LessOrEqual(t, st.Bytes, int64(maxBytes))

	// The key is not free again: the request ran; its replay is a tombstone.
	c, err = s.Claim(bg, sc("huge"), fp)
	require.NoError(t, err)
	require.Equal(t, dedupe.Done, c.State)
	assert.Equal(t, codes.Internal, c.Record.Code)
	assert.Contains(t, c.Record.Message, "too large")
	assert.Empty(t, c.Record.Response)
	assert.Equal(t, fp, c.Record.Fingerprint)
}

func TestMemoryStoreRecordDoesNotFitBesideInFlight(t *testing.T) {
	fp := fingerprint("/p.S/Charge", "req")
	// What two entries in flight hold, measured on a store like it.
	probe := dedupe.NewMemoryStore(dedupe.MemoryConfig{})
	for _, k := range []string{"a", "b"} {
		_, err := probe.Claim(bg, sc(k), fp)
		require.NoError(t, err)
	}
	inflight := probe.Stats().Bytes
	s := dedupe.NewMemoryStore(dedupe.MemoryConfig{MaxBytes: inflight + 100, MaxBytesPerIdentity: inflight + 100})
	a, err := s.Claim(bg, sc("a"), fp)
	require.NoError(t, err)
	b, err := s.Claim(bg, sc("b"), fp)
	require.NoError(t, err)
	// 150 bytes (160 allocated) would fit alone, not beside b, which is
	// never evicted; 90 (96 allocated) fit.
	require.Equal(t, inflight, s.Stats().Bytes)
	require.NoError(t, s.Complete(bg, a, &dedupe.Record{Fingerprint: fp, Response: make([]byte, 150)}))
	assert.Equal(t, uint64(1), s.Stats().Oversized)
	ok := &dedupe.Record{Fingerprint: fp, Response: make([]byte, 90)}
	require.NoError(t, s.Complete(bg, b, ok))
	st := s.Stats()
	assert.Equal(t, uint64(1), st.Oversized)
	assert.Equal(t, inflight+ok.Size()-emptyRecord, st.Bytes)
}

// TestMemoryStoreFlood sends 100k unique keys into a store bounded at 10k
// entries (and, in the second case, at fewer bytes than 10k records take)
// and checks the bounds after every operation.
func TestMemoryStoreFlood(t *testing.T) {
	for _, tc := range []struct {
		name     string
		maxBytes int64
	}{
		{"entries bound", 0},
		{"bytes bound", 2 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const keys, maxEntries, workers = 100_000, 10_000, 8
			// No record is protected by a retry horizon, so that the
			// flood evicts rather than waits; the TTL is longer than the
			// flood.
			s := dedupe.NewMemoryStore(dedupe.MemoryConfig{
				MaxEntries: maxEntries, MaxBytes: tc.maxBytes, MaxEntriesPerIdentity: maxEntries, MaxBytesPerIdentity: tc.maxBytes,
				TTL: 1000 * 24 * time.Hour, RetryHorizon: -1,
			})
			maxBytes := tc.maxBytes
			if maxBytes == 0 {
				maxBytes = dedupe.DefaultMaxBytes
			}
			fp := fingerprint("/echo.v1.EchoService/Charge", "req")
			var wg sync.WaitGroup
			for w := range workers {
				wg.Go(func() {
					for i := w; i < keys; i += workers {
						key := idempotency.NewKey()
						c, err := s.Claim(bg, sc(key), fp)
						if err != nil || c.State != dedupe.Owned {
							t.Errorf("claim %d: %v %v", i, c.State, err)
							return
						}
						rec := okRecord(fp, string(make([]byte, 100+i%200)))
						if err := s.Complete(bg, c, rec); err != nil {
							t.Error(err)
							return
						}
						if st := s.Stats(); st.Entries > maxEntries || st.Bytes > maxBytes || st.InFlight > workers {
							t.Errorf("after %d keys: %+v", i, st)
							return
						}
					}
				})
			}
			wg.Wait()
			st := s.Stats()
			t.Logf("%+v", st)
			assert.Zero(t, st.InFlight)
			assert.Zero(t, st.Oversized)
			assert.Equal(t, uint64(keys-st.Entries), st.Evictions)
			if tc.maxBytes == 0 {
				assert.Equal(t, maxEntries, st.Entries)
			} else {
				assert.Less(t, st.Entries, maxEntries)
				assert.Greater(t, st.Bytes, maxBytes-4096, "full, within about a record")
			}
		})
	}
}

func TestClaimStateString(t *testing.T) {
	assert.Equal(t, "OWNED", dedupe.Owned.String())
	assert.Equal(t, "IN_FLIGHT", dedupe.InFlight.String())
	assert.Equal(t, "DONE", dedupe.Done.String())
	assert.Equal(t, "ClaimState(7)", dedupe.ClaimState(7).String())
}

// emptyRecord is what a Record holds with nothing in it.
var emptyRecord = (&dedupe.Record{}).Size()

// Record.Size counts every part of a record; size_test.go checks the
// totals against the heap.
func TestRecordSize(t *testing.T) {
	assert.Positive(t, emptyRecord)
	parts := map[string]*dedupe.Record{
		"response": {Response: make([]byte, 10)},
		"message":  {Message: "abc"},
		"header":   {Header: metadata.Pairs("k", "vv")},
		"trailer":  {Trailer: metadata.Pairs("kk", "v", "kk", "w")},
		"details":  {Details: []*anypb.Any{{TypeUrl: "type.googleapis.com/google.protobuf.StringValue", Value: []byte("x")}}},
		"stream":   {Responses: [][]byte{make([]byte, 10), nil, make([]byte, 5)}},
	}
	all := &dedupe.Record{}
	sum := emptyRecord
	for name, r := range parts {
		size := r.Size()
		assert.Greater(t, size, emptyRecord, name)
		sum += size - emptyRecord
		all.Response, all.Message = append(all.Response, r.Response...), all.Message+r.Message
		all.Header, all.Trailer = metadata.Join(all.Header, r.Header), metadata.Join(all.Trailer, r.Trailer)
		all.Details, all.Responses = append(all.Details, r.Details...), append(all.Responses, r.Responses...)
	}
	assert.Equal(t, sum, all.Size(), "the parts add up")
	// A metadata map is not just its strings: a map of one pair holds a
	// group of 8 slots.
	assert.Greater(t, parts["header"].Size()-emptyRecord, int64(300))
	// The allocator's rounding is counted: 10 bytes take 16.
	assert.Equal(t, int64(16), parts["response"].Size()-emptyRecord)
}

func TestRecordSizeCountsStreamResponses(t *testing.T) {
	r := &dedupe.Record{Responses: [][]byte{make([]byte, 10), nil, make([]byte, 5)}, Message: "ab"}
	// Three slice headers (72 bytes, 80 allocated), 16 + 8 bytes of
	// responses, 8 of message.
	assert.Equal(t, emptyRecord+80+16+8+8, r.Size())

	// A MemoryStore counts them against its bounds like any other bytes.
	m := dedupe.NewMemoryStore(dedupe.MemoryConfig{})
	fp := dedupe.Fingerprint{Method: "/p.S/M"}
	c, err := m.Claim(context.Background(), sc("k"), fp)
	require.NoError(t, err)
	inflight := m.Stats().Bytes
	r.Fingerprint = fp
	require.NoError(t, m.Complete(context.Background(), c, r))
	assert.Equal(t, inflight+r.Size()-emptyRecord, m.Stats().Bytes)
}

// retryAfter returns the RetryInfo delay of a refused claim.
func retryAfter(t *testing.T, err error) time.Duration {
	t.Helper()
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration()
		}
	}
	t.Fatalf("no RetryInfo in %v", err)
	return 0
}

// One identity never evicts another's records within the retry horizon:
// it is held to its share, and a store full of young records refuses new
// claims rather than evicting one.
func TestMemoryStoreProtectsYoungRecordsAcrossIdentities(t *testing.T) {
	synctest.Test(t, func(t *testing.T) { // time passes when the test sleeps
		s := dedupe.NewMemoryStore(dedupe.MemoryConfig{MaxEntries: 8, MaxEntriesPerIdentity: 2})
		fp := fingerprint("/p.S/Charge", "req")
		as := func(who, key string) dedupe.Scope { return dedupe.Scope{Identity: who, Key: key} }
		complete := func(who, key string) {
			t.Helper()
			c, err := s.Claim(bg, as(who, key), fp)
			require.NoError(t, err)
			require.Equal(t, dedupe.Owned, c.State)
			require.NoError(t, s.Complete(bg, c, okRecord(fp, who+key)))
		}
		state := func(who, key string) dedupe.ClaimState {
			t.Helper()
			c, err := s.Claim(bg, as(who, key), fp)
			require.NoError(t, err)
			if c.State == dedupe.Owned {
				require.NoError(t, s.Release(bg, c))
			}
			return c.State
		}

		complete("y", "y1")
		time.Sleep(10 * time.Second)
		complete("x", "x1")
		complete("x", "x2")
		// X holds its share in young records: X is refused, Y is not touched.
		_, err := s.Claim(bg, as("x", "x3"), fp)
		assert.Equal(t, dedupe.DefaultRetryHorizon, retryAfter(t, err))
		assert.Equal(t, uint64(1), s.Stats().OverQuota)

		// Fill the store with young records of other identities.
		complete("y", "y2")
		for _, who := range []string{"a", "b"} {
			complete(who, "1")
			complete(who, "2")
		}
		require.Equal(t, 8, s.Stats().Entries)
		_, err = s.Claim(bg, as("c", "1"), fp)
		assert.Equal(t, dedupe.DefaultRetryHorizon-10*time.Second, retryAfter(t, err), "until y1 is old enough")
		assert.Equal(t, uint64(1), s.Stats().Busy)
		assert.Zero(t, s.Stats().Evictions)

		// Past y1's horizon (not the others'): c's claim evicts y1, the oldest.
		time.Sleep(dedupe.DefaultRetryHorizon - 10*time.Second)
		c, err := s.Claim(bg, as("c", "1"), fp)
		require.NoError(t, err)
		require.NoError(t, s.Release(bg, c))
		assert.Equal(t, uint64(1), s.Stats().Evictions)
		assert.Equal(t, dedupe.Owned, state("y", "y1"), "evicted")
		assert.Equal(t, dedupe.Done, state("y", "y2"))

		// Past every horizon: X at its share evicts its own oldest record,
		// never another identity's.
		time.Sleep(dedupe.DefaultRetryHorizon)
		complete("x", "x3")
		for _, k := range [][2]string{{"x", "x2"}, {"x", "x3"}, {"y", "y2"}, {"a", "1"}, {"a", "2"}, {"b", "1"}, {"b", "2"}} {
			assert.Equal(t, dedupe.Done, state(k[0], k[1]), "%v", k)
		}
		assert.Equal(t, dedupe.Owned, state("x", "x1"), "x's own oldest made room")
	})
}

// TestMemoryStoreCountsRefusalsOnly: Busy and OverQuota count claims the
// store refused, and nothing else. Three callers make 60 keyed Charges
// whose 60 KiB receipts soon fill each caller's share (100 KiB) and the
// store (160 KiB) with records younger than the retry horizon: every call
// is answered OK (a claim always finds room; a record that does not fit is
// kept as a tombstone), so nothing was refused, and only Oversized counts
// the tombstones.
func TestMemoryStoreCountsRefusalsOnly(t *testing.T) {
	receipt := strings.Repeat("r", 60<<10)
	o := origin.New(func(origin.Call) origin.Reply { return origin.Reply{Trailer: metadata.Pairs("x-receipt", receipt)} })
	// On the real clock: the test lasts far less than the retry horizon
	// (a minute), so every record stays younger than it.
	store := dedupe.NewMemoryStore(dedupe.MemoryConfig{MaxBytes: 160 << 10, MaxBytesPerIdentity: 100 << 10})
	s := dedupe.NewServer(dedupe.Config{Store: store, Identity: func(ctx context.Context) string {
		md, _ := metadata.FromIncomingContext(ctx)
		return strings.Join(md.Get("x-caller"), "")
	}})
	c := startEcho(t, o, dedupeOpts(s))
	for i := range 60 {
		ctx := metadata.AppendToOutgoingContext(keyed(t.Context(), "order-"+strconv.Itoa(i)), "x-caller", "caller-"+strconv.Itoa(i%3))
		_, err := c.Charge(ctx, &echov1.ChargeRequest{RequestId: "order-" + strconv.Itoa(i)})
		require.NoError(t, err, "call %d", i)
	}
	st := store.Stats()
	t.Logf("%+v", st)
	require.Equal(t, uint64(60), s.Stats().Misses, "every call ran once")
	require.Positive(t, st.Oversized, "records were kept as tombstones")
	assert.Equal(t, uint64(60), uint64(st.Entries)+st.Evictions, "every key kept or evicted")
	assert.Zero(t, st.Busy, "no claim was refused for the store's bounds")
	assert.Zero(t, st.OverQuota, "no claim was refused for a caller's share")
	assert.Zero(t, s.Stats().Full)

	// A claim refused counts: another caller's claims in flight fill
	// what room is left.
	refused := 0
	for i := 0; refused == 0 && i < 1000; i++ {
		_, err := store.Claim(bg, dedupe.Scope{Identity: "dave", Key: strconv.Itoa(i)}, fingerprint(chargeMethod, "r"))
		if err != nil {
			require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
			refused++
		}
	}
	require.Equal(t, 1, refused, "the store filled up")
	assert.Equal(t, uint64(1), store.Stats().Busy, "the refused claim")
	assert.Zero(t, store.Stats().OverQuota)
}
