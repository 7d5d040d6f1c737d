package fleetsim

import (
	"math"
	"math/rand/v2"
	"time"
)

// The states of a call slot.
const (
	stateLive uint8 = iota
	stateEnded
)

// backend is one server of the target: its workers, its queue (a ring of
// call slots), its throttle bucket and its server policy.
type backend struct {
	busy   int
	served int64 // requests started, for the latency tail's share
	q      []int32
	head   int
	n      int
	tokens float64
	last   int64
	primed bool // the throttle bucket has been filled
	srv    Server
	// held is the attempts its server policy holds in its own queue (see
	// Held), in order of arrival: call slots and their generations. A
	// slot that left is skipped when reached.
	held    []heldRef
	polling bool // poll runs: a poll from within it returns at once
}

// heldRef is a held attempt's call slot, as of its generation.
type heldRef struct {
	idx int32
	gen uint32
}

func (b *backend) enqueue(i int32) {
	b.q[(b.head+b.n)%len(b.q)] = i
	b.n++
}

func (b *backend) dequeue() int32 {
	i := b.q[b.head]
	b.head = (b.head + 1) % len(b.q)
	b.n--
	return i
}

// take takes a token from the backend's throttle bucket (limit a second,
// at most a tenth of a second's worth banked), and reports whether there
// was one.
func (b *backend) take(now int64, limit float64) bool {
	burst := max(1, limit/10)
	if !b.primed {
		b.primed, b.tokens, b.last = true, burst, now
	}
	b.tokens = min(burst, b.tokens+float64(now-b.last)*limit/1e9)
	b.last = now
	if b.tokens >= 1 {
		b.tokens--
		return true
	}
	return false
}

// sim is one run.
type sim struct {
	cfg      Config
	env      Env
	rand     *rand.Rand // the kernel's own (network jitter), apart from the policies'
	q        queue
	calls    []Call
	free     []int32
	clients  []Client
	backends []backend
	sources  []*source
	// closed-loop clients: the calls each has left to make, the number of
	// its next call, and its workers' think time (nil when no group is
	// closed-loop)
	left, nextK []int32
	think       []time.Duration
	marks       bool // the client policy's retries say they are retries
	maxAttempts int
	dur, dl     int64
	m           *meter
}

// base is the virtual clock's origin: any fixed instant does.
var base = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Run runs the configuration and returns what it measured. It returns an
// error only for a configuration it cannot run (see Config.Validate).
func Run(cfg Config) (*Result, error) {
	cfg.fill()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	start := time.Now()
	s := newSim(cfg)
	s.loop()
	res := s.m.result(&s.cfg)
	res.Wall = time.Since(start)
	return res, nil
}

func newSim(cfg Config) *sim {
	n := cfg.Clients()
	s := &sim{
		cfg:         cfg,
		env:         Env{Rand: rand.New(rand.NewPCG(cfg.Seed, 0x5eed)), Base: base, Backends: cfg.Backends.M, Clients: n},
		rand:        rand.New(rand.NewPCG(cfg.Seed, 0x7e7)),
		clients:     make([]Client, n),
		backends:    make([]backend, cfg.Backends.M),
		marks:       cfg.Client.MarksRetries,
		maxAttempts: max(cfg.Client.MaxAttempts, 1),
		dur:         int64(cfg.Duration),
		dl:          int64(cfg.Deadline),
	}
	for i := range s.clients {
		s.clients[i] = cfg.Client.New(&s.env, i)
	}
	for i := range s.backends {
		b := &s.backends[i]
		if cfg.Backends.Workers > 0 {
			b.q = make([]int32, cfg.Backends.Queue)
		}
		if cfg.Server != nil {
			b.srv = cfg.Server.New(&s.env, i)
		}
	}
	first := 0
	for _, g := range cfg.Groups {
		if g.Workers == 0 {
			s.sources = append(s.sources, newSource(cfg.Seed, first, g))
		} else {
			s.closedLoop(first, g)
		}
		first += g.Clients
	}
	s.m = newMeter(&cfg, n)
	return s
}

// closedLoop starts the workers of a closed-loop group: each client's
// workers send their first calls at a seeded phase within the first
// millisecond.
func (s *sim) closedLoop(first int, g Group) {
	if s.left == nil {
		s.left = make([]int32, len(s.clients))
		s.nextK = make([]int32, len(s.clients))
		s.think = make([]time.Duration, len(s.clients))
	}
	for i := first; i < first+g.Clients; i++ {
		s.left[i], s.think[i] = int32(g.Calls), g.Think
		for range min(g.Workers, g.Calls) {
			s.q.push(event{at: int64(Phase(s.cfg.Seed, i, time.Millisecond)), kind: evArrive, idx: int32(i)})
		}
	}
}

