package outlier

import (
	"encoding/json"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/serviceconfig"

	"github.com/stormguard/stormguard/internal/clock"
	"github.com/stormguard/stormguard/internal/window"
)

func init() { balancer.Register(builder{name: Name, clk: clock.Real{}}) }

// builder builds the policy. Tests register builders of their own, under
// other names, with a fake clock, a hook to see the balancers built and
// a MeterProvider (nil: SetMeterProvider's).
type builder struct {
	name    string
	clk     clock.Clock
	onBuild func(*outlierBalancer)
	mp      metric.MeterProvider
}

func (bd builder) Name() string { return bd.name }

func (bd builder) ParseConfig(js json.RawMessage) (serviceconfig.LoadBalancingConfig, error) {
	return parseConfig(js)
}

func (bd builder) Build(cc balancer.ClientConn, opts balancer.BuildOptions) balancer.Balancer {
	b := &outlierBalancer{
		cc:      cc,
		opts:    opts,
		clk:     bd.clk,
		poke:    make(chan struct{}, 1),
		stop:    make(chan struct{}),
		stopped: make(chan struct{}),
		eps:     resolver.NewEndpointMap[*endpoint](),
		subs:    map[*subConn]struct{}{},
		met:     newMetrics(bd.mp, opts.Target.String()),
	}
	b.wcc = &childCC{ClientConn: cc, b: b}
	go b.run()
	if bd.onBuild != nil {
		bd.onBuild(b)
	}
	return b
}

// endpoint is one endpoint's counters and ejection state.
type endpoint struct {
	// Counted by the picks' Done callbacks since the last evaluation.
	ok, fail atomic.Uint32
	// ejected is read by the picker.
	ejected atomic.Bool

	// win holds the outcomes folded in by the evaluations, in buckets of
	// Interval covering Window (kinds kindOK and kindFail), on the
	// balancer's time line. Written under outlierBalancer.mu.
	win *window.Counter

	// Guarded by outlierBalancer.mu.
	ejectedAt time.Time
	times     int       // ejections in a row (the multiplier)
	since     time.Time // last ejection, un-ejection or decay of times
	ejections int       // total, for tests and the report
}

// The kinds of outcome an endpoint's window counts.
const (
	kindOK = iota
	kindFail
)

// counts is the outcomes of some buckets, each at most math.MaxUint32
// (saturated).
type counts struct{ ok, fail uint32 }

// outlierBalancer is the policy: it wraps the child and ejects endpoints.
type outlierBalancer struct {
	cc   balancer.ClientConn
	wcc  *childCC
	opts balancer.BuildOptions
	clk  clock.Clock
	met  *metrics

	// childMu serialises every call into the child and its listeners: gRPC's
	// own calls, and the ejections made by the timer and the evaluator.
	childMu   sync.Mutex
	child     balancer.Balancer
	childName string

	closed atomic.Bool
	// cfg is the current configuration, read by the Done callbacks.
	cfg atomic.Pointer[lbConfig]
	// ticking is whether the interval timer runs; Done starts it.
	ticking atomic.Bool

	poke          chan struct{} // an endpoint collected failures: evaluate now
	stop, stopped chan struct{}

	// mu guards the endpoint maps, the windows and the timer. It is never
	// held while calling the child.
	mu     sync.Mutex
	eps    *resolver.EndpointMap[*endpoint]
	byAddr map[string]*endpoint
	subs   map[*subConn]struct{}
	// origin is the zero of the windows' time line: their buckets start
	// there (at the first evaluation, or when the windows were remade for
	// a new Window or Interval); zero until then.
	origin    time.Time
	lastEval  time.Time
	stopTimer func() bool
}

func (b *outlierBalancer) isClosed() bool { return b.closed.Load() }

// UpdateClientConnState switches the child if its name changed, updates the
// endpoints, and passes the resolver state on to the child.
func (b *outlierBalancer) UpdateClientConnState(s balancer.ClientConnState) error {
	lc, _ := s.BalancerConfig.(*lbConfig)
	if lc == nil {
		var err error
		if lc, err = parseConfig(nil); err != nil {
			return err
		}
	}
	b.childMu.Lock()
	defer b.childMu.Unlock()
	if b.isClosed() {
		return nil
	}
	if b.child == nil || b.childName != lc.cfg.Child {
		if b.child != nil {
			b.child.Close()
		}
		b.child, b.childName = lc.child.Build(b.wcc, b.opts), lc.cfg.Child
	}
	b.cfg.Store(lc)
	b.updateEndpoints(s.ResolverState, lc.cfg)
	b.syncAll()
	return b.child.UpdateClientConnState(balancer.ClientConnState{ResolverState: s.ResolverState, BalancerConfig: lc.childCfg})
}

