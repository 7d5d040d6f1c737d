package interceptor_test

import (
	"context"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// This file is the test machinery for windows a real connection cannot hit
// on purpose: a scripted invoker and streamer. The tests that time them run
// in a testing/synctest bubble, where time.Now and the Client's timers are
// the bubble's virtual clock: it moves only when every goroutine of the
// bubble is blocked.

// invocation is what the scripted invoker saw of one attempt.
type invocation struct {
	at       time.Time   // time.Now when it was sent (virtual in a bubble)
	md       metadata.MD // outgoing metadata
	header   string      // stormguard-deadline-ms from the attempt's call credentials
	hasCreds bool
	ctx      context.Context
}

// reply is what the scripted invoker answers to one attempt.
type reply struct {
	err     error
	trailer metadata.MD
	block   bool // wait until the attempt's context is done
	// hold, when not nil, makes the attempt wait for it to be closed (then
	// answer err) or for its context to be done.
	hold <-chan struct{}
}

// invoker is a scripted grpc.UnaryInvoker: attempt n answers script(n)
// (from 1).
type invoker struct {
	script func(n int) reply
	sent   chan int // when not nil, gets each attempt's number once it is recorded

	mu    sync.Mutex
	calls []invocation
}

func (v *invoker) invoke(ctx context.Context, _ string, _, _ any, _ *grpc.ClientConn, opts ...grpc.CallOption) error {
	in := invocation{ctx: ctx, at: time.Now()}
	in.md, _ = metadata.FromOutgoingContext(ctx)
	var tr *metadata.MD
	for _, o := range opts {
		switch o := o.(type) {
		case grpc.TrailerCallOption:
			tr = o.TrailerAddr
		case grpc.PerRPCCredsCallOption:
			// As grpc's transport does when it builds the headers.
			md, err := o.Creds.GetRequestMetadata(credentials.NewContextWithRequestInfo(ctx, credentials.RequestInfo{}))
			if err != nil {
				return err
			}
			in.hasCreds, in.header = true, md["stormguard-deadline-ms"]
		}
	}
	v.mu.Lock()
	v.calls = append(v.calls, in)
	n := len(v.calls)
	v.mu.Unlock()
	if v.sent != nil {
		v.sent <- n
	}
	r := v.script(n)
	if r.hold != nil {
		select {
		case <-r.hold:
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
	if r.block {
		<-ctx.Done()
		return status.FromContextError(ctx.Err()).Err()
	}
	if tr != nil {
		*tr = r.trailer
	}
	return r.err
}

func (v *invoker) attempts() []invocation {
	v.mu.Lock()
	defer v.mu.Unlock()
	return append([]invocation(nil), v.calls...)
}

// fakeStream is a scripted grpc.ClientStream.
type fakeStream struct {
	ctx    context.Context
	recv   chan error  // RecvMsg returns what arrives here; nil is a message
	onSend func(n int) // called after each successful SendMsg, with the count so far

	mu     sync.Mutex
	sent   []any
	closed bool
	dead   bool
}

func newFakeStream(ctx context.Context) *fakeStream {
	return &fakeStream{ctx: ctx, recv: make(chan error, 4)}
}

func (f *fakeStream) Header() (metadata.MD, error) { return nil, nil }
func (f *fakeStream) Trailer() metadata.MD         { return nil }
func (f *fakeStream) Context() context.Context     { return f.ctx }

func (f *fakeStream) CloseSend() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	return nil
}

func (f *fakeStream) SendMsg(m any) error {
	f.mu.Lock()
	if f.dead {
		f.mu.Unlock()
		return io.EOF
	}
	f.sent = append(f.sent, m)
	n := len(f.sent)
	f.mu.Unlock()
	if f.onSend != nil {
		f.onSend(n)
	}
	return nil
}

func (f *fakeStream) RecvMsg(any) error {
	select {
	case err := <-f.recv:
		if err != nil {
			f.mu.Lock()
			f.dead = true
			f.mu.Unlock()
		}
		return err
	case <-f.ctx.Done():
		return status.FromContextError(f.ctx.Err()).Err()
	}
}

func (f *fakeStream) isClosed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.closed
}

func (f *fakeStream) messages() []any {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]any(nil), f.sent...)
}

// dialPassthrough returns a ClientConn that is never used to send (the
// fake invoker and streamer stand in for grpc), for its target only.
func dialPassthrough(t *testing.T, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient("passthrough:///fake", append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { cc.Close() })
	return cc
}

// errUnavailable is a scripted attempt's failure.
var errUnavailable = status.Error(codes.Unavailable, "scripted: unavailable")

// failFirstN is an invoker script whose first n attempts fail with
// errUnavailable and whose later ones succeed.
func failFirstN(n int) func(int) reply {
	return func(i int) reply {
		if i <= n {
			return reply{err: errUnavailable}
		}
		return reply{}
	}
}