func (s *sim) at(t int64) time.Time { return base.Add(time.Duration(t)) }

// loop runs the events and the open-loop arrivals in time order until
// none is left.
func (s *sim) loop() {
	probe := s.cfg.Probe != nil
	for {
		ta, src := int64(math.MaxInt64), -1
		for i, so := range s.sources {
			if t := so.peek(); t < ta && t < s.dur {
				ta, src = t, i
			}
		}
		if next := min(ta, s.q.top()); probe && next >= int64(s.cfg.ProbeAt) {
			probe = false
			s.cfg.Probe(s.clients, s.at(int64(s.cfg.ProbeAt)))
		}
		switch {
		case len(s.q.ev) > 0 && s.q.ev[0].at <= ta:
			s.handle(s.q.pop())
		case src >= 0:
			client, k := s.sources[src].next()
			s.arrive(ta, client, k)
		default:
			return
		}
	}
}

func (s *sim) handle(e event) {
	if e.kind == evArrive {
		s.arriveClosed(e.at, int(e.idx))
		return
	}
	c := &s.calls[e.idx]
	if c.gen != e.gen {
		return // the slot was freed and reused
	}
	switch e.kind {
	case evSend:
		s.retryDue(c, e.at)
	case evReply:
		s.onReply(c, e.at, Outcome{Code: Code(e.aux >> 16), Backend: int(e.aux & 0xffff), Pushback: c.pushback, Dry: c.dry})
	case evDone:
		s.finish(c, e.at, e.aux == 1)
	case evDeadline:
		s.onDeadline(c, e.at)
	}
}

// alloc returns a fresh call slot.
func (s *sim) alloc() *Call {
	var i int32
	if n := len(s.free); n > 0 {
		i = s.free[n-1]
		s.free = s.free[:n-1]
	} else {
		s.calls = append(s.calls, Call{})
		i = int32(len(s.calls) - 1)
	}
	c := &s.calls[i]
	*c = Call{idx: i, gen: c.gen}
	return c
}

func (s *sim) release(c *Call) {
	c.gen++
	s.free = append(s.free, c.idx)
}

func (s *sim) arriveClosed(now int64, client int) {
	if s.left[client] == 0 {
		return
	}
	s.left[client]--
	k := s.nextK[client]
	s.nextK[client]++
	s.arrive(now, client, int(k))
}

// arrive starts call k of client at now.
func (s *sim) arrive(now int64, client, k int) {
	c := s.alloc()
	c.Client, c.K, c.due, c.Due = client, k, now, time.Duration(now)
	c.dl = now + s.dl
	c.Deadline = s.at(c.dl)
	s.m.call(c)
	if !s.clients[client].Begin(c, s.at(now)) {
		s.m.refusedFirst++
		s.end(c, now, Unavailable)
		return
	}
	s.send(c, now)
}

// send sends the call's next attempt at now.
func (s *sim) send(c *Call, now int64) {
	b, ok := s.clients[c.Client].Pick(c, s.at(now), len(s.backends))
	if !ok {
		if c.Attempts == 0 {
			s.m.refusedFirst++
			s.end(c, now, Unavailable)
		} else {
			s.m.refusedRetry++
			s.end(c, now, c.last)
		}
		return
	}
	c.Attempts++
	c.backend, c.sent, c.inflight, c.svr = b, now, true, false
	s.m.sent(c, now)
	s.atServer(c, now)
}

// atServer runs the attempt's arrival at its backend: its server policy
// admits it to the handler, refuses it, or holds it in its own queue.
func (s *sim) atServer(c *Call, now int64) {
	b := c.backend
	bk := &s.backends[b]
	if bk.srv == nil {
		s.handler(c, now)
		return
	}
	retry := c.Attempts > 1 && s.marks
	a, o := bk.srv.Admit(c, s.at(now), retry, retry && c.budgeted)
	switch a {
	case Admitted:
		c.svr = true
		s.handler(c, now)
	case Held:
		c.held = true
		s.m.serverHeld++
		bk.held = append(bk.held, heldRef{idx: c.idx, gen: c.gen})
		s.watchDeadline(c)
	default:
		s.m.serverRefused++
		o.Backend = b
		s.reply(c, now, o)
	}
	s.poll(b, now)
}

