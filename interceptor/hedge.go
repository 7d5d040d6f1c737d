package interceptor

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/stormguard/stormguard/internal/clock"
)

// hedger runs one hedged unary call: attempts overlap, the first OK or
// fatal answer wins, the others are cancelled, and every attempt has ended
// before run returns. A failed attempt is replaced at once while others
// run (gRFC A6), after the backoff when none does.
//
// The call is passed to every method rather than kept in the hedger, so
// that it stays on the caller's stack (escape analysis does not tell a
// hedger's fields apart).
type hedger struct {
	ctx     context.Context
	method  string
	req     any
	reply   proto.Message
	mt      protoreflect.MessageType
	cc      *grpc.ClientConn
	invoker grpc.UnaryInvoker
	cs      callSettings

	// The caller's pointer options are filled from the winner only; base
	// is the caller's other options.
	base  []grpc.CallOption
	hdrp  *metadata.MD
	trp   *metadata.MD
	peerp *peer.Peer

	results  chan hedgeResult
	wg       *sync.WaitGroup // the attempts' goroutines
	all      []*hedgeAttempt
	winner   *hedgeAttempt
	inflight int
	hedging  bool        // more hedges may be sent
	timer    clock.Timer // the next hedge; nil when none is due
}

type hedgeAttempt struct {
	attempt
	reply   proto.Message
	header  metadata.MD
	trailer metadata.MD
	peer    peer.Peer
}

type hedgeResult struct {
	a   *hedgeAttempt
	err error
}

// runHedged runs a hedged call. The hedger lives on its stack: the
// attempts' goroutines see only their own attempt.
func runHedged(c *call, ctx context.Context, method string, req any, reply proto.Message, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts []grpc.CallOption, cs callSettings) error {
	h := hedger{ctx: ctx, method: method, req: req, reply: reply, cc: cc, invoker: invoker, cs: cs,
		mt:      reply.ProtoReflect().Type(), // before any attempt writes to reply
		base:    make([]grpc.CallOption, 0, len(opts)+4),
		results: make(chan hedgeResult, c.maxAttempts),
		wg:      new(sync.WaitGroup),
		hedging: true,
	}
	for _, o := range opts {
		switch o := o.(type) {
		case grpc.HeaderCallOption:
			h.hdrp = o.HeaderAddr
		case grpc.TrailerCallOption:
			h.trp = o.TrailerAddr
		case grpc.PeerCallOption:
			h.peerp = o.PeerAddr
		default:
			h.base = append(h.base, o)
		}
	}
	return h.run(c)
}

func (h *hedger) run(c *call) error {
	defer h.finish(c)
	if reason, err := h.launch(c, kindFirst); reason != "" {
		return c.notSent(h.ctx, reason, err)
	}
	h.arm(c)
	for {
		var hedgeDue <-chan time.Time
		if h.timer != nil {
			hedgeDue = h.timer.C()
		}
		select {
		case res := <-h.results:
			if done, err := h.answer(c, res); done {
				return err
			}
		case <-hedgeDue:
			h.timer = nil
			if reason, _ := h.launch(c, kindHedge); reason != "" {
				c.refuse(h.ctx, reason, EventHedgeRefused)
				h.hedging = false
				continue
			}
			c.event(EventHedgeSent, AttrPreviousAttempts.Int(c.sent-1))
			h.arm(c)
		case <-h.ctx.Done():
			return status.FromContextError(h.ctx.Err()).Err()
		}
	}
}

