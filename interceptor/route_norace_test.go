//go:build !race

package interceptor_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"google.golang.org/grpc"

	"github.com/stormguard/stormguard/interceptor"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// liveHeap returns the bytes of live heap objects, after a full collection,
// and the bytes allocated so far.
func liveHeap() (live, total uint64) {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc, m.TotalAlloc
}

// What a route costs: a Client that sees 10,000 method names (the most it
// keeps routes for), as a proxy forwarding caller-chosen names does, each
// called once and answered OK. A route holds only what its calls needed:
// the metrics of the methods the protobuf registry does not know are one
// set per target (their attributes say "_OTHER"), a breaker keeps no
// window until its method's first failure, and the rest (other codes'
// metric options, retries' and hedges' options, the hedging latency) is
// made when a call needs it. It held 3,280 bytes per route (+31 MiB), and
// each new route allocated 6,030 bytes; now about 1,130 and 2,500. This
// test judges heap size, so it does not run under the race detector; CI
// runs it without -race.
func TestARouteCostsWhatItsCallsNeeded(t *testing.T) {
	names := make([]string, interceptor.MaxRoutes)
	for i := range names {
		names[i] = fmt.Sprintf("/proxy.v1.Any/M%d", i)
	}
	cc := dialPassthrough(t)
	ok := func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error { return nil }
	live0, total0 := liveHeap()
	c := interceptor.NewClient()
	ic := c.Unary()
	var first, last time.Duration
	for i, n := range names {
		start := time.Now()
		_ = ic(t.Context(), n, &echov1.PutRequest{}, &echov1.PutResponse{}, cc, ok)
		switch d := time.Since(start); {
		case i < 1000:
			first += d
		case i >= len(names)-1000:
			last += d
		}
	}
	live1, total1 := liveHeap()
	runtime.KeepAlive(c)
	perRoute := float64(live1-live0) / float64(len(names))
	allocated := float64(total1-total0) / float64(len(names))
	t.Logf("heap +%.1f MiB: %.0f bytes per route; %.0f bytes allocated per new route; the first 1,000 calls took %v, the last 1,000 %v",
		float64(live1-live0)/(1<<20), perRoute, allocated, first, last)
	assert.LessOrEqual(t, perRoute, 1500.0, "bytes held per route")
	assert.LessOrEqual(t, allocated, 3000.0, "bytes allocated per new route")
}
