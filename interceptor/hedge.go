package interceptor

import (
	"sync"
	"time"

	"github.com/stormguard/stormguard/semconv"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/stormguard/stormguard/internal/clock"
	"github.com/stormguard/stormguard/internal/engine"
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
	next     engine.Kind // what the timer sends: engine.Hedge or engine.Retry
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

// runHedged runs a hedged call of shape sh. The hedger lives on its
// stack: the attempts' goroutines see only their own attempt.
func runHedged(c *call, sh shape, method string, req any, reply proto.Message, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts []grpc.CallOption, cs callSettings) error {
	h := hedger{method: method, req: req, reply: reply, cc: cc, invoker: invoker, cs: cs,
		mt:      reply.ProtoReflect().Type(), // before any attempt writes to reply
		base:    make([]grpc.CallOption, 0, len(opts)+4),
		results: make(chan hedgeResult, c.e.MaxAttempts()),
		wg:      new(sync.WaitGroup),
		hedging: sh.hedge,
		timing:  sh.beside,
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
	return c.run(&h, c.e.FirstKind(), cancelableAttempt)
}

// attempt returns the first attempt of the group (the call's run opens
// it), which send then launches.
func (h *hedger) attempt() *attempt {
	h.first = &hedgeAttempt{attempt: new(attempt), reply: h.reply}
	return h.first.attempt
}

// send runs a hedged group from its first attempt a (opened by run): it
// launches a, then hedges, and retries a failed attempt at once while
// others run, opening each attempt and taking each that comes back
// through the call's one step, until one answers or none may follow. The
// outcome is settled: it is the call's.
func (h *hedger) send(c *call, a *attempt) outcome {
	h.launch(c, h.first)
	h.arm(c)
	for {
		var due <-chan time.Time
		if h.timer != nil {
			due = h.timer.C()
		}
		select {
		case res := <-h.results:
			if done, err := h.answer(c, res); done {
				return outcome{err: err, settled: true}
			}
		case <-due:
			h.timer = nil
			h.fire(c)
		case <-c.ctx.Done():
			return outcome{err: status.FromContextError(c.ctx.Err()).Err(), settled: true}
		}
	}
}

// answer takes a finished attempt through the call's step, with the
// attempts still in flight; done says the call is over, with err. An
// attempt refused at its pick (a fail-over retry with nowhere to go that
// the budget would not pay for) was never sent; nor is a retry the
// admission refuses. While others run, nothing more is sent then, and
// one of them may yet answer.
func (h *hedger) answer(c *call, res hedgeResult) (done bool, err error) {
	h.inflight--
	a := res.a.attempt
	reason, err := c.atPick(a)
	sent := reason == ""
	if sent {
		var next engine.Next
		switch next, err = c.step(a, outcome{err: res.err, tr: res.a.trailer}, h.inflight); {
		case next == engine.Done:
			h.winner = res.a
			return true, err
		case next == engine.Wait:
			h.refused(c, "", "") // refused, recorded by the step
			return false, nil
		case err != nil:
			return true, err // the caller left
		}
		if reason, err = h.open(c, engine.Retry); reason == "" {
			h.arm(c)
			return false, nil
		}
		if h.inflight == 0 {
			h.winner = res.a
		}
	}
	if h.inflight == 0 || (!sent && a.Kind == engine.First) {
		return true, c.notSent(reason, err)
	}
	if sent {
		reason = "" // recorded by the admission, if at all
	}
	h.refused(c, reason, semconv.EventRetryRefused)
	return false, nil
}

// fire sends the hedge, or the retry beside the latest attempt, whose
// timer fired, if the rules and the admission allow one; the first time,
// it counts the first attempt as one that ran past its delay (see
// engine.Yield). A hedge that may not be sent stops the hedging; the
// attempts in flight run on.
func (h *hedger) fire(c *call) {
	now := c.client.now()
	if !h.late {
		h.late = true
		c.e.Late(now)
	}
	if h.next == engine.Retry {
		h.timedOut(c, now)
		return
	}
	reason := reasonOf(c.e.Peek(now, engine.Hedge, false))
	if reason == "" {
		reason, _ = h.open(c, engine.Hedge)
	}
	if reason != "" {
		h.refused(c, reason, semconv.EventHedgeRefused) // a per-attempt timeout may still be due
		return
	}
	h.arm(c)
}

// timedOut sends a retry beside the latest attempt, which has not answered
// within the per-attempt timeout at now, if one may be sent; if not, the
// attempts in flight run on and no more retries are sent on a timeout.
func (h *hedger) timedOut(c *call, now time.Time) {
	c.e.Beside()
	reason := c.e.MayFollow(c)
	if reason == 0 {
		reason = c.e.Peek(now, engine.Retry, true)
	}
	if reason != 0 {
		h.refused(c, reasonOf(reason), semconv.EventTimeoutKept)
		return
	}
	err := c.timeoutError()
	c.scheduled(engine.Verdict{}, err, nil)
	if reason, _ := h.open(c, engine.Retry); reason != "" {
		h.refused(c, reason, semconv.EventTimeoutKept)
		return
	}
	h.arm(c)
}

// open opens an attempt of the given kind and launches it.
func (h *hedger) open(c *call, kind engine.Kind) (Reason, error) {
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

// refused records that what event says (a retry after a failure, a hedge,
// a retry beside a slow attempt) was refused for reason, and sends no
// more of it: after a failure, nothing more is sent; the attempts in
// flight may yet answer, and a timer of the other kind may still be due.
// An empty reason records nothing.
func (h *hedger) refused(c *call, reason Reason, event string) {
	if reason != "" {
		c.refuse(reason, event)
	}
	switch event {
	case semconv.EventHedgeRefused:
		h.hedging = false
	case semconv.EventTimeoutKept:
		h.timing = false
	default:
		h.hedging, h.timing = false, false
	}
	h.arm(c)
}

// arm sets the timer of the next hedge or per-attempt timeout retry, if
// one may be sent: whichever is due first (engine.Call.NextTimer).
func (h *hedger) arm(c *call) {
	if h.timer != nil {
		h.timer.Stop()
		h.timer = nil
	}
	var d time.Duration
	if d, h.next = c.e.NextTimer(h.hedging, h.timing); d <= 0 {
		return
	}
	h.timer = c.client.newTimer(d)
	if !h.watched {
		h.watched = true
		c.e.Watched(c.client.now())
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
