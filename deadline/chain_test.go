package deadline_test

import (
	"context"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/deadline"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// slack bounds how late a real context may fire, or how much later than
// computed a deadline may land, on a busy machine under -race.
const slack = 25 * time.Millisecond

// visit is what the last service of a chain saw of one call.
type visit struct {
	deadline time.Time
	hasDL    bool
	header   []string
	left     time.Duration // deadline.Remaining on entry
	doneAt   time.Time     // when the handler stopped
	finished bool          // the work completed (the context was not done first)
	err      error         // the context's error when it stopped early
}

// sink is the last service of a chain: it needs `need` of work per call
// (Get, List) and stops as soon as its context is done, reporting each
// call it ran on visits.
type sink struct {
	echov1.UnimplementedEchoServiceServer
	need   time.Duration
	visits chan visit
}

func newSink(need time.Duration) *sink { return &sink{need: need, visits: make(chan visit, 16)} }

func (s *sink) Register(r grpc.ServiceRegistrar) { echov1.RegisterEchoServiceServer(r, s) }

func (s *sink) work(ctx context.Context) error {
	v := visit{header: metadata.ValueFromIncomingContext(ctx, deadline.MetadataKey)}
	v.deadline, v.hasDL = ctx.Deadline()
	v.left, _ = deadline.Remaining(ctx)
	t := time.NewTimer(s.need)
	defer t.Stop()
	select {
	case <-t.C:
		v.finished = true
	case <-ctx.Done():
		v.err = ctx.Err()
	}
	v.doneAt = time.Now()
	s.visits <- v
	if v.err != nil {
		return status.FromContextError(v.err).Err()
	}
	return nil
}

func (s *sink) Get(ctx context.Context, r *echov1.GetRequest) (*echov1.GetResponse, error) {
	if err := s.work(ctx); err != nil {
		return nil, err
	}
	return &echov1.GetResponse{RequestId: r.GetRequestId()}, nil
}

func (s *sink) List(r *echov1.ListRequest, st grpc.ServerStreamingServer[echov1.ListResponse]) error {
	if err := s.work(st.Context()); err != nil {
		return err
	}
	for i := range r.GetCount() {
		if err := st.Send(&echov1.ListResponse{RequestId: r.GetRequestId(), Index: i}); err != nil {
			return err
		}
	}
	return nil
}

// next waits for the sink's next visit.
func (s *sink) next(t *testing.T) visit {
	t.Helper()
	v, ok := s.wait(2 * time.Second)
	if !ok {
		t.Fatal("the sink saw no call")
	}
	return v
}

func (s *sink) wait(d time.Duration) (visit, bool) {
	select {
	case v := <-s.visits:
		return v, true
	case <-time.After(d):
		return visit{}, false
	}
}

// unstarved runs a timed scenario, which returns what the sink saw (ok
// false: nothing), up to three times, until one ran on a machine calm
// enough to judge its timing. A run was starved when the sink saw nothing
// or its handler woke up more than slack after its own context's deadline:
// that is the runtime's timer and scheduling latency (the race detector,
// parallel test binaries on few CPUs), which no code of ours controls. The
// caller asserts on the last run.
func unstarved(t *testing.T, scenario func() (visit, bool)) {
	t.Helper()
	for i := 1; ; i++ {
		v, ok := scenario()
		late := v.doneAt.Sub(v.deadline)
		if i == 3 || (ok && (v.err == nil || late <= slack)) {
			return
		}
		t.Logf("run %d starved (sink saw a call: %v; its handler woke %v after its deadline): again", i, ok, late)
	}
}

// entered reports how many calls entered the sink's handler and were not
// yet taken by next.
func (s *sink) entered() int { return len(s.visits) }

// serve starts svc on a bufconn server with opts and stops it at cleanup.
func serve(t *testing.T, svc origin.Registerer, opts ...grpc.ServerOption) *origin.Listener {
	t.Helper()
	return serveOn(t, origin.Bufconn(), svc, opts...)
}

// serveOn starts svc on l with opts and stops it at cleanup.
func serveOn(t *testing.T, l *origin.Listener, svc origin.Registerer, opts ...grpc.ServerOption) *origin.Listener {
	t.Helper()
	srv := origin.Serve(l, svc, opts...)
	t.Cleanup(srv.Stop)
	return l
}

// network makes the listeners of a chain.
type network func(t *testing.T) *origin.Listener

var (
	bufconn network = func(*testing.T) *origin.Listener { return origin.Bufconn() }
	tcp     network = func(t *testing.T) *origin.Listener {
		l, err := origin.TCP()
		require.NoError(t, err)
		return l
	}
)

// dial returns an EchoService client of l, closed at cleanup, once its
// connection is ready. A call on a connection that is still being set up
// waits for it after the client interceptor wrote the header, so the
// header would overstate the time left by that wait (grpc-timeout, written
// by the transport, would not): the timing tests measure the steady state.
func dial(t *testing.T, l *origin.Listener, opts ...grpc.DialOption) echov1.EchoServiceClient {
	t.Helper()
	cc, err := l.Dial(opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cc.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	cc.Connect()
	for s := cc.GetState(); s != connectivity.Ready; s = cc.GetState() {
		require.True(t, cc.WaitForStateChange(ctx, s), "connection to %s not ready: %v", l.Target, s)
	}
	return echov1.NewEchoServiceClient(cc)
}

func serverOpts(s *deadline.Server, before ...grpc.UnaryServerInterceptor) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(append(before, s.Unary())...),
		grpc.ChainStreamInterceptor(s.Stream()),
	}
}