// answer handles a finished attempt; done says the call is over, with err.
func (h *hedger) answer(c *call, res hedgeResult) (done bool, err error) {
	h.inflight--
	if a := &res.a.attempt; a.guarded != nil {
		if a.creds.refused {
			return true, c.refusedAtPick(h.ctx, a) // the first attempt: nothing else runs
		}
		c.sentGuarded(h.ctx, a)
	}
	v := c.after(h.ctx, &res.a.attempt, res.err, res.a.trailer)
	h.winner = res.a // until proven otherwise
	if res.err == nil {
		return true, nil
	}
	if !v.retry {
		if v.reason != "" && !v.reason.info().fatal && h.inflight > 0 {
			// Refused, but others still run; one of them may succeed.
			h.winner, h.hedging = nil, false
			return false, nil
		}
		return true, c.conclude(h.ctx, v)
	}
	h.winner = nil
	if h.inflight > 0 {
		v.delay = 0
	}
	c.scheduled(v)
	if err := c.wait(h.ctx, v.delay); err != nil {
		return true, err
	}
	if reason, err := h.launch(c, kindRetry); reason != "" {
		if h.inflight == 0 {
			h.winner = res.a
			return true, c.notSent(h.ctx, reason, err)
		}
		h.hedging = false
		return false, nil
	}
	h.arm(c)
	return false, nil
}

// launch begins an attempt and runs it on its own goroutine.
func (h *hedger) launch(c *call, kind attemptKind) (Reason, error) {
	ha := &hedgeAttempt{reply: h.reply}
	if reason, err := c.begin(h.ctx, &ha.attempt, kind, cancelableAttempt); reason != "" {
		return reason, err
	}
	if len(h.all) > 0 {
		ha.reply = h.mt.New().Interface()
	}
	creds, credsOpt := newAttemptCreds(c, &h.cs)
	creds.prepare(c, &ha.attempt)
	ha.creds = creds
	opts := append(h.base[:len(h.base):len(h.base)], grpc.Trailer(&ha.trailer), credsOpt)
	if h.hdrp != nil {
		opts = append(opts, grpc.Header(&ha.header))
	}
	if h.peerp != nil {
		opts = append(opts, grpc.Peer(&ha.peer))
	}
	h.all = append(h.all, ha)
	h.inflight++
	h.wg.Add(1)
	go runHedgeAttempt(h.wg, h.results, ha, h.invoker, h.method, h.req, h.cc, opts)
	return "", nil
}

func runHedgeAttempt(wg *sync.WaitGroup, results chan<- hedgeResult, ha *hedgeAttempt, invoker grpc.UnaryInvoker, method string, req any, cc *grpc.ClientConn, opts []grpc.CallOption) {
	defer wg.Done()
	err := invoker(ha.ctx, method, req, ha.reply, cc, opts...)
	for ha.creds.collect() { // it picked an endpoint it avoids: pick again
		err = invoker(ha.ctx, method, req, ha.reply, cc, opts...)
	}
	results <- hedgeResult{a: ha, err: err}
}

// arm sets the timer of the next hedge, if one may be sent.
func (h *hedger) arm(c *call) {
	if h.timer != nil {
		h.timer.Stop()
		h.timer = nil
	}
	if !h.hedging || c.sent >= c.maxAttempts || c.hedges >= c.route.maxHedges {
		return
	}
	d := c.route.hedgeDelay
	if c.route.lat != nil {
		var ok bool
		if d, ok = c.route.lat.hedgeDelay(); !ok {
			return // adaptive, not warm yet: no hedge
		}
	}
	h.timer = c.client.newTimer(d)
}

// finish cancels the losers, waits for every attempt, reports them, and
// fills the caller's reply and pointer options from the winner.
func (h *hedger) finish(c *call) {
	if h.timer != nil {
		h.timer.Stop()
	}
	for _, a := range h.all {
		if a != h.winner {
			a.cancel()
		}
	}
	h.wg.Wait()
	for len(h.results) > 0 {
		res := <-h.results
		c.end(h.ctx, &res.a.attempt, res.err, true)
	}
	w := h.winner
	if w == nil {
		return
	}
	if w.reply != h.reply {
		proto.Reset(h.reply)
		proto.Merge(h.reply, w.reply)
	}
	if h.hdrp != nil {
		*h.hdrp = w.header
	}
	if h.trp != nil {
		*h.trp = w.trailer
	}
	if h.peerp != nil {
		*h.peerp = w.peer
	}
}
