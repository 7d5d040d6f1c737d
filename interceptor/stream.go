package interceptor

import (
	"context"
	"errors"
	"io"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Stream returns the stream client interceptor. Install it with
// grpc.WithChainStreamInterceptor, together with grpc.WithDisableRetry.
//
// A stream of a method that may be repeated is retried like a unary call
// (same budget, breaker, deadline, pushback and telemetry) until it is
// committed: when the caller has received a response header or message, or
// when the client messages it sent outgrow the replay limit (see
// WithReplayLimit). Until then every client message and CloseSend is kept
// and replayed, in order, on each new attempt. After commit, errors go to
// the caller unchanged and nothing is ever delivered twice. Streams are not
// hedged.
func (c *Client) Stream() grpc.StreamClientInterceptor { return c.stream }

func (c *Client) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	k := &call{c: c, r: c.route(cc.Target(), method)}
	ctx, err := k.setup(ctx, scanCallOptions(opts))
	if err != nil {
		return nil, err
	}
	k.hedge = false
	ctx, cancel := c.dl.CallContext(ctx)
	ctx = k.startCall(ctx)
	s := &clientStream{k: k, ctx: ctx, cancel: cancel, desc: desc, cc: cc, method: method, streamer: streamer, opts: opts}
	a, err := s.open(kindFirst, nil)
	if err != nil {
		k.endCall(ctx, err)
		cancel()
		return nil, err
	}
	s.cur = a
	s.stop = context.AfterFunc(ctx, s.callerLeft)
	return s, nil
}

// callerLeft finishes the stream when the caller's context is done. It
// takes the current attempt's receive lock first, so that it does not race
// with a receiver that is deciding about a retry (the receiver returns
// promptly: every attempt's context is derived from the caller's).
func (s *clientStream) callerLeft() {
	for {
		a, finished := s.current()
		if finished {
			return
		}
		a.recvMu.Lock()
		if cur, _ := s.current(); cur == a {
			s.finish(status.FromContextError(s.ctx.Err()).Err())
			a.recvMu.Unlock()
			return
		}
		a.recvMu.Unlock()
	}
}

// clientStream is the grpc.ClientStream the caller sees: it switches the
// underlying attempt on a retry.
type clientStream struct {
	k        *call
	ctx      context.Context // the call's
	cancel   context.CancelFunc
	stop     func() bool // stops the AfterFunc watching ctx
	desc     *grpc.StreamDesc
	cc       *grpc.ClientConn
	method   string
	streamer grpc.Streamer
	opts     []grpc.CallOption

	mu        sync.Mutex
	cur       *streamAttemptState
	committed bool
	buf       []any // client messages to replay
	bufSize   int
	closeSent bool
	finished  bool
	finalErr  error         // returned by RecvMsg once finished (io.EOF on success)
	pending   proto.Message // a response read while resolving a failed send
}

// streamAttemptState is one attempt of a stream.
type streamAttemptState struct {
	attempt
	inner grpc.ClientStream
	// recvMu is held by whoever receives on inner: the caller's RecvMsg, or
	// the code that drains a failed attempt to learn its status. grpc
	// allows one receiver at a time.
	recvMu sync.Mutex
	// done is closed once the attempt has been replaced or the stream has
	// finished.
	done chan struct{}
}

func (s *clientStream) current() (*streamAttemptState, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur, s.finished
}

// open starts a new attempt and replays the buffered client messages. On
// a failed replay it drains the attempt's status and retries, as long as
// the retry rules allow; failed is the attempt this one replaces (nil for
// the first). It returns the final error when no attempt could be opened.
// The caller holds failed.recvMu (if any).
func (s *clientStream) open(kind int, last error) (*streamAttemptState, error) {
	k := s.k
	for {
		a, reason, err := k.begin(s.ctx, kind, streamAttempt)
		if err != nil {
			return nil, k.notSent(s.ctx, reason, err, last)
		}
		sa := &streamAttemptState{attempt: a, done: make(chan struct{})}
		sa.inner, err = s.streamer(a.ctx, s.desc, s.cc, s.method, s.opts...)
		if err == nil {
			err = s.replay(sa)
		}
		if err == nil {
			return sa, nil
		}
		// The attempt failed before it was handed to the caller.
		k.end(s.ctx, &sa.attempt, err, false)
		var tr metadata.MD
		if sa.inner != nil {
			tr = sa.inner.Trailer()
		}
		last = err
		if err := s.backoff(err, tr, &sa.attempt); err != nil {
			return nil, err
		}
		kind = kindRetry
	}
}

// replay sends the buffered client messages to a new attempt. It returns
// the attempt's status if a send fails.
func (s *clientStream) replay(sa *streamAttemptState) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range s.buf {
		if err := sa.inner.SendMsg(m); err != nil {
			if errors.Is(err, io.EOF) {
				return s.drainLocked(sa)
			}
			return err
		}
	}
	if s.closeSent {
		return sa.inner.CloseSend()
	}
	return nil
}