func clientOpts(c *deadline.Client) []grpc.DialOption {
	return []grpc.DialOption{grpc.WithChainUnaryInterceptor(c.Unary()), grpc.WithChainStreamInterceptor(c.Stream())}
}

// clock is time.Now that remembers the last instant it returned: given to
// a Client or Server as its clock (SetClientClock, SetServerClock), it
// tells the test exactly when that Client wrote its header, or that Server
// applied one.
type clock struct {
	mu   sync.Mutex
	last time.Time
}

func (c *clock) now() time.Time {
	t := time.Now()
	c.mu.Lock()
	c.last = t
	c.mu.Unlock()
	return t
}

func (c *clock) at() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last
}

// chain is client → A → B → C, every service behind a deadline.Server,
// every hop calling the next through a deadline.Client, forwarding with its
// handler's context.
type chain struct {
	client  echov1.EchoServiceClient
	a, b, c *deadline.Server
	sink    *sink
	margins time.Duration // the fixed margins of the three clients
	frac    float64       // the first client's MarginFraction
	// sent[i] is when client i (the caller, A, B) wrote its header;
	// arrived[i] when server i (A, B, C) applied it.
	sent, arrived [3]*clock
}

const hopMargin = 10 * time.Millisecond

func newChain(t *testing.T, net network, need time.Duration, cOpts []grpc.UnaryServerInterceptor, bToC deadline.ClientConfig) *chain {
	ch := &chain{sink: newSink(need), frac: 0.1}
	for i := range 3 {
		ch.sent[i], ch.arrived[i] = &clock{}, &clock{}
	}
	ch.a = deadline.NewServer(deadline.ServerConfig{})
	ch.b = deadline.NewServer(deadline.ServerConfig{})
	ch.c = deadline.NewServer(deadline.ServerConfig{})
	for i, s := range []*deadline.Server{ch.a, ch.b, ch.c} {
		deadline.SetServerClock(s, ch.arrived[i].now)
	}
	first := deadline.ClientConfig{Margin: hopMargin, MarginFraction: ch.frac}
	aToB := deadline.ClientConfig{Margin: hopMargin}
	ch.margins = first.Margin + aToB.Margin + bToC.Margin
	client := func(i int, c deadline.ClientConfig) *deadline.Client {
		dc := deadline.NewClient(c)
		deadline.SetClientClock(dc, ch.sent[i].now)
		return dc
	}
	lc := serveOn(t, net(t), ch.sink, serverOpts(ch.c, cOpts...)...)
	lb := serveOn(t, net(t), &origin.Hop{Next: dial(t, lc, clientOpts(client(2, bToC))...)}, serverOpts(ch.b)...)
	la := serveOn(t, net(t), &origin.Hop{Next: dial(t, lb, clientOpts(client(1, aToB))...)}, serverOpts(ch.a)...)
	ch.client = dial(t, la, clientOpts(client(0, first))...)
	return ch
}