// updateEndpoints replaces the endpoint set, keeping the counters and
// ejections of endpoints that stay, and un-ejects endpoints to stay within
// the caps.
func (b *outlierBalancer) updateEndpoints(rs resolver.State, cfg Config) {
	b.mu.Lock()
	defer b.mu.Unlock()
	nb := int(cfg.Window / cfg.Interval)
	resize := false
	if b.eps.Len() > 0 {
		w := b.eps.Values()[0].win
		resize = w.Slots() != nb || w.Width() != cfg.Interval
	}
	eps := resolver.NewEndpointMap[*endpoint]()
	byAddr := map[string]*endpoint{}
	for _, e := range rs.Endpoints {
		if _, dup := eps.Get(e); dup {
			continue
		}
		ep, ok := b.eps.Get(e)
		if !ok || resize {
			if ok && ep.ejected.Load() {
				ep.ejected.Store(false)
			}
			ep = &endpoint{win: window.New(nb, 2, cfg.Interval)}
		}
		for _, a := range e.Addresses {
			if k := canonicalAddr(a.Addr); byAddr[k] == nil {
				byAddr[k] = ep
			}
		}
		eps.Set(e, ep)
	}
	for e, ep := range b.eps.All() {
		if _, ok := eps.Get(e); !ok {
			ep.ejected.Store(false)
		}
	}
	b.eps, b.byAddr = eps, byAddr
	if resize {
		b.origin = b.clk.Now()
	}
	for sc := range b.subs {
		b.link(sc)
	}
	b.enforceCapsLocked(cfg)
}

// link points sc at the endpoint of its address. b.mu is held.
func (b *outlierBalancer) link(sc *subConn) {
	if sc.key == "" {
		sc.ep.Store(nil)
		return
	}
	sc.ep.Store(b.byAddr[sc.key]) // nil if unknown
}

// forget drops a SubConn that was shut down.
func (b *outlierBalancer) forget(sc *subConn) {
	b.mu.Lock()
	delete(b.subs, sc)
	b.mu.Unlock()
}

// syncAll tells the child the ejection state of every SubConn that it has
// not heard. b.childMu is held.
func (b *outlierBalancer) syncAll() {
	b.mu.Lock()
	subs := make([]*subConn, 0, len(b.subs))
	for sc := range b.subs {
		subs = append(subs, sc)
	}
	b.mu.Unlock()
	for _, sc := range subs {
		sc.syncEjection()
	}
}

// deliver tells the child about the SubConns of the changed endpoints.
// b.childMu is held.
func (b *outlierBalancer) deliver(changed []*endpoint) {
	if len(changed) == 0 {
		return
	}
	b.mu.Lock()
	var subs []*subConn
	for sc := range b.subs {
		ep := sc.ep.Load()
		for _, c := range changed {
			if ep == c {
				subs = append(subs, sc)
				break
			}
		}
	}
	b.mu.Unlock()
	for _, sc := range subs {
		sc.syncEjection()
	}
}

func (b *outlierBalancer) ResolverError(err error) {
	b.childMu.Lock()
	defer b.childMu.Unlock()
	if b.child != nil && !b.isClosed() {
		b.child.ResolverError(err)
	}
}

func (b *outlierBalancer) UpdateSubConnState(balancer.SubConn, balancer.SubConnState) {
	// Deprecated by gRPC: SubConns report through their StateListener.
}

func (b *outlierBalancer) ExitIdle() {
	b.childMu.Lock()
	defer b.childMu.Unlock()
	if b.child != nil && !b.isClosed() {
		b.child.ExitIdle()
	}
}

// Close stops the timer and the evaluator, then closes the child.
func (b *outlierBalancer) Close() {
	if b.closed.Swap(true) {
		return
	}
	b.mu.Lock()
	if b.stopTimer != nil {
		b.stopTimer()
		b.stopTimer = nil
	}
	b.mu.Unlock()
	close(b.stop)
	<-b.stopped
	b.childMu.Lock()
	defer b.childMu.Unlock()
	if b.child != nil {
		b.child.Close()
	}
}

