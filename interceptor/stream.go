package interceptor

import (
	"context"
	"errors"
	"io"
	"sync"

	"github.com/stormguard/stormguard/internal/engine"
	"github.com/stormguard/stormguard/internal/svcconfig"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/proto"
)

// Stream returns the stream client interceptor. Install it with
// grpc.WithChainStreamInterceptor, together with grpc.WithDisableRetry (or
// use DialOptions).
//
// A stream of a method that may be repeated is retried like a unary call
// (same budget, breaker, deadline, pushback and telemetry) until it is
// committed: when the caller has received a response header or message, or
// when the client messages it sent outgrow the replay limit (see
// RetryPolicy.ReplayLimit). Until then every client message and CloseSend is kept
// and replayed, in order, on each new attempt. After commit, errors go to
// the caller unchanged and nothing is ever delivered twice. Streams are not
// hedged. A method with a service config retryPolicy is treated as Unary
// says.
func (c *Client) Stream() grpc.StreamClientInterceptor { return c.streamInterceptor(nil) }

func (c *Client) streamInterceptor(w *svcconfig.Watch) grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		return c.stream(ctx, desc, cc, method, streamer, opts, w)
	}
}

func (c *Client) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts []grpc.CallOption, w *svcconfig.Watch) (grpc.ClientStream, error) {
	return newClientStream(c, ctx, desc, cc, method, streamer, opts, w)
}

// newClientStream starts a stream call of Client cl: its first attempt is
// opened, sent and handed to the caller through the call's run, as a
// unary call's attempts are.
func newClientStream(cl *Client, ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts []grpc.CallOption, w *svcconfig.Watch) (grpc.ClientStream, error) {
	c := &call{client: cl, route: cl.routeOf(targetOf(cc), method)}
	cs := scanCallOptions(opts)
	cancel, _, err := c.setup(ctx, cs, cc, w, nil) // streams are not hedged
	if err != nil {
		return nil, err
	}
	s := &clientStream{c: c, ctx: c.ctx, cancel: cancel, desc: desc, cc: cc, method: method, streamer: streamer, opts: opts, cs: cs}
	if err := c.run(s, engine.First, streamAttemptMode); err != nil {
		c.endCall(err)
		cancel()
		return nil, err
	}
	// When the caller's context is already done, AfterFunc runs callerLeft
	// at once, on its own goroutine, which may finish the stream before
	// stop is stored: stop is stored under mu, and called here if so.
	stop := context.AfterFunc(c.ctx, s.callerLeft)
	s.mu.Lock()
	s.stop = stop
	finished := s.finished
	s.mu.Unlock()
	if finished {
		stop()
	}
	return s, nil
}

// clientStream is the grpc.ClientStream the caller sees: it switches the
// underlying attempt on a retry.
type clientStream struct {
	c        *call
	ctx      context.Context // the call's
	cancel   context.CancelFunc
	desc     *grpc.StreamDesc
	cc       *grpc.ClientConn
	method   string
	streamer grpc.Streamer
	opts     []grpc.CallOption
	cs       callSettings

	// replacing is the attempt a new one replaces while the engine opens
	// it (nil for the first); the caller holds its recvMu.
	replacing *streamAttempt
	latest    *streamAttempt // the attempt the engine last sent

	mu        sync.Mutex
	stop      func() bool // stops the AfterFunc watching ctx; nil until it is set
	cur       *streamAttempt
	committed bool
	buf       []any // client messages to replay
	bufSize   int
	closeSent bool
	finished  bool
	finalErr  error         // returned by RecvMsg once finished (io.EOF on success)
	pending   proto.Message // a response read while resolving a failed send
}

// streamAttempt is one attempt of a stream.
type streamAttempt struct {
	*attempt
	inner grpc.ClientStream
	// recvMu is held by whoever receives on inner: the caller's RecvMsg, or
	// the code that drains a failed attempt to learn its status. grpc
	// allows one receiver at a time.
	recvMu sync.Mutex
	// done is closed once the attempt has been replaced or the stream has
	// finished.
	done chan struct{}
}

// testHookReplayed, when set by a test, runs between a new attempt's replay
// and its installation.
var testHookReplayed func()

// errFinished is install's answer when the stream finished (the caller
// left) while a new attempt was being opened.
var errFinished = errors.New("stormguard: stream finished")

func (s *clientStream) current() (*streamAttempt, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur, s.finished
}

// attempt returns a new attempt for the engine to open.
func (s *clientStream) attempt() *attempt {
	s.latest = &streamAttempt{attempt: new(attempt), done: make(chan struct{})}
	return s.latest.attempt
}