// checkStats checks that no server refused the call or found its header
// malformed. Whether a server tightened its deadline depends on timing: a
// stall between a client writing the header and grpc writing grpc-timeout
// (say, the scheduler) shrinks the header's lead, and under about a
// millisecond the server keeps grpc's deadline. So Tightened is only logged.
func (ch *chain) checkStats(t *testing.T) {
	t.Helper()
	for _, s := range []*deadline.Server{ch.a, ch.b, ch.c} {
		st := s.Stats()
		assert.Zero(t, st.Refused)
		assert.Zero(t, st.Malformed)
		assert.LessOrEqual(t, st.Tightened, uint64(1))
	}
	t.Logf("tightened: A %d, B %d, C %d", ch.a.Stats().Tightened, ch.b.Stats().Tightened, ch.c.Stats().Tightened)
}

// inFlight is the time the last call spent between a client writing the
// header and the next server applying it, summed over the three hops.
func (ch *chain) inFlight() time.Duration {
	var d time.Duration
	for i := range 3 {
		d += ch.arrived[i].at().Sub(ch.sent[i].at())
	}
	return d
}

// doneBy is when, after the start of a call with the given timeout, C's
// handler context must be done: the timeout plus slack. Time in flight
// beyond what the margins absorb is added: a relative deadline (the header
// or grpc-timeout) cannot charge it, and under heavy load (the race
// detector, parallel test binaries) it can reach tens of milliseconds.
func (ch *chain) doneBy(timeout time.Duration) time.Duration {
	return timeout + slack + max(0, ch.inFlight()-ch.margins)
}

// latestC is the latest deadline C's handler may see for a call with
// deadline callerDL: the caller's deadline, less every margin, plus the
// time spent in flight (the header is relative, like grpc-timeout, so time
// in flight is not charged) and the header's resolution per hop.
func (ch *chain) latestC(callerDL time.Time) time.Time {
	frac := time.Duration(ch.frac * float64(callerDL.Sub(ch.sent[0].at())))
	return callerDL.Add(-ch.margins - frac + ch.inFlight() + 3*deadline.Resolution)
}

func TestThreeHopChain(t *testing.T) {
	t.Run("bufconn", func(t *testing.T) { testThreeHopChain(t, bufconn) })
	t.Run("tcp", func(t *testing.T) { testThreeHopChain(t, tcp) })
}

func testThreeHopChain(t *testing.T, net network) {
	var (
		ch              *chain
		start, callerDL time.Time
		elapsed         time.Duration
		err             error
		v               visit
		ok              bool
	)
	unstarved(t, func() (visit, bool) {
		ch = newChain(t, net, 200*time.Millisecond, nil, deadline.ClientConfig{Margin: hopMargin})
		start = time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		callerDL, _ = ctx.Deadline()
		_, err = ch.client.Get(ctx, &echov1.GetRequest{RequestId: "chain"})
		elapsed = time.Since(start)
		v, ok = ch.sink.wait(2 * time.Second)
		return v, ok
	})
	assert.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)
	require.True(t, ok, "the sink saw no call")
	require.True(t, v.hasDL)
	assert.Equal(t, []string{v.header[0]}, v.header, "exactly one header value")
	// C's deadline: the caller's, less every margin, give or take time in
	// flight, measured.
	latest := ch.latestC(callerDL)
	assert.False(t, v.deadline.After(latest), "C's deadline is %v after the caller's less the margins (%v in flight)", v.deadline.Sub(latest), ch.inFlight())
	if ch.inFlight() < ch.margins {
		assert.True(t, v.deadline.Before(callerDL), "C's deadline is %v after the caller's", v.deadline.Sub(callerDL))
	}
	// C stopped work nobody waited for, before the caller's deadline passed.
	assert.False(t, v.finished, "C completed 200 ms of work for a 100 ms caller")
	assert.Less(t, v.doneAt.Sub(start), ch.doneBy(100*time.Millisecond))
	ch.checkStats(t)
	t.Logf("caller deadline 100ms: C saw header %v, deadline %v before the caller's (%v in flight), stopped after %v (%v); caller answered after %v",
		v.header, callerDL.Sub(v.deadline), ch.inFlight(), v.doneAt.Sub(start), v.err, elapsed)
}

