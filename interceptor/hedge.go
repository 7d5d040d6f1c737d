package interceptor

import (
	"sync"
	"time"

	"github.com/stormguard/stormguard/semconv"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
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
// run (gRFC A6), after the backoff when none does. A server's "do not
// retry" (grpc-retry-pushback-ms < 0) stops further attempts but does not
// end the call while others run: it says that attempt was not run, not
// how the call ends.
//
// It also runs the calls of methods with a per-attempt timeout: when the
// latest attempt has not answered after it, a retry is sent beside it
// (Envoy's hedge_on_per_try_timeout), so that the slow attempt's answer
// is not thrown away. Cancelling it would lose the work the server has
// done or queued for it, and under overload that loss is what keeps a
// service down in a metastable overload; when no retry may be sent, the
// slow attempt simply runs on (semconv.EventTimeoutKept).
//
// Hedges and those retries yield to an overloaded target (see yield): they
// are not sent while it says it is overloaded, or while most calls run
// past their delay.
//
// The call is passed to every method rather than kept in the hedger, so
// that it stays on the caller's stack (escape analysis does not tell a
// hedger's fields apart).
type hedger struct {
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
	first    *hedgeAttempt // the group's first attempt, until it is launched
	inflight int
	hedging  bool        // more hedges may be sent
	timing   bool        // more retries may be sent on a per-attempt timeout
	timer    clock.Timer // the next hedge or retry; nil when none is due
	next     attemptKind // what the timer sends: kindHedge or kindRetry
	watched  bool        // a timer watched the first attempt (see yield)
	late     bool        // ... and fired
}

type hedgeAttempt struct {
	*attempt
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
func runHedged(c *call, method string, req any, reply proto.Message, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts []grpc.CallOption, cs callSettings) error {
	h := hedger{method: method, req: req, reply: reply, cc: cc, invoker: invoker, cs: cs,
		mt:      reply.ProtoReflect().Type(), // before any attempt writes to reply
		base:    make([]grpc.CallOption, 0, len(opts)+4),
		results: make(chan hedgeResult, c.plan.maxAttempts),
		wg:      new(sync.WaitGroup),
		hedging: c.plan.hedge,
		timing:  c.plan.beside,
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
	defer h.finish(c)
	return c.run(&h, c.firstKind(), cancelableAttempt)
}

// attempt returns the first attempt of the group (the engine's run opens
// it), which send then launches.
func (h *hedger) attempt() *attempt {
	h.first = &hedgeAttempt{attempt: new(attempt), reply: h.reply}
	return h.first.attempt
}

// send runs a hedged group from its first attempt a (opened by the
// engine): it launches a, then hedges, and retries a failed attempt at
// once while others run, opening and settling each attempt with the
// engine, until one answers or none may follow. The outcome is settled:
// it is the call's.
func (h *hedger) send(c *call, a *attempt) outcome {
	h.launch(c, h.first)
	h.arm(c)
	for {
		var hedgeDue <-chan time.Time
		if h.timer != nil {
			hedgeDue = h.timer.C()
		}
		select {
		case res := <-h.results:
			if done, err := h.answer(c, res); done {
				return outcome{err: err, settled: true}
			}
		case <-hedgeDue:
			h.timer = nil
			if h.yields(c) {
				continue
			}
			if h.next == kindRetry {
				h.timedOut(c)
				continue
			}
			if reason, _ := h.open(c, kindHedge); reason != "" {
				c.refuse(reason, semconv.EventHedgeRefused)
				h.hedging = false
				continue
			}
			c.event(semconv.EventHedgeSent, semconv.AttrPreviousAttempts.Int(c.tally.sent-1))
			h.arm(c)
		case <-c.ctx.Done():
			return outcome{err: status.FromContextError(c.ctx.Err()).Err(), settled: true}
		}
	}
}

// answer handles a finished attempt; done says the call is over, with err.
func (h *hedger) answer(c *call, res hedgeResult) (done bool, err error) {
	h.inflight--
	a := res.a.attempt
	if reason, perr := c.atPick(a); reason != "" {
		if h.inflight == 0 || a.kind == kindFirst {
			return true, c.notSent(reason, perr)
		}
		// A fail-over retry with nowhere to go that the budget would not
		// pay for: not sent. Nothing more is sent; an attempt still
		// running may yet answer.
		h.hedging, h.timing = false, false
		h.arm(c)
		c.refuse(reason, semconv.EventRetryRefused)
		return false, nil
	}
	v := c.settle(a, res.err, res.a.trailer)
	h.winner = res.a // until proven otherwise
	if res.err == nil {
		return true, nil
	}
	if !v.retry {
		if v.reason != "" && !v.reason.info().fatal && h.inflight > 0 {
			// Refused, but others still run; one of them may succeed.
			// Nothing more is sent.
			h.winner, h.hedging, h.timing = nil, false, false
			h.arm(c)
			c.refuse(v.reason, semconv.EventRetryRefused)
			return false, nil
		}
		return true, c.conclude(v)
	}
	h.winner = nil
	if h.inflight > 0 {
		v.delay = 0
	}
	c.scheduled(v)
	if err := c.wait(v.delay); err != nil {
		return true, err
	}
	if reason, err := h.open(c, kindRetry); reason != "" {
		if h.inflight == 0 {
			h.winner = res.a
			return true, c.notSent(reason, err)
		}
		h.hedging, h.timing = false, false
		h.arm(c)
		return false, nil
	}
	h.arm(c)
	return false, nil
}

// open opens an attempt of the given kind with the engine and launches it.
func (h *hedger) open(c *call, kind attemptKind) (Reason, error) {
	ha := &hedgeAttempt{attempt: new(attempt), reply: h.reply}
	if reason, err := c.open(ha.attempt, kind, cancelableAttempt); reason != "" {
		return reason, err
	}
	h.launch(c, ha)
	return "", nil
}

// launch runs attempt ha on its own goroutine.
func (h *hedger) launch(c *call, ha *hedgeAttempt) {
	if len(h.all) > 0 {
		ha.reply = h.mt.New().Interface()
	}
	creds, credsOpt := newAttemptCreds(c, &h.cs)
	creds.prepare(c, ha.attempt)
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
}

func runHedgeAttempt(wg *sync.WaitGroup, results chan<- hedgeResult, ha *hedgeAttempt, invoker grpc.UnaryInvoker, method string, req any, cc *grpc.ClientConn, opts []grpc.CallOption) {
	defer wg.Done()
	err := invoker(ha.ctx, method, req, ha.reply, cc, opts...)
	for ha.creds.collect() { // it picked an endpoint it avoids: pick again
		err = invoker(ha.ctx, method, req, ha.reply, cc, opts...)
	}
	results <- hedgeResult{a: ha, err: err}
}

// timedOut sends a retry beside the latest attempt, which has not answered
// within the per-attempt timeout, if one may be sent; if not, the attempts
// in flight run on and no more retries are sent on a timeout.
func (h *hedger) timedOut(c *call) {
	err := status.Errorf(codes.DeadlineExceeded, "stormguard: no answer within the per-attempt timeout (%v)", c.route.perAttempt)
	if f := c.client.o.retryIf; f != nil && !f(c.ctx, c.route.method, err) {
		h.keep(c, ReasonRetryIf)
		return
	}
	if c.pay == payFailover {
		c.pay = payBudget
	}
	c.scheduled(verdict{err: err})
	if reason, _ := h.open(c, kindRetry); reason != "" {
		h.keep(c, reason)
		return
	}
	h.arm(c)
}

// yields counts a first attempt that ran past its delay, and reports
// whether the hedge or retry due now yields to the target's overload (see
// yield): then it is not sent, the slow attempt runs on, and no more are
// sent on that timer.
func (h *hedger) yields(c *call) bool {
	now := c.client.now()
	if !h.late {
		h.late = true
		c.route.yield.late(now)
	}
	if !c.route.yield.yields(now) {
		return false
	}
	if h.next == kindRetry {
		h.keep(c, ReasonOverload)
		return true
	}
	c.refuse(ReasonOverload, semconv.EventHedgeRefused)
	h.hedging = false
	h.arm(c) // a per-attempt timeout may still be due
	return true
}

// keep records that no retry was sent on a per-attempt timeout, for
// reason.
func (h *hedger) keep(c *call, reason Reason) {
	c.refuse(reason, semconv.EventTimeoutKept)
	h.timing = false
	h.arm(c) // a hedge may still be due
}

// arm sets the timer of the next hedge or per-attempt timeout retry, if
// one may be sent: whichever is due first.
func (h *hedger) arm(c *call) {
	if h.timer != nil {
		h.timer.Stop()
		h.timer = nil
	}
	if c.tally.sent >= c.plan.maxAttempts {
		return
	}
	var d time.Duration
	if h.hedging && c.tally.hedges < c.rule.maxHedges {
		d = c.rule.hedgeDelay
		if d == 0 && c.route.lat != nil {
			var ok bool
			if d, ok = c.route.lat.hedgeDelay(); !ok {
				d = 0 // adaptive, not warm yet: no hedge
			}
		}
	}
	h.next = kindHedge
	if p := c.route.perAttempt; h.timing && p > 0 && (d == 0 || p < d) {
		d, h.next = p, kindRetry
	}
	if d > 0 {
		h.timer = c.client.newTimer(d)
		if !h.watched {
			h.watched = true
			c.route.yield.watched(c.client.now())
		}
	}
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
		c.end(res.a.attempt, res.err, true)
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
