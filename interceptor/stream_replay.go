package interceptor

import (
	"errors"
	"io"

	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/internal/engine"
)

// A stream's attempts: one is installed with the client messages replayed
// on it, until the stream is committed (a response arrived, or the
// messages outgrew the replay limit); a failure before then goes through
// the call's one step (fail), and the stream is finished once.

// install replays the buffered client messages (and CloseSend) on sa and
// makes it the current attempt, in one critical section: a SendMsg or
// CloseSend either comes before it (and is replayed) or after it (and goes
// to sa); none is lost in between. It returns the attempt's status if a
// replayed send fails.
func (s *clientStream) install(sa, old *streamAttempt) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.finished {
		return errFinished
	}
	if err := s.replayLocked(sa); err != nil {
		return err
	}
	if testHookReplayed != nil {
		testHookReplayed()
	}
	s.cur = sa
	if old != nil {
		close(old.done)
	}
	return nil
}

func (s *clientStream) replayLocked(sa *streamAttempt) error {
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
func (s *clientStream) drainLocked(sa *streamAttempt) error {
	if s.c.route.respType == nil {
		return io.EOF // unknown response type: nothing to drain with
	}
	m := s.c.route.respType.New().Interface()
	err := sa.inner.RecvMsg(m)
	if err == nil {
		s.pending = m
		s.commitLocked()
		return nil
	}
	return err
}

// callerLeft finishes the stream when the caller's context is done. It
// takes the current attempt's receive lock first, so that it does not race
// with a receiver that is deciding about a retry (the receiver returns
// promptly: every attempt's context is derived from the caller's).
//
// It runs on a goroutine of its own (context.AfterFunc's), where a panic
// reaching it (a breaker callback the Client does not wrap) is recovered
// and logged.
func (s *clientStream) callerLeft() {
	defer s.c.client.recoverOwn("stream watcher")
	for {
		a, finished := s.current()
		if finished || s.finishIfCurrent(a) {
			return
		}
	}
}

// finishIfCurrent finishes the stream because the caller left, if a is
// still its current attempt, holding a's receive lock (released however
// it ends).
func (s *clientStream) finishIfCurrent(a *streamAttempt) bool {
	a.recvMu.Lock()
	defer a.recvMu.Unlock()
	if cur, _ := s.current(); cur != a {
		return false
	}
	s.finish(status.FromContextError(s.ctx.Err()).Err())
	return true
}

// fail handles the failure of attempt a, whose recvMu the caller holds:
// it installs a new attempt (and returns nil) or finishes the stream and
// returns the error the caller should see.
func (s *clientStream) fail(a *streamAttempt, err error) error {
	s.mu.Lock()
	committed, finished := s.committed, s.finished
	s.mu.Unlock()
	switch {
	case finished:
		return s.finalError()
	case errors.Is(err, io.EOF): // the stream ended well
		s.finish(io.EOF)
		return io.EOF
	case committed:
		s.finish(err)
		return err
	}
	c := s.c
	tr := a.inner.Trailer()
	if c.watched != nil && a.creds != nil {
		hdr, _ := a.inner.Header() // the attempt has ended: this does not wait
		c.noteGRPCRetries(a.attempt, a.creds.triesSoFar(), err, hdr, tr, nil)
	}
	if next, serr := c.step(a.attempt, outcome{err: err, tr: tr}, 0); next != engine.Again || serr != nil {
		s.finish(serr)
		return serr
	}
	s.replacing = a
	if oerr := c.run(s, engine.Retry, streamAttemptMode); oerr != nil {
		s.finish(oerr)
		return s.finalError()
	}
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
	a, stop := s.cur, s.stop
	if a != nil {
		close(a.done)
	}
	s.mu.Unlock()
	callErr := err
	if errors.Is(err, io.EOF) {
		callErr = nil
	}
	if a != nil {
		s.c.end(a.attempt, callErr, false)
	}
	s.c.endCall(callErr)
	if stop != nil {
		stop()
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
func (s *clientStream) resolve(a *streamAttempt) (replaced bool) {
	for {
		if a.recvMu.TryLock() {
			return s.resolveLocked(a)
		}
		select {
		case <-a.done:
		case <-s.ctx.Done():
			return false
		}
	}
}

// resolveLocked is resolve once it holds a's receive lock, which it
// releases however it ends (a panic included).
func (s *clientStream) resolveLocked(a *streamAttempt) (replaced bool) {
	defer a.recvMu.Unlock()
	s.mu.Lock()
	if s.cur != a || s.finished || s.committed {
		replaced = s.cur != a && !s.finished
		s.mu.Unlock()
		return replaced
	}
	err := s.drainLocked(a)
	s.mu.Unlock()
	if err == nil { // a response arrived: committed, nothing to retry
		return false
	}
	return s.fail(a, err) == nil
}