// drainLocked learns the status of an attempt whose send failed with
// io.EOF, by receiving on it. Nobody else receives on an attempt that is
// not yet (or no longer) current. A response message, if one arrives
// instead, cannot be replayed away: the stream commits and the message is
// kept for the caller.
func (s *clientStream) drainLocked(sa *streamAttemptState) error {
	if s.k.r.respType == nil {
		return io.EOF // unknown response type: nothing to drain with
	}
	m := s.k.r.respType.New().Interface()
	err := sa.inner.RecvMsg(m)
	if err == nil {
		s.pending = m
		s.commitLocked()
		return nil
	}
	return err
}

// backoff decides whether to retry after a failed attempt and waits; it
// returns the error to finish with when there will be no retry.
func (s *clientStream) backoff(err error, tr metadata.MD, a *attempt) error {
	k := s.k
	delay, reason, ok := k.decide(s.ctx, err, tr, a)
	if !ok {
		if reason != "" {
			k.refuse(s.ctx, reason, EventRetryRefused)
			return annotate(err, reason)
		}
		return err
	}
	k.retryScheduled(err, delay, tr)
	if serr := sleep(s.ctx, delay); serr != nil {
		return status.FromContextError(serr).Err()
	}
	return nil
}

// fail handles the failure of attempt a, whose recvMu the caller holds:
// it installs a new attempt (and returns nil) or finishes the stream and
// returns the error the caller should see.
func (s *clientStream) fail(a *streamAttemptState, err error) error {
	s.mu.Lock()
	committed, finished := s.committed, s.finished
	s.mu.Unlock()
	if finished {
		return s.finalError()
	}
	if errors.Is(err, io.EOF) { // the stream ended well
		s.finish(io.EOF)
		return io.EOF
	}
	if committed {
		s.finish(err)
		return err
	}
	k := s.k
	k.end(s.ctx, &a.attempt, err, false)
	if berr := s.backoff(err, a.inner.Trailer(), &a.attempt); berr != nil {
		s.finish(berr)
		return berr
	}
	next, oerr := s.open(kindRetry, err)
	if oerr != nil {
		s.finish(oerr)
		return oerr
	}
	s.mu.Lock()
	if s.finished { // the caller left while we were opening
		s.mu.Unlock()
		next.cancel()
		k.end(s.ctx, &next.attempt, s.ctx.Err(), true)
		return s.finalError()
	}
	s.cur = next
	close(a.done)
	s.mu.Unlock()
	return nil
}

func (s *clientStream) finalError() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.finalErr
}

// finish ends the stream once: the current attempt, the call span and
// metrics, and the context watcher.
func (s *clientStream) finish(err error) {
	s.mu.Lock()
	if s.finished {
		s.mu.Unlock()
		return
	}
	s.finished, s.finalErr = true, err
	s.buf, s.pending = nil, nil
	a := s.cur
	if a != nil {
		close(a.done)
	}
	s.mu.Unlock()
	callErr := err
	if errors.Is(err, io.EOF) {
		callErr = nil
	}
	if a != nil {
		s.k.end(s.ctx, &a.attempt, callErr, false)
	}
	s.k.endCall(s.ctx, callErr)
	if s.stop != nil {
		s.stop()
	}
	s.cancel()
}

func (s *clientStream) commitLocked() {
	s.committed = true
	s.buf, s.bufSize = nil, 0
}

// resolve is called when a send (or Header) on attempt a suggests the
// attempt has ended: it learns the attempt's status and retries if the
// stream is not committed, or waits for whoever is receiving to do so. It
// returns true when a new attempt replaced a.
func (s *clientStream) resolve(a *streamAttemptState) (replaced bool) {
	for {
		if a.recvMu.TryLock() {
			s.mu.Lock()
			if s.cur != a || s.finished || s.committed {
				replaced = s.cur != a && !s.finished
				s.mu.Unlock()
				a.recvMu.Unlock()
				return replaced
			}
			err := s.drainLocked(a)
			s.mu.Unlock()
			if err == nil { // a response arrived: committed, nothing to retry
				a.recvMu.Unlock()
				return false
			}
			ferr := s.fail(a, err)
			a.recvMu.Unlock()
			return ferr == nil
		}
		select {
		case <-a.done:
		case <-s.ctx.Done():
			return false
		}
	}
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
		if size < 0 || s.bufSize+size > s.k.c.o.replayLimit {
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
		a.recvMu.Lock()
		if cur, _ := s.current(); cur != a {
			a.recvMu.Unlock()
			continue
		}
		err := a.inner.RecvMsg(m)
		if err == nil {
			s.mu.Lock()
			s.commitLocked()
			s.mu.Unlock()
			a.recvMu.Unlock()
			return nil
		}
		ferr := s.fail(a, err)
		a.recvMu.Unlock()
		if ferr != nil {
			return ferr
		}
	}
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