// poll asks backend b's server policy about its held attempts, in order
// of arrival, at now, until one is still held: an admitted one goes to
// the handler, a refused one is answered. Handling one may end another at
// the handler and free a place: the loop asks again.
func (s *sim) poll(b int, now int64) {
	bk := &s.backends[b]
	if bk.polling || len(bk.held) == 0 {
		return
	}
	bk.polling = true
	defer func() { bk.polling = false }()
	for len(bk.held) > 0 {
		r := bk.held[0]
		c := &s.calls[r.idx]
		if c.gen != r.gen || !c.held || c.dl <= now {
			// It left, or leaves now (its deadline's event takes it out).
			bk.held = bk.held[1:]
			continue
		}
		a, o := bk.srv.Decide(c, s.at(now))
		if a == Held {
			return
		}
		bk.held = bk.held[1:]
		c.held = false
		if a == Admitted {
			c.svr = true
			s.handler(c, now)
			continue
		}
		s.m.serverRefused++
		o.Backend = b
		s.reply(c, now, o)
	}
}

// handler runs the attempt at its backend's handler, at now: the
// failure's answer, or its workers and queue.
func (s *sim) handler(c *Call, now int64) {
	bk := &s.backends[c.backend]
	c.handled++
	s.m.handled(c, now)
	f := &s.cfg.Failure
	in := f.Mode != Healthy && now >= int64(f.Start) && now < int64(f.End)
	switch {
	case in && (f.Mode == Outage || (f.Mode == BackendDead && c.backend == 0)):
		s.failNow(c, now, Unavailable, NoPushback)
	case in && f.Mode == Independent && s.draw(c, saltFail) < f.P:
		s.failNow(c, now, Unavailable, NoPushback)
	case in && f.Mode == Throttling && !bk.take(now, f.Limit):
		s.failNow(c, now, ResourceExhausted, f.Pushback)
	default:
		s.serve(c, bk, now)
	}
}

// The salts of the kernel's draws: whether an attempt fails, its service
// time, a call's jitter.
const (
	saltFail uint64 = iota
	saltService
	saltJitter
)

// draw is the call's draw for its current attempt (saltFail: does it
// fail).
func (s *sim) draw(c *Call, salt uint64) float64 {
	if s.cfg.Draw != nil && salt == saltFail {
		return s.cfg.Draw(c.Client, c.K, c.Attempts, c.Due)
	}
	return draw(s.cfg.Seed, salt, c.Client, c.K, c.Attempts)
}

// failNow answers the attempt at once, from the handler.
func (s *sim) failNow(c *Call, now int64, code Code, pushback time.Duration) {
	b := c.backend
	bk := &s.backends[b]
	dry := false
	if bk.srv != nil {
		dry = bk.srv.Done(c, s.at(now), code, false)
	}
	s.reply(c, now, Outcome{Code: code, Pushback: pushback, Backend: b, Dry: dry})
	s.poll(b, now)
}

// serve gives the attempt to a worker, or queues it, or refuses it when
// the queue is full.
func (s *sim) serve(c *Call, bk *backend, now int64) {
	w := s.cfg.Backends.Workers
	switch {
	case w == 0:
		s.start(c, now, false)
	case bk.busy < w:
		bk.busy++
		s.start(c, now, true)
	case bk.n < len(bk.q):
		bk.enqueue(c.idx)
		s.watchDeadline(c)
	default:
		s.failNow(c, now, Unavailable, NoPushback) // the queue is full
	}
}

// start starts serving the attempt at now, on a worker of its backend
// (worker) or on none (the backends' workers are unbounded).
func (s *sim) start(c *Call, now int64, worker bool) {
	d := s.serviceTime(c, &s.backends[c.backend], now)
	if d <= 0 {
		s.finish(c, now, worker)
		return
	}
	if now+d >= c.dl && c.state == stateLive {
		s.watchDeadline(c)
	}
	aux := int32(0)
	if worker {
		aux = 1
	}
	s.q.push(event{at: now + d, kind: evDone, idx: c.idx, gen: c.gen, aux: aux})
}

// serviceTime is how long the attempt takes a worker of bk, starting at
// now. In a latency tail, exactly a share P of each backend's requests
// are slow (every request that takes the count of slow ones to the next
// whole number), so that the tail costs every policy the same capacity
// whichever of its attempts are served.
func (s *sim) serviceTime(c *Call, bk *backend, now int64) int64 {
	d := float64(s.cfg.Backends.Service)
	if d == 0 {
		return 0
	}
	d *= 0.75 + 0.5*draw(s.cfg.Seed, saltService, c.Client, c.K, c.Attempts)
	f := &s.cfg.Failure
	if now >= int64(f.Start) && now < int64(f.End) {
		switch f.Mode {
		case CapacityDrop:
			d *= f.Factor
		case LatencyTail:
			if n := bk.served; math.Floor(float64(n+1)*f.P) > math.Floor(float64(n)*f.P) {
				d *= f.Factor
			}
			bk.served++
		}
	}
	return int64(d)
}