func TestThreeHopChainEnoughTime(t *testing.T) {
	ch := newChain(t, bufconn, 0, nil, deadline.ClientConfig{Margin: hopMargin})
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err := ch.client.Get(ctx, &echov1.GetRequest{RequestId: "ok"})
	require.NoError(t, err)
	v := ch.sink.next(t)
	assert.True(t, v.finished)
	callerDL, _ := ctx.Deadline()
	assert.False(t, v.deadline.After(ch.latestC(callerDL)))
	assert.Equal(t, uint64(0), ch.c.Stats().Refused)
}

func TestChainExpiredOnArrivalNeverEntersHandler(t *testing.T) {
	t.Run("queued past the deadline", func(t *testing.T) {
		// C's queue holds the request until its deadline has passed or its
		// caller left, as an overloaded server would. (The stormguard
		// interceptor belongs first in the chain; here it runs after the
		// queue to show what it does with a request that waited too long.)
		queue := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			<-ctx.Done()
			return h(ctx, req)
		}
		ch := newChain(t, bufconn, 200*time.Millisecond, []grpc.UnaryServerInterceptor{queue}, deadline.ClientConfig{Margin: hopMargin})
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_, err := ch.client.Get(ctx, &echov1.GetRequest{RequestId: "late"})
		assert.Equal(t, codes.DeadlineExceeded, status.Code(err))
		require.Eventually(t, func() bool { return ch.c.Stats().Refused == 1 }, 2*time.Second, time.Millisecond)
		assert.Zero(t, ch.sink.entered(), "an expired request entered C's handler")
	})
	t.Run("margin takes at most a quarter", func(t *testing.T) {
		// B's margin is larger than what is left: it takes a quarter of
		// it, and C's handler runs with the rest instead of being refused
		// as expired.
		ch := newChain(t, bufconn, 0, nil, deadline.ClientConfig{Margin: time.Hour})
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := ch.client.Get(ctx, &echov1.GetRequest{RequestId: "quarter"})
		require.NoError(t, err)
		assert.Zero(t, ch.c.Stats().Refused)
		v := ch.sink.next(t)
		assert.True(t, v.finished)
		assert.Greater(t, v.left, 500*time.Millisecond, "C's handler got about three quarters of what B had")
	})
}

func TestStreamChain(t *testing.T) {
	var (
		ch              *chain
		start, callerDL time.Time
		err             error
		v               visit
		ok              bool
	)
	unstarved(t, func() (visit, bool) {
		ch = newChain(t, bufconn, 200*time.Millisecond, nil, deadline.ClientConfig{Margin: hopMargin})
		start = time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		callerDL, _ = ctx.Deadline()
		var st grpc.ServerStreamingClient[echov1.ListResponse]
		if st, err = ch.client.List(ctx, &echov1.ListRequest{RequestId: "s", Count: 3}); err == nil {
			_, err = st.Recv()
		}
		v, ok = ch.sink.wait(2 * time.Second)
		return v, ok
	})
	assert.Equal(t, codes.DeadlineExceeded, status.Code(err))
	require.True(t, ok, "the sink saw no call")
	require.Len(t, v.header, 1)
	assert.False(t, v.deadline.After(ch.latestC(callerDL)), "C's deadline is %v too late", v.deadline.Sub(ch.latestC(callerDL)))
	assert.False(t, v.finished)
	assert.Less(t, v.doneAt.Sub(start), ch.doneBy(100*time.Millisecond))
	ch.checkStats(t)

	// With time enough, the stream completes through the chain.
	enough := newChain(t, bufconn, 0, nil, deadline.ClientConfig{})
	ctx2, cancel2 := context.WithTimeout(context.Background(), time.Second)
	defer cancel2()
	st, err := enough.client.List(ctx2, &echov1.ListRequest{RequestId: "s2", Count: 3})
	require.NoError(t, err)
	n := 0
	for ; ; n++ {
		if _, err := st.Recv(); err == io.EOF {
			break
		} else {
			require.NoError(t, err)
		}
	}
	assert.Equal(t, 3, n)
	assert.True(t, enough.sink.next(t).finished)
}

