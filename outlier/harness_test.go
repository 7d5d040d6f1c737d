package outlier

import (
	"context"
	"fmt"
	"hash/fnv"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/stormguard/stormguard/internal/clock"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// cluster is N real origins on 127.0.0.1 behind one client connection that
// uses the policy (registered under a test name, with a fake clock, which
// runs the policy's timers in the goroutine that advances it) and a manual
// resolver listing the N addresses.
type cluster struct {
	t       *testing.T
	clk     *clock.Fake
	origins []*origin.Origin
	servers []*origin.Server
	addrs   []string
	r       *manual.Resolver
	cc      *grpc.ClientConn
	client  echov1.EchoServiceClient
	bal     atomic.Pointer[outlierBalancer]
	seq     atomic.Int64 // request ids
}

var testPolicies atomic.Int64

// newCluster starts n origins that succeed, connects to them through the
// policy with cfg, and waits until every origin has answered a call.
func newCluster(t *testing.T, n int, cfg Config) *cluster {
	t.Helper()
	return newMeteredCluster(t, n, cfg, nil)
}

// newMeteredCluster is newCluster whose policy records its metrics with mp
// (nil: SetMeterProvider's).
func newMeteredCluster(t *testing.T, n int, cfg Config, mp metric.MeterProvider) *cluster {
	t.Helper()
	c := &cluster{t: t, clk: clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))}
	name := fmt.Sprintf("stormguard_outlier_test_%d", testPolicies.Add(1))
	balancer.Register(builder{name: name, clk: c.clk, onBuild: func(b *outlierBalancer) { c.bal.Store(b) }, mp: mp})
	var eps []resolver.Endpoint
	for range n {
		o := origin.New(nil)
		l, err := origin.TCP()
		if err != nil {
			t.Fatal(err)
		}
		srv := origin.Serve(l, o)
		t.Cleanup(srv.Stop)
		c.servers = append(c.servers, srv)
		c.origins = append(c.origins, o)
		c.addrs = append(c.addrs, l.Target)
		eps = append(eps, resolver.Endpoint{Addresses: []resolver.Address{{Addr: l.Target}}})
	}
	r := manual.NewBuilderWithScheme("outliertest")
	r.InitialState(resolver.State{Endpoints: eps})
	c.r = r
	cc, err := grpc.NewClient("outliertest:///cluster",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithResolvers(r),
		grpc.WithDefaultServiceConfig(serviceConfig(name, cfg)),
		grpc.WithDisableRetry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	c.cc, c.client = cc, echov1.NewEchoServiceClient(cc)
	c.warmUp(cfg.Child != "pick_first") // pick_first sends everything to one
	return c
}

// warmUp calls until every origin has answered (round_robin reaches every
// READY endpoint in turn), or one if not every, then forgets the counts.
func (c *cluster) warmUp(every bool) {
	c.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if err := c.call(context.Background()); err != nil {
			c.t.Fatalf("warm-up call: %v", err)
		}
		reached := 0
		for _, o := range c.origins {
			if o.Total() > 0 {
				reached++
			}
		}
		if reached == len(c.origins) || !every {
			break
		}
		if time.Now().After(deadline) {
			c.t.Fatal("warm-up: not every origin was reached")
		}
	}
	for _, o := range c.origins {
		o.Reset()
	}
	c.forgetCounts()
}

// forgetCounts clears the balancer's counters.
func (c *cluster) forgetCounts() {
	b := c.balancer()
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, ep := range b.eps.Values() {
		ep.ok.Store(0)
		ep.fail.Store(0)
		ep.win.Reset()
	}
}

func (c *cluster) balancer() *outlierBalancer {
	b := c.bal.Load()
	if b == nil {
		c.t.Fatal("the policy was not built")
	}
	return b
}

// call makes one Put with a fresh request id and a 2 s deadline.
func (c *cluster) call(ctx context.Context, opts ...grpc.CallOption) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err := c.client.Put(ctx, &echov1.PutRequest{RequestId: strconv.FormatInt(c.seq.Add(1), 10)}, opts...)
	return err
}

// callPeer is call, and the address the attempt went to.
func (c *cluster) callPeer(ctx context.Context) (string, error) {
	var p peer.Peer
	err := c.call(ctx, grpc.Peer(&p))
	if p.Addr == nil {
		return "", err
	}
	return p.Addr.String(), err
}

// ejected returns the indexes of the ejected origins.
func (c *cluster) ejected() []int {
	b := c.balancer()
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []int
	for i, a := range c.addrs {
		if ep := b.byAddr[canonicalAddr(a)]; ep != nil && ep.ejected.Load() {
			out = append(out, i)
		}
	}
	return out
}

// ejections returns how often each origin was ejected.
func (c *cluster) ejections() []int {
	b := c.balancer()
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]int, len(c.addrs))
	for i, a := range c.addrs {
		if ep := b.byAddr[canonicalAddr(a)]; ep != nil {
			out[i] = ep.ejections
		}
	}
	return out
}

// totals returns the requests each origin received.
func (c *cluster) totals() []int {
	out := make([]int, len(c.origins))
	for i, o := range c.origins {
		out[i] = o.Total()
	}
	return out
}

// run makes n sequential calls, moving the clock by step after each, and
// returns how many succeeded.
func (c *cluster) run(n int, step time.Duration) (ok int) {
	for range n {
		if c.call(context.Background()) == nil {
			ok++
		}
		c.clk.Advance(step)
	}
	return ok
}

// uniform is a number in [0, 1) fixed by seed, id and attempt (as the storm
// lab draws its seeded failures).
func uniform(seed uint64, id string, attempt int) float64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/%s/%d", seed, id, attempt)
	x := h.Sum64()
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	x ^= x >> 31
	return float64(x>>11) / (1 << 53)
}

// failWith fails each attempt with Unavailable with probability p, a seeded
// choice per request id and attempt.
func failWith(seed uint64, p float64) origin.Script {
	return func(c origin.Call) origin.Reply {
		if uniform(seed, c.RequestID, c.Attempt) < p {
			return origin.Reply{Code: codes.Unavailable, Message: "origin: unlucky"}
		}
		return origin.Reply{}
	}
}