// finish ends the attempt at the handler, at now: it succeeded (however
// late), and its worker (if it held one) takes the next queued request.
func (s *sim) finish(c *Call, now int64, worker bool) {
	abandoned := c.state == stateEnded || now > c.dl
	if abandoned {
		s.m.wasted++
	}
	b := c.backend
	bk := &s.backends[b]
	if bk.srv != nil && c.svr {
		_ = bk.srv.Done(c, s.at(now), OK, abandoned) // never dry on a success
	}
	s.reply(c, now, Outcome{Code: OK, Pushback: NoPushback, Backend: b})
	switch {
	case !worker:
	case bk.n == 0:
		bk.busy--
	default:
		s.start(&s.calls[bk.dequeue()], now, true)
	}
	s.poll(b, now) // the place the server policy freed, once the worker is free
}

// reply sends the attempt's outcome back to its client, which gets it an
// RTT later (or at once).
func (s *sim) reply(c *Call, now int64, o Outcome) {
	c.dry = o.Dry
	at := now
	if rtt := s.cfg.Backends.RTT; rtt > 0 {
		at += int64(float64(rtt) * (0.5 + s.rand.Float64()))
	}
	if c.state == stateLive && at >= c.dl {
		s.watchDeadline(c)
	}
	if at == now && c.state == stateLive && at < c.dl {
		s.onReply(c, now, o)
		return
	}
	c.pushback = o.Pushback
	s.q.push(event{at: at, kind: evReply, idx: c.idx, gen: c.gen, aux: int32(o.Code)<<16 | int32(o.Backend)})
}

// watchDeadline makes sure the call's deadline event is scheduled.
func (s *sim) watchDeadline(c *Call) {
	if !c.dlEv {
		c.dlEv = true
		s.q.push(event{at: c.dl, kind: evDeadline, idx: c.idx, gen: c.gen})
	}
}

// onReply is the attempt's outcome reaching its client at now.
func (s *sim) onReply(c *Call, now int64, o Outcome) {
	c.inflight = false
	if c.state == stateEnded {
		s.release(c)
		return
	}
	v := s.clients[c.Client].Settle(c, s.at(now), o)
	switch {
	case o.Code == OK:
		s.end(c, now, OK)
	case !v.Retry || c.Attempts >= s.maxAttempts || now+int64(v.Delay) >= c.dl:
		s.end(c, now, o.Code)
	case v.Delay <= 0:
		c.last = o.Code
		s.retryDue(c, now)
	default:
		c.last = o.Code
		s.q.push(event{at: now + int64(v.Delay), kind: evSend, idx: c.idx, gen: c.gen})
	}
}

// retryDue is a retry of the call falling due at now.
func (s *sim) retryDue(c *Call, now int64) {
	if c.state == stateEnded {
		return
	}
	if !s.clients[c.Client].Send(c, s.at(now)) {
		s.m.refusedRetry++
		s.end(c, now, c.last)
		return
	}
	s.send(c, now)
}

// onDeadline is the call's deadline: an attempt still out fails with
// DEADLINE_EXCEEDED (its client is told), and the call ends.
func (s *sim) onDeadline(c *Call, now int64) {
	if c.state == stateEnded {
		return
	}
	if c.inflight {
		s.clients[c.Client].Settle(c, s.at(now), Outcome{Code: DeadlineExceeded, Pushback: NoPushback, Backend: c.backend})
	}
	if c.held {
		// It leaves its server's queue: nothing will answer it.
		s.backends[c.backend].srv.Leave(c, s.at(now))
		s.m.serverLeft++
		c.held, c.inflight = false, false
	}
	s.end(c, now, DeadlineExceeded)
}

// end ends the call at now with code, and frees its slot unless an
// attempt of it is still out.
func (s *sim) end(c *Call, now int64, code Code) {
	c.state = stateEnded
	s.m.end(c, now, code)
	s.clients[c.Client].End(c, s.at(now), code == OK)
	if s.left != nil && s.left[c.Client] > 0 {
		s.q.push(event{at: now + int64(s.think[c.Client]), kind: evArrive, idx: int32(c.Client)})
	}
	if !c.inflight {
		s.release(c)
	}
}