// send opens the stream of attempt a (its last attempt) and installs it in
// place of the one it replaces, replaying what the caller sent: the
// stream is then kept, handed to the caller. An attempt that fails before
// it is handed over is settled by the engine like a unary one.
func (s *clientStream) send(c *call, a *attempt) outcome {
	sa := s.latest
	// The call credentials go along only when they have work (as in
	// unary calls); without them, the endpoint is read from the stream's
	// context, which grpc has made when the streamer returns.
	opts := s.opts
	var creds *attemptCreds
	if c.needsCreds(a, &s.cs) {
		var credsOpt grpc.CallOption
		creds, credsOpt = newAttemptCreds(c, &s.cs)
		creds.prepare(c, a)
		sa.creds = creds
		opts = append(s.opts[:len(s.opts):len(s.opts)], credsOpt)
	}
	var err error
	sa.inner, err = s.streamer(a.ctx, s.desc, s.cc, s.method, opts...)
	for creds.collect() && err != nil { // it picked an endpoint it avoids: pick again
		creds.recount()
		sa.inner, err = s.streamer(a.ctx, s.desc, s.cc, s.method, opts...)
	}
	if err == nil && creds == nil {
		if p, ok := peer.FromContext(sa.inner.Context()); ok {
			a.peerp = p
		}
	}
	if reason, perr := c.atPick(a); reason != "" {
		return outcome{refused: reason, err: perr}
	}
	if err == nil {
		if err = s.install(sa, s.replacing); err == nil {
			return outcome{kept: true}
		}
		if errors.Is(err, errFinished) {
			c.end(a, nil, true)
			return outcome{err: s.finalError(), settled: true}
		}
	}
	// The attempt failed before it was handed to the caller.
	var tr, hdr metadata.MD
	if sa.inner != nil {
		tr = sa.inner.Trailer()
		hdr, _ = sa.inner.Header()
	}
	if c.watched != nil && creds != nil {
		c.noteGRPCRetries(a, creds.tries, err, hdr, tr, nil)
	}
	return outcome{err: err, tr: tr}
}

// SendMsg records m for replay (until commit) and sends it on the current
// attempt. Like grpc's, it returns io.EOF when the stream has ended; the
// status then comes from RecvMsg.
func (s *clientStream) SendMsg(m any) error {
	s.mu.Lock()
	if s.finished {
		s.mu.Unlock()
		return io.EOF
	}
	a := s.cur
	if !s.committed {
		size := -1
		if pm, ok := m.(proto.Message); ok {
			size = proto.Size(pm)
		}
		if size < 0 || s.bufSize+size > s.c.client.o.replayLimit {
			s.commitLocked() // too much to replay: no retry from now on
		} else {
			s.buf = append(s.buf, m)
			s.bufSize += size
		}
	}
	s.mu.Unlock()
	err := a.inner.SendMsg(m)
	if err == nil || !errors.Is(err, io.EOF) {
		return err
	}
	if s.resolve(a) {
		return nil // m was replayed on the new attempt
	}
	return io.EOF
}

// CloseSend closes the sending direction, on this and any later attempt.
func (s *clientStream) CloseSend() error {
	s.mu.Lock()
	if !s.committed {
		s.closeSent = true
	}
	a := s.cur
	s.mu.Unlock()
	return a.inner.CloseSend()
}

// RecvMsg receives the next response; the first one commits the stream.
func (s *clientStream) RecvMsg(m any) error {
	for {
		s.mu.Lock()
		if s.pending != nil {
			p := s.pending
			s.pending = nil
			s.mu.Unlock()
			if pm, ok := m.(proto.Message); ok {
				proto.Reset(pm)
				proto.Merge(pm, p)
			}
			return nil
		}
		if s.finished {
			err := s.finalErr
			s.mu.Unlock()
			return err
		}
		a := s.cur
		s.mu.Unlock()
		if done, err := s.recvOn(a, m); done {
			return err
		}
	}
}

// recvOn receives m on attempt a, holding a's receive lock (released
// however it ends, a panic included). done is false when a is no longer
// the current attempt, or failed and was replaced: receive again.
func (s *clientStream) recvOn(a *streamAttempt, m any) (done bool, err error) {
	a.recvMu.Lock()
	defer a.recvMu.Unlock()
	if cur, _ := s.current(); cur != a {
		return false, nil
	}
	if err := a.inner.RecvMsg(m); err != nil {
		ferr := s.fail(a, err)
		return ferr != nil, ferr
	}
	s.mu.Lock()
	s.commitLocked()
	s.mu.Unlock()
	return true, nil
}

// Header returns the response header; receiving one commits the stream.
func (s *clientStream) Header() (metadata.MD, error) {
	for {
		a, finished := s.current()
		if finished {
			return a.inner.Header()
		}
		md, err := a.inner.Header()
		if err != nil {
			return md, err
		}
		if md != nil {
			s.mu.Lock()
			s.commitLocked()
			s.mu.Unlock()
			return md, nil
		}
		// The attempt ended without a header: maybe a failure to retry.
		if !s.resolve(a) {
			return nil, nil
		}
	}
}

// Trailer returns the trailer of the current (after the stream ended: the
// last) attempt.
func (s *clientStream) Trailer() metadata.MD {
	a, _ := s.current()
	return a.inner.Trailer()
}

// Context returns the call's context until the stream commits, and the
// underlying attempt's afterwards (asking an attempt for its context early
// would disable grpc's own transparent retry of it).
func (s *clientStream) Context() context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.committed && s.cur != nil {
		return s.cur.inner.Context()
	}
	return s.ctx
}
