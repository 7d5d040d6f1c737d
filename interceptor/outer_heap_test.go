//go:build !race

// The race detector changes what allocations cost; this test measures the
// heap, so it runs without it:
//
//	go test -count=1 -run 'TestOuterLoopMemory' ./interceptor/

package interceptor_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// What the Client remembers of failed calls holds a bounded status, not
// whatever the server sent: 1,500 failed calls, each with a context that
// lives on and a 64 KiB status message, hold under 1 KiB each.
func TestOuterLoopMemoryOfFailedCalls(t *testing.T) {
	big := strings.Repeat("x", 64<<10)
	o := origin.New(func(origin.Call) origin.Reply { return origin.Reply{Code: codes.Unavailable, Message: big} })
	l := origin.Bufconn()
	srv := origin.Serve(l, o)
	defer srv.Stop()
	guard := interceptor.NewClient(append(noopProviders(), interceptor.WithBreaker(nil))...)
	cc, err := l.Dial(guard.DialOptions()...)
	require.NoError(t, err)
	defer cc.Close()
	echo := echov1.NewEchoServiceClient(cc)
	const n = 1_500
	ctxs := make([]context.Context, n) // alive: their calls stay remembered
	for i := range n {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		ctxs[i] = ctx
		_, err := echo.Put(ctx, &echov1.PutRequest{RequestId: fmt.Sprint(i)}, grpc.MaxCallRecvMsgSize(1<<20))
		require.Equal(t, codes.Unavailable, status.Code(err))
	}
	remembered, bytes := interceptor.Remembered(guard)
	require.Equal(t, n, remembered)
	heap := heapAlloc()
	interceptor.ForgetAll(guard)
	retained := heap - heapAlloc()
	runtime.KeepAlive(ctxs)
	t.Logf("%d failed calls remembered: %d bytes counted, %d bytes of heap retained (%d per call)", remembered, bytes, retained, retained/n)
	assert.Less(t, retained, int64(n<<10), "under 1 KiB per remembered call")
}

func heapAlloc() int64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}