// copyIncoming is a proxy's Fresh: a new 10 s deadline, detached from the
// caller, with the incoming metadata (the header included) copied.
func copyIncoming(ctx context.Context) (context.Context, context.CancelFunc) {
	md, _ := metadata.FromIncomingContext(ctx)
	out, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	return metadata.NewOutgoingContext(out, md), cancel
}

func TestProxyWithFreshDeadlineHeaderWins(t *testing.T) {
	var (
		sent, arrived   *clock
		cs              *deadline.Server
		start, callerDL time.Time
		err             error
		v               visit
		ok              bool
	)
	unstarved(t, func() (visit, bool) {
		sent, arrived = &clock{}, &clock{}
		cs = deadline.NewServer(deadline.ServerConfig{})
		deadline.SetServerClock(cs, arrived.now)
		sk := newSink(200 * time.Millisecond)
		lc := serve(t, sk, serverOpts(cs)...)
		// The proxy knows nothing of stormguard: plain server, plain client.
		lp := serve(t, &origin.Hop{Next: dial(t, lc), Fresh: copyIncoming})
		dc := deadline.NewClient(deadline.ClientConfig{})
		deadline.SetClientClock(dc, sent.now)
		client := dial(t, lp, clientOpts(dc)...)

		start = time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		callerDL, _ = ctx.Deadline()
		_, err = client.Get(ctx, &echov1.GetRequest{RequestId: "proxied"})
		v, ok = sk.wait(2 * time.Second)
		return v, ok
	})
	assert.Equal(t, codes.DeadlineExceeded, status.Code(err))
	require.True(t, ok, "the sink saw no call")
	require.True(t, v.hasDL)
	assert.Len(t, v.header, 1)
	// The caller's deadline, give or take the time in flight through the
	// proxy; not the proxy's 10 s.
	inFlight := arrived.at().Sub(sent.at())
	assert.False(t, v.deadline.After(callerDL.Add(inFlight+deadline.Resolution)),
		"C's deadline is %v after the caller's (%v in flight)", v.deadline.Sub(callerDL), inFlight)
	assert.Less(t, v.deadline.Sub(start), time.Second)
	assert.False(t, v.finished)
	assert.Less(t, v.doneAt.Sub(start), 100*time.Millisecond+slack+inFlight)
	assert.Equal(t, deadline.ServerStats{Tightened: 1}, cs.Stats())
}