// run evaluates the endpoints when Done pokes it (an endpoint collected
// failures), until Close.
func (b *outlierBalancer) run() {
	defer close(b.stopped)
	for {
		select {
		case <-b.stop:
			return
		case <-b.poke:
			b.evaluate(false)
		}
	}
}

// startTicking starts the interval timer unless it runs.
func (b *outlierBalancer) startTicking() {
	if b.ticking.Swap(true) {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	lc := b.cfg.Load()
	if b.isClosed() || lc == nil {
		b.ticking.Store(false)
		return
	}
	b.stopTimer = b.clk.AfterFunc(lc.cfg.Interval, b.tick)
}

// tick is the interval timer: evaluate, and run again unless idle.
func (b *outlierBalancer) tick() {
	if b.evaluate(true) {
		b.mu.Lock()
		defer b.mu.Unlock()
		if !b.isClosed() {
			b.stopTimer = b.clk.AfterFunc(b.cfg.Load().cfg.Interval, b.tick)
			return
		}
	}
	b.ticking.Store(false)
}

// pushbackKey is the trailer of a server that refuses on purpose and tells
// its callers when, or whether, to retry (gRFC A6).
const pushbackKey = "grpc-retry-pushback-ms"

// record counts one RPC's outcome for sc's endpoint. It runs on the RPC
// path: atomics only.
func (b *outlierBalancer) record(sc *subConn, di balancer.DoneInfo) {
	ep := sc.ep.Load()
	lc := b.cfg.Load()
	if ep == nil || lc == nil {
		return
	}
	switch c := codeOf(di.Err); {
	case c == cancelled:
		return
	case lc.codes&(1<<c) != 0 && len(di.Trailer[pushbackKey]) > 0:
		// The server refused on purpose (it sheds load, or says not to
		// retry): that is not a broken host, and ejecting it would push
		// its load onto the others. Not counted.
		return
	case lc.codes&(1<<c) != 0:
		n := ep.fail.Add(1)
		if trigger := uint32(max(lc.cfg.MinRequests/2, 1)); n%trigger == 0 {
			select {
			case b.poke <- struct{}{}:
			default:
			}
		}
	default:
		ep.ok.Add(1)
	}
	if !b.ticking.Load() {
		b.startTicking()
	}
}

// childCC is the balancer.ClientConn the child sees: its SubConns are
// wrapped, and its pickers too.
type childCC struct {
	balancer.ClientConn
	b *outlierBalancer
}

func (cc *childCC) NewSubConn(addrs []resolver.Address, opts balancer.NewSubConnOptions) (balancer.SubConn, error) {
	b := cc.b
	sc := &subConn{b: b, childListener: opts.StateListener}
	if len(addrs) == 1 {
		sc.key = canonicalAddr(addrs[0].Addr)
	}
	sc.done = func(di balancer.DoneInfo) { b.record(sc, di) }
	opts.StateListener = sc.stateUpdate
	real, err := cc.ClientConn.NewSubConn(addrs, opts)
	if err != nil {
		return nil, err
	}
	sc.SubConn = real
	b.mu.Lock()
	b.subs[sc] = struct{}{}
	b.link(sc)
	b.mu.Unlock()
	return sc, nil
}

func (cc *childCC) RemoveSubConn(s balancer.SubConn) {
	if sc, ok := s.(*subConn); ok {
		sc.Shutdown()
		return
	}
	cc.ClientConn.RemoveSubConn(s)
}

func (cc *childCC) UpdateAddresses(s balancer.SubConn, addrs []resolver.Address) {
	sc, ok := s.(*subConn)
	if !ok {
		cc.ClientConn.UpdateAddresses(s, addrs)
		return
	}
	cc.b.mu.Lock()
	sc.key = ""
	if len(addrs) == 1 {
		sc.key = canonicalAddr(addrs[0].Addr)
	}
	cc.b.link(sc)
	cc.b.mu.Unlock()
	cc.ClientConn.UpdateAddresses(sc.SubConn, addrs)
}

// UpdateState wraps the child's picker.
func (cc *childCC) UpdateState(s balancer.State) {
	if cc.b.isClosed() {
		return
	}
	s.Picker = &picker{child: s.Picker}
	cc.ClientConn.UpdateState(s)
}

// canonicalAddr spells an IP address and port as netip.AddrPort does (IPv4
// unmapped), so that a resolver's address and a peer's address compare
// equal; any other address is kept as it is.
func canonicalAddr(a string) string {
	ap, err := netip.ParseAddrPort(a)
	if err != nil {
		return a
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()).String()
}
