package interceptor_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
	"github.com/stormguard/stormguard/overload"
	"github.com/stormguard/stormguard/priority"
	"github.com/stormguard/stormguard/semconv"
)

// chain is caller → hop (served behind interceptor.NewServer(opts...),
// calling on through a suite Client) → origin, all over bufconn. The
// caller is a plain grpc client, so the header it sends is the test's.
type chain struct {
	origin *origin.Origin
	hop    *origin.Hop
	top    echov1.EchoServiceClient
}

func newChain(t *testing.T, opts ...interceptor.ServerOption) *chain {
	t.Helper()
	c := &chain{origin: origin.New(origin.Succeed())}
	ol := origin.Bufconn()
	osrv := origin.Serve(ol, c.origin)
	guard := interceptor.NewClient()
	occ, err := ol.Dial(grpc.WithChainUnaryInterceptor(guard.Unary()), grpc.WithChainStreamInterceptor(guard.Stream()))
	require.NoError(t, err)
	c.hop = &origin.Hop{Next: echov1.NewEchoServiceClient(occ)}
	s := interceptor.NewServer(opts...)
	hl := origin.Bufconn()
	hsrv := origin.Serve(hl, c.hop, grpc.ChainUnaryInterceptor(s.Unary()), grpc.ChainStreamInterceptor(s.Stream()))
	hcc, err := hl.Dial()
	require.NoError(t, err)
	c.top = echov1.NewEchoServiceClient(hcc)
	t.Cleanup(func() { hcc.Close(); hsrv.Stop(); occ.Close(); osrv.Stop() })
	return c
}

// put sends a Put with the given stormguard-priority values (none: no
// header) and returns what reached the origin.
func (c *chain) put(t *testing.T, values ...string) []string {
	t.Helper()
	c.origin.Reset()
	ctx := t.Context()
	for _, v := range values {
		ctx = metadata.AppendToOutgoingContext(ctx, semconv.PriorityKey, v)
	}
	_, err := c.top.Put(ctx, &echov1.PutRequest{RequestId: "c"})
	require.NoError(t, err)
	calls := c.origin.Calls()
	require.Len(t, calls, 1)
	return calls[0].Metadata.Get(semconv.PriorityKey)
}

// list opens a List stream with the given stormguard-priority values
// and returns what reached the origin.
func (c *chain) list(t *testing.T, values ...string) []string {
	t.Helper()
	c.origin.Reset()
	ctx := t.Context()
	for _, v := range values {
		ctx = metadata.AppendToOutgoingContext(ctx, semconv.PriorityKey, v)
	}
	s, err := c.top.List(ctx, &echov1.ListRequest{RequestId: "l", Count: 1})
	require.NoError(t, err)
	for {
		if _, err := s.Recv(); err != nil {
			break
		}
	}
	calls := c.origin.Calls()
	require.Len(t, calls, 1)
	return calls[0].Metadata.Get(semconv.PriorityKey)
}

// TestPriorityIsInheritedDownTheChain: a handler served by the suite's
// Server passes the priority it honours to the calls it makes, unless it
// sets one; a header it cannot read is Default, which sends none.
func TestPriorityIsInheritedDownTheChain(t *testing.T) {
	c := newChain(t)
	assert.Equal(t, []string{"critical"}, c.put(t, "critical"))
	assert.Equal(t, []string{"sheddable"}, c.put(t, "Sheddable"))
	assert.Nil(t, c.put(t), "no header: Default, and none sent on")
	assert.Nil(t, c.put(t, "default"))
	assert.Nil(t, c.put(t, "urgent"), "an unknown value is Default")
	assert.Nil(t, c.put(t, "critical", "critical"), "two values are Default")
	assert.Equal(t, []string{"critical"}, c.list(t, "critical"), "a stream handler's calls inherit it too")
	assert.Nil(t, c.list(t))

	// A hop that sets a priority of its own sends it, whatever its caller's.
	set := priority.Sheddable
	c.hop.Fresh = func(ctx context.Context) (context.Context, context.CancelFunc) {
		return priority.NewContext(ctx, set), func() {}
	}
	assert.Equal(t, []string{"sheddable"}, c.put(t, "critical"))
	set = priority.Default
	assert.Nil(t, c.put(t, "critical"))
}