func TestMalformedHeaderOverTheWire(t *testing.T) {
	s := deadline.NewServer(deadline.ServerConfig{})
	o := origin.New(nil)
	client := dial(t, serve(t, o, serverOpts(s)...)) // a plain client: it sends what it is told
	for i, vals := range [][]string{{"-5"}, {"100ms"}, {" 7"}, {"1.5"}, {"12345678901"}, {"1", "2"}, {"0x10"}, {strings.Repeat("9", 4096)}} {
		kv := make([]string, 0, 2*len(vals))
		for _, v := range vals {
			kv = append(kv, deadline.MetadataKey, v)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		ctx = metadata.AppendToOutgoingContext(ctx, kv...)
		_, err := client.Get(ctx, &echov1.GetRequest{RequestId: "bad"})
		cancel()
		require.NoError(t, err, "%q: a malformed header is ignored", vals)
		assert.Equal(t, uint64(i+1), s.Stats().Malformed)
	}
	for _, c := range o.Calls() {
		assert.True(t, c.HasDeadline)
		assert.Greater(t, c.Deadline.Sub(c.Arrived), 500*time.Millisecond, "grpc-timeout still applies")
	}
	assert.Equal(t, deadline.ServerStats{Malformed: 8}, s.Stats())

	// An absurd value without grpc-timeout is clamped to MaxHeader.
	ctx := metadata.AppendToOutgoingContext(context.Background(), deadline.MetadataKey, "9999999999")
	before := time.Now()
	_, err := client.Get(ctx, &echov1.GetRequest{RequestId: "huge"})
	require.NoError(t, err)
	calls := o.Calls()
	last := calls[len(calls)-1]
	require.True(t, last.HasDeadline)
	assert.WithinRange(t, last.Deadline, before.Add(deadline.MaxHeader), time.Now().Add(deadline.MaxHeader))
}

func TestClientOverTheWire(t *testing.T) {
	o := origin.New(nil)
	l := serve(t, o)
	c := deadline.NewClient(deadline.ClientConfig{MinRemaining: 50 * time.Millisecond, DefaultTimeout: 2 * time.Second})
	client := dial(t, l, clientOpts(c)...)
	last := func() origin.Call {
		calls := o.Calls()
		require.NotEmpty(t, calls)
		return calls[len(calls)-1]
	}

	t.Run("stale header replaced", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		ctx = metadata.AppendToOutgoingContext(ctx, deadline.MetadataKey, "99999999")
		_, err := client.Get(ctx, &echov1.GetRequest{RequestId: "stale"})
		require.NoError(t, err)
		vals := last().Metadata.Get(deadline.MetadataKey)
		require.Len(t, vals, 1)
		d, ok := deadline.ParseHeader(vals[0])
		assert.True(t, ok)
		assert.LessOrEqual(t, d, time.Second, "what is left, not the stale value")
	})
	t.Run("default timeout", func(t *testing.T) {
		_, err := client.Get(context.Background(), &echov1.GetRequest{RequestId: "default"})
		require.NoError(t, err)
		call := last()
		require.True(t, call.HasDeadline)
		assert.LessOrEqual(t, time.Until(call.Deadline), 2*time.Second)
		vals := call.Metadata.Get(deadline.MetadataKey)
		require.Len(t, vals, 1)
		d, ok := deadline.ParseHeader(vals[0])
		assert.True(t, ok)
		assert.LessOrEqual(t, d, 2*time.Second)
	})
	t.Run("fail fast sends nothing", func(t *testing.T) {
		before := o.Total()
		expired, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
		defer cancel()
		_, err := client.Get(expired, &echov1.GetRequest{RequestId: "expired"})
		assert.Equal(t, codes.DeadlineExceeded, status.Code(err))
		short, cancel2 := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel2()
		_, err = client.Get(short, &echov1.GetRequest{RequestId: "short"})
		assert.Equal(t, codes.DeadlineExceeded, status.Code(err))
		_, err = client.List(short, &echov1.ListRequest{RequestId: "short", Count: 1})
		assert.Equal(t, codes.DeadlineExceeded, status.Code(err))
		assert.Equal(t, before, o.Total(), "a failed-fast attempt reached the server")
	})
	t.Run("streams with the default timeout", func(t *testing.T) {
		ctx := context.Background()
		ls, err := client.List(ctx, &echov1.ListRequest{RequestId: "l", Count: 2})
		require.NoError(t, err)
		for range 2 {
			_, err := ls.Recv()
			require.NoError(t, err)
		}
		_, err = ls.Recv()
		assert.Equal(t, io.EOF, err)
		assert.Len(t, last().Metadata.Get(deadline.MetadataKey), 1)

		up, err := client.Upload(ctx)
		require.NoError(t, err)
		require.NoError(t, up.Send(&echov1.UploadRequest{RequestId: "u", Chunk: []byte("abc")}))
		res, err := up.CloseAndRecv()
		require.NoError(t, err)
		assert.Equal(t, uint64(3), res.GetSize())

		chat, err := client.Chat(ctx)
		require.NoError(t, err)
		require.NoError(t, chat.Send(&echov1.ChatRequest{RequestId: "c", Seq: 1}))
		m, err := chat.Recv()
		require.NoError(t, err)
		assert.Equal(t, uint32(1), m.GetSeq())
		require.NoError(t, chat.CloseSend())
		_, err = chat.Recv()
		assert.Equal(t, io.EOF, err)
		assert.True(t, last().HasDeadline)
	})
	t.Run("no deadline, no header", func(t *testing.T) {
		plain := dial(t, l, clientOpts(deadline.NewClient(deadline.ClientConfig{}))...)
		ctx := metadata.AppendToOutgoingContext(context.Background(), deadline.MetadataKey, "5")
		_, err := plain.Get(ctx, &echov1.GetRequest{RequestId: "none"})
		require.NoError(t, err)
		assert.False(t, last().HasDeadline)
		assert.Empty(t, last().Metadata.Get(deadline.MetadataKey), "the stale header was removed")
	})
}
