//go:build !race

package interceptor_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// Measured on real loopback TCP: the header is relative, so each hop's
// deadline would land later than its caller's by the time in transit (1.5 ms
// over three hops, before the default margin). With the default margin no
// handler at any depth has a deadline later than the original caller's. This
// test judges real transit, so it does not run under the race detector (which
// stretched a hop to 2.5 ms on a loaded machine, and to 9 ms beside two
// CPU-burning processes); CI runs it without -race.
func TestNoDeadlineLaterThanTheCallersAtAnyDepth(t *testing.T) {
	o := origin.New(nil)
	srvOpts := func() []grpc.ServerOption {
		s := interceptor.NewServer(interceptor.WithDedupe(nil))
		return []grpc.ServerOption{grpc.ChainUnaryInterceptor(s.Unary())}
	}
	l, err := origin.TCP()
	require.NoError(t, err)
	defer origin.Serve(l, o, srvOpts()...).Stop()
	for range 3 {
		guard := interceptor.NewClient(noopProviders()...)
		cc, err := l.Dial(guard.DialOptions()...)
		require.NoError(t, err)
		defer cc.Close()
		next, err := origin.TCP()
		require.NoError(t, err)
		defer origin.Serve(next, &origin.Hop{Next: echov1.NewEchoServiceClient(cc)}, srvOpts()...).Stop()
		l = next
	}
	guard := interceptor.NewClient(noopProviders()...)
	cc, err := l.Dial(guard.DialOptions()...)
	require.NoError(t, err)
	defer cc.Close()
	top := echov1.NewEchoServiceClient(cc)
	for i := range 50 {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		dl, _ := ctx.Deadline()
		_, err := top.Put(ctx, &echov1.PutRequest{RequestId: fmt.Sprint(i)})
		cancel()
		require.NoError(t, err)
		calls := o.Calls()
		got := calls[len(calls)-1]
		require.True(t, got.HasDeadline)
		assert.False(t, got.Deadline.After(dl), "call %d: the origin's deadline is %v later than the caller's", i, got.Deadline.Sub(dl))
	}
}
