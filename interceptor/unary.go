package interceptor

import (
	"context"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/proto"
)

// Unary returns the unary client interceptor. Install it with
// grpc.WithChainUnaryInterceptor, together with grpc.WithDisableRetry so
// that grpc's own retries do not stack on top (or use DialOptions, which
// does both).
//
// A method that a service config gives a retryPolicy is retried by
// grpc-go itself unless its retries are off, and an interceptor installed
// by hand cannot ask the ClientConn whether they are. It sends one attempt
// per such call, leaving the retries to grpc-go, until a failure that
// grpc-go would have retried comes back after a single attempt of
// grpc-go's: its retries are off (grpc.WithDisableRetry), and from that
// call on the suite retries such methods within its budget, as through
// DialOptions. With grpc-go's retries on, the suite keeps sending one
// attempt per call, so that the two never multiply. The README's table
// "grpc-go's own retries" lists the four combinations.
func (c *Client) Unary() grpc.UnaryClientInterceptor { return c.unaryInterceptor(false) }

func (c *Client) unaryInterceptor(grpcRetryOff bool) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		return c.unary(ctx, method, req, reply, cc, invoker, opts, grpcRetryOff)
	}
}

func (c *Client) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts []grpc.CallOption, grpcRetryOff bool) error {
	k := call{client: c, route: c.routeFor(targetOf(cc), method), req: req}
	callerCtx := ctx
	cs := scanCallOptions(opts)
	ctx, cancel, err := k.setup(ctx, cs, cc, grpcRetryOff)
	if err != nil {
		return err
	}
	defer cancel()
	ctx = k.startCall(ctx)
	if m, ok := reply.(proto.Message); ok && (k.hedge || k.beside) {
		err = runHedged(&k, ctx, method, req, m, cc, invoker, opts, cs)
	} else {
		err = k.sequential(ctx, method, req, reply, cc, invoker, opts, &cs)
	}
	k.endCall(ctx, err)
	switch {
	case err != nil:
		c.noteFailed(callerCtx, &k, req, err)
	case k.back != nil:
		c.forget(k.back)
	}
	return err
}

// targetOf returns cc.Target(), or "" for a nil ClientConn (as some
// interceptor test harnesses pass).
func targetOf(cc *grpc.ClientConn) string {
	if cc == nil {
		return ""
	}
	return cc.Target()
}

// unaryState is the per-call scratch of the sequential path: the call
// options with the attempt credentials and, for a call that may retry, a
// trailer capture. It is pooled so that a call does not allocate for them.
type unaryState struct {
	opts     []grpc.CallOption // the caller's, and ours but the credentials
	withCred []grpc.CallOption // opts and the credentials
	creds    attemptCreds
	credsOpt grpc.CallOption
	tr       metadata.MD
	trOpt    grpc.CallOption
	hdr      metadata.MD // a watched call's response header (see grpcRetries)
	hdrOpt   grpc.CallOption
	peer     peer.Peer
	peerOpt  grpc.CallOption
}

var unaryPool = sync.Pool{New: func() any {
	s := &unaryState{}
	s.credsOpt = grpc.PerRPCCredentials(&s.creds)
	s.trOpt = grpc.TrailerCallOption{TrailerAddr: &s.tr}
	s.hdrOpt = grpc.HeaderCallOption{HeaderAddr: &s.hdr}
	s.peerOpt = grpc.PeerCallOption{PeerAddr: &s.peer}
	return s
}}

func (s *unaryState) release() {
	s.tr, s.hdr, s.peer = nil, nil, peer.Peer{}
	s.creds.user = nil
	clear(s.opts)
	s.opts = s.opts[:0]
	clear(s.withCred)
	s.withCred = s.withCred[:0]
	unaryPool.Put(s)
}

// callOptions fills st.opts with the options every attempt of c is sent
// with (the caller's, and those that capture what the call needs to see),
// and returns where the attempts' trailers land (nil: not captured).
func (c *call) callOptions(st *unaryState, opts []grpc.CallOption) (trp *metadata.MD) {
	st.opts = append(st.opts, opts...)
	if c.watched != nil {
		st.opts = append(st.opts, st.hdrOpt)
	}
	if c.maxAttempts > 1 || c.watched != nil {
		for _, o := range opts {
			if t, ok := o.(grpc.TrailerCallOption); ok {
				trp = t.TrailerAddr
			}
		}
		if trp == nil {
			st.opts, trp = append(st.opts, st.trOpt), &st.tr
		}
	}
	st.opts = append(st.opts, st.peerOpt)
	return trp
}

// sequential runs attempts one after the other: the retry path.
func (c *call) sequential(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts []grpc.CallOption, cs *callSettings) error {
	// Every attempt learns the endpoint it went to (grpc.Peer); one that
	// may retry also captures its trailer (a server's pushback). The call
	// credentials go along only when they have work: a deadline header to
	// write, endpoints to avoid, or a pick an open breaker guards (inside
	// grpc they cost a few allocations per attempt). A call whose grpc-go
	// retries are watched (see grpcRetries) has them, and captures its
	// header and trailer.
	st := unaryPool.Get().(*unaryState)
	defer st.release()
	trp := c.callOptions(st, opts)
	creds := &st.creds
	creds.reset(c, cs)
	kind := kindFirst
	if c.back != nil {
		kind = kindRetry // a try that came back: its first attempt is a retry
	}
	var a attempt
	for {
		reason, err := c.begin(ctx, &a, kind, plainAttempt)
		if reason != "" {
			return c.notSent(ctx, reason, err)
		}
		creds.prepare(c, &a)
		aopts := st.opts
		if c.hasDeadline || cs.hasCreds || len(c.avoid) > 0 || a.guarded != nil || c.watched != nil {
			a.creds = creds
			st.withCred = append(append(st.withCred[:0], st.opts...), st.credsOpt)
			aopts = st.withCred
		}
		a.peerp = &st.peer
		st.peer = peer.Peer{}
		if trp != nil {
			*trp = nil
		}
		st.hdr = nil
		err = invoker(a.ctx, method, req, reply, cc, aopts...)
		for creds.collect() { // it picked an endpoint it avoids: pick again
			st.hdr = nil
			creds.recount()
			err = invoker(a.ctx, method, req, reply, cc, aopts...)
		}
		if a.pt != nil {
			err = c.finish(ctx, &a, err)
		}
		if a.guarded != nil {
			if c.pickRefused(ctx, &a) {
				return c.refusedAtPick(ctx, &a)
			}
			c.sentGuarded(ctx, &a)
		}
		if a.free && c.unpaidAtPick(ctx, &a) {
			c.unsend(&a)
			return c.notSent(ctx, ReasonBudget, nil)
		}
		var tr metadata.MD
		if trp != nil {
			tr = *trp
		}
		if c.watched != nil && a.creds != nil {
			c.noteGRPCRetries(a.ctx, creds.tries, err, st.hdr, tr, req)
		}
		v := c.after(ctx, &a, err, tr)
		if !v.retry {
			return c.conclude(ctx, v)
		}
		c.scheduled(v)
		if err := c.wait(ctx, v.delay); err != nil {
			return err
		}
		kind = kindRetry
	}
}
