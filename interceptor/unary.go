package interceptor

import (
	"context"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/stormguard/stormguard/breaker"
)

// ErrorInfo reasons and domain of the details stormguard adds to statuses.
const (
	// ErrorDomain is the ErrorInfo domain of stormguard's details.
	ErrorDomain = "stormguard"
	// ErrorReasonCircuitOpen: the call was not sent because the target's
	// breaker is open (code Unavailable, with a RetryInfo saying how long
	// it stays open).
	ErrorReasonCircuitOpen = "CIRCUIT_OPEN"
	// ErrorReasonRetryRefused: the status is the last attempt's, unchanged;
	// a retry was refused, and the metadata key "refused_by" says why
	// (budget, breaker, deadline or pushback).
	ErrorReasonRetryRefused = "RETRY_REFUSED"
)

// Unary returns the unary client interceptor. Install it with
// grpc.WithChainUnaryInterceptor, together with grpc.WithDisableRetry so
// that grpc's own retries do not stack on top.
func (c *Client) Unary() grpc.UnaryClientInterceptor { return c.unary }

func (c *Client) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	k := call{c: c, r: c.route(cc.Target(), method)}
	ctx, err := k.setup(ctx, scanCallOptions(opts))
	if err != nil {
		return err
	}
	ctx, cancel := c.dl.CallContext(ctx)
	defer cancel()
	ctx = k.startCall(ctx)
	if m, ok := reply.(proto.Message); ok && k.hedge {
		err = k.hedged(ctx, method, req, m, cc, invoker, opts)
	} else {
		err = k.sequential(ctx, method, req, reply, cc, invoker, opts)
	}
	k.endCall(ctx, err)
	return err
}

// seqState is the per-call scratch of the sequential path, pooled so that a
// call that may retry does not allocate to capture its trailers.
type seqState struct {
	tr    metadata.MD
	trOpt grpc.TrailerCallOption
	opts  []grpc.CallOption
}

var seqPool = sync.Pool{New: func() any {
	s := &seqState{}
	s.trOpt = grpc.TrailerCallOption{TrailerAddr: &s.tr}
	return s
}}

func (s *seqState) release() {
	s.tr = nil
	clear(s.opts)
	s.opts = s.opts[:0]
	seqPool.Put(s)
}

// sequential runs attempts one after the other: the retry path.
func (k *call) sequential(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts []grpc.CallOption) error {
	var trp *metadata.MD // where this call's trailers land
	if k.maxAttempts > 1 {
		for _, o := range opts {
			if t, ok := o.(grpc.TrailerCallOption); ok {
				trp = t.TrailerAddr
			}
		}
		if trp == nil {
			st := seqPool.Get().(*seqState)
			defer st.release()
			st.opts = append(append(st.opts, opts...), st.trOpt)
			opts, trp = st.opts, &st.tr
		}
	}
	kind := kindFirst
	var last error
	for {
		a, reason, err := k.begin(ctx, kind, plainAttempt)
		if err != nil {
			return k.notSent(ctx, reason, err, last)
		}
		if trp != nil {
			*trp = nil
		}
		err = invoker(a.ctx, method, req, reply, cc, opts...)
		k.end(ctx, &a, err, false)
		if err == nil {
			return nil
		}
		last = err
		var tr metadata.MD
		if trp != nil {
			tr = *trp
		}
		delay, reason, ok := k.decide(ctx, err, tr, &a)
		if !ok {
			if reason != "" {
				k.refuse(ctx, reason, EventRetryRefused)
				return annotate(err, reason)
			}
			return err
		}
		k.retryScheduled(err, delay, tr)
		if err := sleep(ctx, delay); err != nil {
			return status.FromContextError(err).Err()
		}
		kind = kindRetry
	}
}

// hedgeResult is what one hedged attempt reports back.
type hedgeResult struct {
	a   *hedgeAttempt
	err error
}

type hedgeAttempt struct {
	attempt
	reply   proto.Message
	header  metadata.MD
	trailer metadata.MD
	peer    peer.Peer
}

