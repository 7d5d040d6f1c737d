//go:build !race

// The race detector changes what allocations cost; these tests measure the
// heap, so they run without it:
//
//	go test -count=1 -run 'TestMemoryStoreCounts|TestMemoryStoreHeap' ./idempotency/dedupe/

package dedupe_test

import (
	"context"
	"errors"
	"io"
	"runtime"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/stormguard/stormguard/idempotency/dedupe"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// leanPayments is a payment service that keeps nothing per call, so that
// the heap a test measures is what the store holds. Its handlers answer
// as a real one might: a charge id, a session header and a receipt
// trailer, a declined charge with a detail, a listing.
type leanPayments struct {
	echov1.UnimplementedEchoServiceServer
	metadata, decline bool
}

func (p *leanPayments) Register(s grpc.ServiceRegistrar) { echov1.RegisterEchoServiceServer(s, p) }

func (p *leanPayments) Charge(ctx context.Context, req *echov1.ChargeRequest) (*echov1.ChargeResponse, error) {
	id := req.GetRequestId()
	if p.metadata {
		_ = grpc.SetHeader(ctx, metadata.Pairs("x-session", "session-"+id))
		_ = grpc.SetTrailer(ctx, metadata.Pairs("x-receipt", "receipt-"+id))
	}
	if p.decline {
		st, err := status.New(codes.FailedPrecondition, "card declined for "+id).WithDetails(wrapperspb.String("insufficient_funds"))
		if err != nil {
			return nil, err
		}
		return nil, st.Err()
	}
	return &echov1.ChargeResponse{RequestId: id, ChargeId: "ch_" + id, BalanceCents: req.GetAmountCents()}, nil
}

func (p *leanPayments) List(req *echov1.ListRequest, s grpc.ServerStreamingServer[echov1.ListResponse]) error {
	for i := range req.GetCount() {
		if err := s.Send(&echov1.ListResponse{RequestId: req.GetRequestId(), Index: i, Payload: []byte("item")}); err != nil {
			return err
		}
	}
	return nil
}

// heapAlloc returns the live heap after collecting garbage.
func heapAlloc() int64 {
	runtime.GC()
	runtime.GC() // the second also clears sync.Pool's victim cache
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// retained returns the heap s holds: the live heap with s, less the live
// heap once s is unreachable. Nothing else happens in between, so that
// other goroutines of the test process (earlier tests winding down) do
// not blur the measure. s must be referenced nowhere else.
func retained(s *dedupe.MemoryStore) (heap int64, st dedupe.MemoryStats) {
	st = s.Stats()
	with := heapAlloc()
	runtime.KeepAlive(s)
	return with - heapAlloc(), st
}

// fillStore sends n keyed calls of the kind named to a server whose
// store is s, over bufconn, then stops the server and waits until every
// goroutine the calls started has returned: one still winding down holds
// a bufconn pipe (1 MiB) that the heap measure would count as the
// store's.
func fillStore(t *testing.T, s *dedupe.MemoryStore, kind string, n int) {
	t.Helper()
	before := goleak.IgnoreCurrent()
	defer func() { require.NoError(t, goleak.Find(before), "the calls' goroutines wound down") }()
	svc := &leanPayments{metadata: kind != "plain", decline: kind == "declined"}
	dd := dedupe.NewServer(dedupe.Config{AllowAnonymous: true, Store: s, Methods: []string{listMethod}})
	l := origin.Bufconn()
	srv := origin.Serve(l, svc, dedupeOpts(dd)...)
	defer srv.Stop()
	cc, err := l.Dial()
	require.NoError(t, err)
	defer cc.Close()
	c := echov1.NewEchoServiceClient(cc)
	call := func(i int) {
		ctx := keyed(context.Background(), "3f0c8a4e-5b1d-4c8e-9a7f-"+strconv.Itoa(100000000000+i))
		id := strconv.Itoa(1_000_000 + i)
		var err error
		switch kind {
		case "stream":
			var ls grpc.ServerStreamingClient[echov1.ListResponse]
			if ls, err = c.List(ctx, &echov1.ListRequest{RequestId: id, Count: 3}); err == nil {
				for err == nil {
					_, err = ls.Recv()
				}
				if errors.Is(err, io.EOF) {
					err = nil
				}
			}
		default:
			_, err = c.Charge(ctx, &echov1.ChargeRequest{RequestId: id, Account: "acct", AmountCents: 4999})
			if kind == "declined" && status.Code(err) == codes.FailedPrecondition {
				err = nil
			}
		}
		require.NoError(t, err)
	}
	for i := range n {
		call(i)
	}
}

// TestMemoryStoreCountsWhatRecordsCost: what a MemoryStore counts against
// MaxBytes is what its records cost on the heap, within 10%, whatever the
// records hold.
func TestMemoryStoreCountsWhatRecordsCost(t *testing.T) {
	const n = 20_000
	for _, kind := range []string{"plain", "header and trailer", "declined", "stream"} {
		t.Run(kind, func(t *testing.T) {
			s := dedupe.NewMemoryStore(dedupe.MemoryConfig{MaxEntries: 2 * n, MaxEntriesPerIdentity: 2 * n, MaxBytes: 1 << 30, MaxBytesPerIdentity: 1 << 30})
			fillStore(t, s, kind, n)
			heap, st := retained(s)
			require.Equal(t, n, st.Entries)
			t.Logf("%s: heap %d B per entry, counted %d B per entry (x%.2f)", kind, heap/n, st.Bytes/n, float64(heap)/float64(st.Bytes))
			assert.InEpsilon(t, heap, st.Bytes, 0.10, "counted %d B, heap %d B", st.Bytes, heap)
		})
	}
}

// TestMemoryStoreHeapStaysWithinMaxBytes: a 16 MiB store, full, holds
// about 16 MiB of heap (counting only the bytes of keys and values, it held
// 44 MiB with records carrying one header and one trailer).
func TestMemoryStoreHeapStaysWithinMaxBytes(t *testing.T) {
	const maxBytes = 16 << 20
	s := dedupe.NewMemoryStore(dedupe.MemoryConfig{
		MaxEntries: 1 << 20, MaxEntriesPerIdentity: 1 << 20, MaxBytes: maxBytes, MaxBytesPerIdentity: maxBytes,
		// No record is protected by a retry horizon: the store evicts
		// to stay within its bounds.
		TTL: 1 << 62, RetryHorizon: -1,
	})
	fillStore(t, s, "header and trailer", 40_000)
	heap, st := retained(s)
	t.Logf("heap %.1f MiB, counted %.1f MiB, %d entries, %d evictions", float64(heap)/(1<<20), float64(st.Bytes)/(1<<20), st.Entries, st.Evictions)
	require.Positive(t, st.Evictions, "the store was full")
	assert.LessOrEqual(t, heap, int64(maxBytes*11/10))
}
