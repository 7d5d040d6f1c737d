package interceptor_test

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	"github.com/stormguard/stormguard/deadline"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// The deadline header is written by the attempt's call credentials, from
// the time left when grpc builds the headers; no metadata is added to the
// context on the success path.
func TestDeadlineHeaderFromCallCredentials(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		inv := &invoker{script: failFirstN(0)}
		ic := interceptor.NewClient(noopProviders()...).Unary()
		cc := dialPassthrough(t)
		ctx, cancel := context.WithDeadline(t.Context(), time.Now().Add(2*time.Second))
		defer cancel()
		require.NoError(t, ic(ctx, put, &echov1.PutRequest{}, &echov1.PutResponse{}, cc, inv.invoke))
		a := inv.attempts()[0]
		require.True(t, a.hasCreds)
		ms := deadline.DefaultMargin.Milliseconds()
		assert.Equal(t, fmt.Sprint(2000-ms), a.header, "2 s less the default margin (no time passes in the bubble)")
		assert.Empty(t, a.md.Get(deadline.MetadataKey))
	})
}

// The header is relative, so each hop's deadline must not land later than
// its caller's by the time in transit. With the default margin, each hop's
// deadline is its caller's less the margin (rounded down to the
// millisecond): here in a synctest bubble, on one clock shared by every
// client and server of a three-hop chain, where transit takes no time and
// only the arithmetic shows (attempt_norace_test.go measures real transit
// on loopback).
func TestEachHopsDeadlineIsItsCallersLessTheMargin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := origin.New(nil)
		srvOpts := func() []grpc.ServerOption {
			s := interceptor.NewServer(interceptor.WithDedupe(nil))
			return []grpc.ServerOption{grpc.ChainUnaryInterceptor(s.Unary())}
		}
		l := origin.Bufconn()
		defer origin.Serve(l, o, srvOpts()...).Stop()
		for range 3 {
			guard := interceptor.NewClient(noopProviders()...)
			cc, err := l.Dial(guard.DialOptions()...)
			require.NoError(t, err)
			defer cc.Close()
			next := origin.Bufconn()
			defer origin.Serve(next, &origin.Hop{Next: echov1.NewEchoServiceClient(cc)}, srvOpts()...).Stop()
			l = next
		}
		guard := interceptor.NewClient(noopProviders()...)
		cc, err := l.Dial(guard.DialOptions()...)
		require.NoError(t, err)
		defer cc.Close()
		dl := time.Now().Add(2 * time.Second)
		ctx, cancel := context.WithDeadline(t.Context(), dl)
		defer cancel()
		_, err = echov1.NewEchoServiceClient(cc).Put(ctx, &echov1.PutRequest{RequestId: "depth"})
		require.NoError(t, err)
		calls := o.Calls()
		require.Len(t, calls, 1)
		want := dl.Add(-4 * deadline.DefaultMargin) // the caller's client and three hops
		assert.Equal(t, want, calls[0].Deadline, "four margins below the caller's deadline")
	})
}

// Short deadlines: a call with 1 to 6 ms left, to a handler that answers
// at once, succeeds through the suite's client and server at least as
// often as through plain grpc-go, with the default margin and with none.
// The margin the client takes off the header never takes more than a share
// of what is left, and the header's whole milliseconds never turn time
// left into "expired" (the old client refused every one of these calls:
// with its 5 ms margin a call needed about 7 ms left, with none 2 ms).
//
// In a synctest bubble, with the time left in steps of a quarter of a
// millisecond, so that the headers' roundings are all met: on real time,
// the two kinds of call lost a few calls each to the machine's stalls, and
// with two CPU-bound processes beside the test, more than the test could
// tell from a difference between them.
func TestShortDeadlinesDoNoHarm(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  deadline.ClientConfig
	}{
		{"default margin", deadline.ClientConfig{}},
		{"no margin", deadline.ClientConfig{Margin: -1}},
	} {
		t.Run(tc.name, func(t *testing.T) { synctest.Test(t, func(t *testing.T) { shortDeadlines(t, tc.cfg) }) })
	}
}

func shortDeadlines(t *testing.T, cfg deadline.ClientConfig) {
	o := origin.New(nil)
	lp := origin.Bufconn()
	defer origin.Serve(lp, o).Stop()
	plainCC, err := lp.Dial()
	require.NoError(t, err)
	defer plainCC.Close()
	srv := interceptor.NewServer(interceptor.WithDedupe(nil))
	ls := origin.Bufconn()
	defer origin.Serve(ls, o, grpc.ChainUnaryInterceptor(srv.Unary()), grpc.ChainStreamInterceptor(srv.Stream())).Stop()
	guard := interceptor.NewClient(append(noopProviders(), interceptor.WithDeadline(cfg))...)
	suiteCC, err := ls.Dial(guard.DialOptions()...)
	require.NoError(t, err)
	defer suiteCC.Close()
	plain, suite := echov1.NewEchoServiceClient(plainCC), echov1.NewEchoServiceClient(suiteCC)
	for _, c := range []echov1.EchoServiceClient{plain, suite} { // connect
		_, err := c.Notify(t.Context(), &echov1.NotifyRequest{RequestId: "warm"})
		require.NoError(t, err)
	}
	call := func(c echov1.EchoServiceClient, left time.Duration, id string) bool {
		ctx, cancel := context.WithTimeout(t.Context(), left)
		defer cancel()
		_, err := c.Notify(ctx, &echov1.NotifyRequest{RequestId: id})
		return err == nil
	}
	var okPlain, okSuite, calls int
	for left := time.Millisecond; left <= 6*time.Millisecond; left += time.Millisecond / 4 {
		var p, s int
		for i := range 5 {
			if call(plain, left, fmt.Sprint("plain-", left, "-", i)) {
				p++
			}
			if call(suite, left, fmt.Sprint("suite-", left, "-", i)) {
				s++
			}
		}
		t.Logf("%v left: plain grpc-go %d/5 ok, the suite %d/5", left, p, s)
		okPlain, okSuite, calls = okPlain+p, okSuite+s, calls+5
	}
	assert.Equal(t, calls, okPlain, "plain grpc-go completes every call")
	assert.GreaterOrEqual(t, okSuite, okPlain, "the suite completes what plain grpc-go completes")
}
