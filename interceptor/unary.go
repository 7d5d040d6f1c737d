package interceptor

import (
	"context"
	"sync"

	"github.com/stormguard/stormguard/internal/svcconfig"
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
// call on the suite retries such methods within its budget, as its own
// options say. With grpc-go's retries on, the suite keeps sending one
// attempt per call, so that the two never multiply. Installed by hand, the
// suite does not carry out the service config's policies as DialOptions
// does. docs/grpc-retries.md lists the combinations.
func (c *Client) Unary() grpc.UnaryClientInterceptor { return c.unaryInterceptor(nil) }

func (c *Client) unaryInterceptor(w *svcconfig.Watch) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		return c.unary(ctx, method, req, reply, cc, invoker, opts, w)
	}
}

func (c *Client) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts []grpc.CallOption, w *svcconfig.Watch) error {
	st := unaryPool.Get().(*unaryState)
	defer st.release()
	return st.call(c, ctx, method, req, reply, cc, invoker, opts, w)
}

// call runs a unary call of Client cl with st as its state.
func (st *unaryState) call(cl *Client, ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts []grpc.CallOption, w *svcconfig.Watch) error {
	c := &st.c // cleared when it was put in the pool (release)
	c.client, c.route = cl, cl.routeOf(targetOf(cc), method)
	cs := scanCallOptions(opts)
	cancel, sh, err := c.setup(ctx, cs, cc, w, req)
	if err != nil {
		return err
	}
	defer cancel()
	if m, ok := reply.(proto.Message); ok && (sh.hedge || sh.beside) {
		err = runHedged(c, sh, method, req, m, cc, invoker, opts, cs)
	} else {
		st.method, st.req, st.reply, st.cc, st.invoker, st.cs = method, req, reply, cc, invoker, cs
		st.prepare(c, opts)
		err = c.run(st, c.e.FirstKind(), plainAttempt)
	}
	c.endCall(err)
	switch {
	case err != nil:
		c.remember(req, err)
	case c.back != nil:
		cl.forget(c.back)
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

// unaryState is a unary call's state, pooled so that a call allocates
// nothing for it: the call, and the sender of its sequential attempts
// (one after the other: the retry path), with the call options its
// attempts are sent with.
type unaryState struct {
	c call
	a attempt

	method  string
	req     any
	reply   any
	cc      *grpc.ClientConn
	invoker grpc.UnaryInvoker
	cs      callSettings
	trp     *metadata.MD // where the call's trailers land (nil: not captured)

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
	s.clear()
	unaryPool.Put(s)
}

// clear drops what would keep the caller's objects alive in the pool. The
// call and the attempt are set afresh before use (call, open).
func (s *unaryState) clear() {
	s.c = call{}
	s.a = attempt{}
	s.method, s.req, s.reply, s.cc, s.invoker, s.cs, s.trp = "", nil, nil, nil, nil, callSettings{}, nil
	s.tr, s.hdr, s.peer = nil, nil, peer.Peer{}
	s.creds.reset(nil, nil)
	clear(s.creds.md)
	clear(s.opts)
	s.opts = s.opts[:0]
	clear(s.withCred)
	s.withCred = s.withCred[:0]
}

// prepare fills s.opts with the options every attempt of c is sent with:
// the caller's, and those that capture what the call needs to see. Every
// attempt learns the endpoint it went to (grpc.Peer); one that may retry
// also captures its trailer (a server's pushback); a call whose grpc-go
// retries are watched (see grpcRetries) its header and trailer.
func (s *unaryState) prepare(c *call, opts []grpc.CallOption) {
	s.opts = append(s.opts, opts...)
	if c.watched != nil {
		s.opts = append(s.opts, s.hdrOpt)
	}
	if c.e.MaxAttempts() > 1 || c.watched != nil {
		for _, o := range opts {
			if t, ok := o.(grpc.TrailerCallOption); ok {
				s.trp = t.TrailerAddr
			}
		}
		if s.trp == nil {
			s.opts, s.trp = append(s.opts, s.trOpt), &s.tr
		}
	}
	s.opts = append(s.opts, s.peerOpt)
	s.creds.reset(c, &s.cs)
}

// attempt returns the call's one attempt value, which its attempts reuse.
func (s *unaryState) attempt() *attempt { return &s.a }

// send invokes attempt a, with the call credentials only when they have
// work (see needsCreds).
func (s *unaryState) send(c *call, a *attempt) outcome {
	creds := &s.creds
	creds.prepare(c, a)
	aopts := s.opts
	if c.needsCreds(a, &s.cs) {
		a.creds = creds
		s.withCred = append(append(s.withCred[:0], s.opts...), s.credsOpt)
		aopts = s.withCred
	}
	a.peerp = &s.peer
	s.peer = peer.Peer{}
	if s.trp != nil {
		*s.trp = nil
	}
	s.hdr = nil
	err := s.invoker(a.ctx, s.method, s.req, s.reply, s.cc, aopts...)
	for creds.collect() { // it picked an endpoint it avoids: pick again
		s.hdr = nil
		creds.recount()
		err = s.invoker(a.ctx, s.method, s.req, s.reply, s.cc, aopts...)
	}
	if a.pt != nil {
		err = c.finish(a, err)
	}
	if reason, perr := c.atPick(a); reason != "" {
		return outcome{refused: reason, err: perr}
	}
	var tr metadata.MD
	if s.trp != nil {
		tr = *s.trp
	}
	if c.watched != nil && a.creds != nil {
		c.noteGRPCRetries(a, creds.tries, err, s.hdr, tr, s.req)
	}
	return outcome{err: err, tr: tr}
}