// hedged runs the hedging path: attempts overlap, the first OK or fatal
// answer wins, the others are cancelled, and every attempt has ended
// before it returns.
func (k *call) hedged(ctx context.Context, method string, req any, reply proto.Message, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts []grpc.CallOption) (err error) {
	// The caller's pointer options are filled from the winner only.
	var hdrp, trp *metadata.MD
	var peerp *peer.Peer
	base := make([]grpc.CallOption, 0, len(opts)+3)
	for _, o := range opts {
		switch o := o.(type) {
		case grpc.HeaderCallOption:
			hdrp = o.HeaderAddr
		case grpc.TrailerCallOption:
			trp = o.TrailerAddr
		case grpc.PeerCallOption:
			peerp = o.PeerAddr
		default:
			base = append(base, o)
		}
	}
	mt := reply.ProtoReflect().Type() // before any attempt writes to reply
	results := make(chan hedgeResult, k.maxAttempts)
	var wg sync.WaitGroup
	var all []*hedgeAttempt
	launch := func(kind int) (Reason, error) {
		a, reason, err := k.begin(ctx, kind, cancelableAttempt)
		if err != nil {
			return reason, err
		}
		h := &hedgeAttempt{attempt: a, reply: reply}
		if len(all) > 0 {
			h.reply = mt.New().Interface()
		}
		aopts := append(base[:len(base):len(base)], grpc.Trailer(&h.trailer))
		if hdrp != nil {
			aopts = append(aopts, grpc.Header(&h.header))
		}
		if peerp != nil {
			aopts = append(aopts, grpc.Peer(&h.peer))
		}
		all = append(all, h)
		wg.Add(1)
		go func() {
			defer wg.Done()
			results <- hedgeResult{a: h, err: invoker(h.ctx, method, req, h.reply, cc, aopts...)}
		}()
		return "", nil
	}
	var winner *hedgeAttempt
	var last error
	defer func() {
		// Cancel the losers, wait for every attempt, and report them.
		for _, h := range all {
			if h != winner {
				h.cancel()
			}
		}
		wg.Wait()
		for len(results) > 0 {
			res := <-results
			k.end(ctx, &res.a.attempt, res.err, true)
		}
		if winner != nil {
			if winner.reply != reply {
				proto.Reset(reply)
				proto.Merge(reply, winner.reply)
			}
			if hdrp != nil {
				*hdrp = winner.header
			}
			if trp != nil {
				*trp = winner.trailer
			}
			if peerp != nil {
				*peerp = winner.peer
			}
		}
	}()

	if reason, err := launch(kindFirst); err != nil {
		return k.notSent(ctx, reason, err, nil)
	}
	inflight, hedging := 1, true
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	armTimer := func() {
		timer.Stop()
		if !hedging || k.sent >= k.maxAttempts || k.hedges >= k.r.maxHedges {
			return
		}
		d := k.r.hedgeDelay
		if k.r.lat != nil {
			var ok bool
			if d, ok = k.r.lat.hedgeDelay(); !ok {
				return // adaptive, not warm yet: no hedge
			}
		}
		timer.Reset(d)
	}
	armTimer()
	for {
		select {
		case res := <-results:
			inflight--
			k.end(ctx, &res.a.attempt, res.err, false)
			winner = res.a // until proven otherwise
			if res.err == nil {
				return nil
			}
			last = res.err
			delay, reason, ok := k.decide(ctx, res.err, res.a.trailer, &res.a.attempt)
			if !ok {
				switch {
				case reason == ReasonCode || reason == ReasonPushback || reason == "":
					// Fatal: this answer wins.
					if reason != "" {
						k.refuse(ctx, reason, EventRetryRefused)
					}
					return annotate(res.err, reason)
				case inflight > 0:
					// Others are still running; one of them may succeed.
					winner = nil
					hedging = false
					continue
				default:
					k.refuse(ctx, reason, EventRetryRefused)
					return annotate(res.err, reason)
				}
			}
			winner = nil
			// A failed attempt is replaced at once while others run
			// (gRFC A6), after the backoff when none does.
			if inflight == 0 {
				k.retryScheduled(res.err, delay, res.a.trailer)
				if err := sleep(ctx, delay); err != nil {
					return status.FromContextError(err).Err()
				}
			}
			if reason, err := launch(kindRetry); err != nil {
				if inflight == 0 {
					winner = res.a
					return k.notSent(ctx, reason, err, last)
				}
				hedging = false
				continue
			}
			inflight++
			armTimer()
		case <-timer.C:
			if reason, ok := k.fund(k.c.o.now()); !ok {
				k.refuse(ctx, reason, EventHedgeRefused)
				hedging = false
				continue
			}
			if reason, err := launch(kindHedge); err != nil {
				k.refuse(ctx, reason, EventHedgeRefused)
				hedging = false
				continue
			}
			k.event(EventHedgeSent, AttrPreviousAttempts.Int(k.sent-1))
			inflight++
			armTimer()
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
}

// annotate returns err with an ErrorInfo saying why it was not retried,
// for the reasons a caller may want to act on; code and message unchanged.
func annotate(err error, reason Reason) error {
	if err == nil || !reason.annotates() {
		return err
	}
	st := status.Convert(err)
	withInfo, derr := st.WithDetails(&errdetails.ErrorInfo{
		Reason:   ErrorReasonRetryRefused,
		Domain:   ErrorDomain,
		Metadata: map[string]string{"refused_by": string(reason)},
	})
	if derr != nil {
		return err
	}
	return withInfo.Err()
}

// circuitOpenError is the status of a call refused by an open breaker.
func circuitOpenError(b *breaker.Breaker) error {
	st := status.New(codes.Unavailable, "stormguard: circuit breaker open for "+b.Target())
	withInfo, err := st.WithDetails(
		&errdetails.ErrorInfo{Reason: ErrorReasonCircuitOpen, Domain: ErrorDomain, Metadata: map[string]string{"target": b.Target()}},
		&errdetails.RetryInfo{RetryDelay: durationpb.New(b.RetryAfter())},
	)
	if err != nil {
		return st.Err()
	}
	return withInfo.Err()
}

// RefusedBy returns the reason stormguard attached to err when it refused a
// retry (budget, breaker, deadline or pushback), "breaker" for a call
// refused by an open breaker, or "" when err carries no such detail.
func RefusedBy(err error) Reason {
	st, ok := status.FromError(err)
	if !ok || st.Code() == codes.OK {
		return ""
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == ErrorDomain {
			switch info.GetReason() {
			case ErrorReasonCircuitOpen:
				return ReasonBreaker
			case ErrorReasonRetryRefused:
				return Reason(info.GetMetadata()["refused_by"])
			}
		}
	}
	return ""
}