// TestPriorityCap: a server that honours at most Default from its callers
// neither sheds a claimed critical call last nor passes the claim on; one
// that caps at Sheddable makes every call it serves sheddable, its
// outgoing calls included.
func TestPriorityCap(t *testing.T) {
	var mu sync.Mutex
	var seen []metadata.MD
	capAt := func(p priority.Priority) func(context.Context) priority.Priority {
		return func(ctx context.Context) priority.Priority {
			md, _ := metadata.FromIncomingContext(ctx)
			mu.Lock()
			seen = append(seen, md)
			mu.Unlock()
			return p
		}
	}
	c := newChain(t, interceptor.WithPriorityCap(capAt(priority.Default)))
	assert.Nil(t, c.put(t, "critical"), "a critical claim lowered to Default is not passed on")
	assert.Equal(t, []string{"sheddable"}, c.put(t, "sheddable"), "a lower claim stands")
	require.Len(t, seen, 2)
	assert.Equal(t, []string{"critical"}, seen[0].Get(semconv.PriorityKey), "the cap sees the call's incoming context")

	c = newChain(t, interceptor.WithPriorityCap(capAt(priority.Sheddable)))
	assert.Equal(t, []string{"sheddable"}, c.put(t))
	assert.Equal(t, []string{"sheddable"}, c.put(t, "critical"))

	c = newChain(t, interceptor.WithPriorityCap(nil))
	assert.Equal(t, []string{"critical"}, c.put(t, "critical"), "nil: every claim honoured")
}

// TestServerShedsByPriority: at a limit of 4 in flight (MaxConcurrency),
// over real gRPC, the server sheds a sheddable call from 1 in flight, a
// default one at 4, and a critical one only when 4 critical calls are in
// flight; with WithPriorityCap(Default), critical is shed as default.
func TestServerShedsByPriority(t *testing.T) {
	for _, capped := range []bool{false, true} {
		release, arrived := make(chan struct{}), make(chan struct{}, 16)
		o := origin.New(blocking(release, arrived))
		opts := []interceptor.ServerOption{interceptor.WithOverload(overload.New(overload.Config{
			NoAdmission: true, NoAdaptive: true, MaxConcurrency: 4,
		}))}
		if capped {
			opts = append(opts, interceptor.WithPriorityCap(func(context.Context) priority.Priority { return priority.Default }))
		}
		echo, _, _ := guarded(t, o, opts...)
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		var wg sync.WaitGroup
		with := func(p string) context.Context {
			return metadata.AppendToOutgoingContext(ctx, semconv.PriorityKey, p)
		}
		hold := func(c context.Context) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := echo.Put(c, &echov1.PutRequest{RequestId: "held"})
				assert.NoError(t, err)
			}()
			<-arrived
		}
		shed := func(c context.Context, what string) {
			t.Helper()
			var tr metadata.MD
			_, err := echo.Put(c, &echov1.PutRequest{RequestId: "shed"}, grpc.Trailer(&tr))
			require.Equal(t, codes.Unavailable, status.Code(err), "capped %v: %s", capped, what)
			info := errorInfo(err)
			require.NotNil(t, info)
			assert.Equal(t, semconv.ErrorReasonOverloaded, info.GetReason())
			assert.Equal(t, "first", info.GetMetadata()["attempt"])
			assert.Equal(t, []string{"100"}, tr.Get(semconv.PushbackKey))
		}
		hold(with("sheddable"))
		if !capped {
			shed(with("sheddable"), "a sheddable call at 1 in flight")
		}
		for range 3 {
			hold(ctx)
		}
		shed(ctx, "a default call at 4")
		if capped {
			shed(with("critical"), "a critical call capped to default at 4")
		} else {
			for range 4 {
				hold(with("critical"))
			}
			shed(with("critical"), "a critical call at 4 critical in flight")
		}
		close(release)
		wg.Wait()
		cancel()
	}
}
