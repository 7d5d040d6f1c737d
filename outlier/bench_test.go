package outlier

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
	"github.com/stormguard/stormguard/internal/window"
)

// captureBuilder builds the policy child as it is, on a ClientConn that
// keeps the last READY picker the channel got, for the benchmarks.
type captureBuilder struct {
	name, child string
	picker      *atomic.Pointer[balancer.Picker]
}

func (c captureBuilder) Name() string { return c.name }

func (c captureBuilder) Build(cc balancer.ClientConn, opts balancer.BuildOptions) balancer.Balancer {
	return balancer.Get(c.child).Build(&captureCC{ClientConn: cc, picker: c.picker}, opts)
}

type captureCC struct {
	balancer.ClientConn
	picker *atomic.Pointer[balancer.Picker]
}

func (cc *captureCC) UpdateState(s balancer.State) {
	if s.ConnectivityState == connectivity.Ready {
		cc.picker.Store(&s.Picker)
	}
	cc.ClientConn.UpdateState(s)
}

var benchPolicies atomic.Int64

// benchConn connects to n origins through child (wrapped to capture its
// picker) and returns a client, once every origin has answered.
func benchConn(b *testing.B, n int, child string) (echov1.EchoServiceClient, *atomic.Pointer[balancer.Picker], []string) {
	b.Helper()
	name := fmt.Sprintf("capture_%s_%d", child, benchPolicies.Add(1))
	picker := new(atomic.Pointer[balancer.Picker])
	balancer.Register(captureBuilder{name: name, child: child, picker: picker})
	var eps []resolver.Endpoint
	var origins []*origin.Origin
	var addrs []string
	for range n {
		o := origin.New(nil)
		l, err := origin.TCP()
		if err != nil {
			b.Fatal(err)
		}
		srv := origin.Serve(l, o)
		b.Cleanup(srv.Stop)
		origins = append(origins, o)
		addrs = append(addrs, l.Target)
		eps = append(eps, resolver.Endpoint{Addresses: []resolver.Address{{Addr: l.Target}}})
	}
	r := manual.NewBuilderWithScheme("outlierbench")
	r.InitialState(resolver.State{Endpoints: eps})
	cc, err := grpc.NewClient("outlierbench:///x", grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithResolvers(r),
		grpc.WithDefaultServiceConfig(fmt.Sprintf(`{"loadBalancingConfig":[{%q:{}}]}`, name)))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cc.Close() })
	client := echov1.NewEchoServiceClient(cc)
	for i := 0; ; i++ {
		if _, err := client.Put(context.Background(), &echov1.PutRequest{RequestId: strconv.Itoa(i)}); err != nil {
			b.Fatal(err)
		}
		all := true
		for _, o := range origins {
			all = all && o.Total() > 0
		}
		if all {
			break
		}
	}
	return client, picker, addrs
}

// BenchmarkPick measures one pick and its Done callback, as the channel
// makes them for every RPC, with grpc-go's round_robin alone and wrapped
// in the policy; "avoid" picks with a context that avoids one of the three
// backends (the retry path).
func BenchmarkPick(b *testing.B) {
	ctx := metadata.AppendToOutgoingContext(context.Background(), "k", "v")
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for _, bc := range []struct{ name, child string }{{"round_robin", "round_robin"}, {"outlier", Name}} {
		b.Run(bc.name, func(b *testing.B) {
			_, picker, _ := benchConn(b, 3, bc.child)
			p := *picker.Load()
			info := balancer.PickInfo{FullMethodName: echov1.EchoService_Put_FullMethodName, Ctx: ctx}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				res, err := p.Pick(info)
				if err != nil {
					b.Fatal(err)
				}
				if res.Done != nil {
					res.Done(balancer.DoneInfo{})
				}
			}
		})
	}
	b.Run("outlier/avoid", func(b *testing.B) {
		_, picker, addrs := benchConn(b, 3, Name)
		p := *picker.Load()
		info := balancer.PickInfo{FullMethodName: echov1.EchoService_Put_FullMethodName, Ctx: AvoidContext(ctx, addrs[0])}
		b.ReportAllocs()
		b.ResetTimer()
		for b.Loop() {
			res, err := p.Pick(info)
			if err != nil {
				b.Fatal(err)
			}
			res.Done(balancer.DoneInfo{})
		}
	})
}

// BenchmarkPickParallel is BenchmarkPick from every CPU at once: the
// policy's counters are shared by all RPCs to one endpoint.
func BenchmarkPickParallel(b *testing.B) {
	for _, bc := range []struct{ name, child string }{{"round_robin", "round_robin"}, {"outlier", Name}} {
		b.Run(bc.name, func(b *testing.B) {
			_, picker, _ := benchConn(b, 3, bc.child)
			p := *picker.Load()
			info := balancer.PickInfo{FullMethodName: echov1.EchoService_Put_FullMethodName, Ctx: context.Background()}
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					res, err := p.Pick(info)
					if err != nil {
						b.Error(err)
						return
					}
					if res.Done != nil {
						res.Done(balancer.DoneInfo{})
					}
				}
			})
		})
	}
}

// BenchmarkUnaryRPC is a whole Put over 127.0.0.1 through each policy.
func BenchmarkUnaryRPC(b *testing.B) {
	for _, bc := range []struct{ name, child string }{{"round_robin", "round_robin"}, {"outlier", Name}} {
		b.Run(bc.name, func(b *testing.B) {
			client, _, _ := benchConn(b, 3, bc.child)
			req := &echov1.PutRequest{RequestId: "bench"}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if _, err := client.Put(context.Background(), req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// benchDecider is a balancer holding only what decide reads at now: n
// endpoints, each with a READY SubConn and a full window of buckets (10
// successes each), under the default Config.
func benchDecider(n int, now time.Time) (*outlierBalancer, Config, []*endpoint) {
	cfg := Config{}.withDefaults()
	nb := int(cfg.Window / cfg.Interval)
	b := &outlierBalancer{subs: map[*subConn]struct{}{}, origin: now.Add(-time.Duration(nb-1) * cfg.Interval)}
	eps := make([]*endpoint, n)
	for i := range eps {
		ep := &endpoint{win: window.New(nb, 2, cfg.Interval)}
		fill(ep, cfg, kindOK)
		sc := &subConn{}
		sc.ep.Store(ep)
		sc.ready.Store(true)
		b.subs[sc] = struct{}{}
		eps[i] = ep
	}
	return b, cfg, eps
}

// fill puts 10 outcomes of kind in each bucket of ep's window.
func fill(ep *endpoint, cfg Config, kind int) {
	for j := range ep.win.Slots() {
		ep.win.Add(int64(j)*int64(cfg.Interval), kind, 10)
	}
}

// BenchmarkDecide measures one evaluation's decision over 10 endpoints
// (default Config: 100 buckets): "healthy" when none stands out, "ejected"
// with one ejected and waiting out its time, "outlier" when one fails
// every request and is ejected (then restored for the next round).
func BenchmarkDecide(b *testing.B) {
	now := time.Unix(1e9, 0)
	b.Run("healthy", func(b *testing.B) {
		bal, cfg, eps := benchDecider(10, now)
		b.ReportAllocs()
		for b.Loop() {
			if changed, _ := bal.decide(now, cfg, eps); len(changed) != 0 {
				b.Fatalf("changed %d endpoints", len(changed))
			}
		}
	})
	b.Run("ejected", func(b *testing.B) {
		bal, cfg, eps := benchDecider(10, now)
		bal.eject(eps[0], now)
		b.ReportAllocs()
		for b.Loop() {
			if changed, _ := bal.decide(now, cfg, eps); len(changed) != 0 {
				b.Fatalf("changed %d endpoints", len(changed))
			}
		}
	})
	b.Run("outlier", func(b *testing.B) {
		bal, cfg, eps := benchDecider(10, now)
		b.ReportAllocs()
		for b.Loop() {
			eps[0].ejected.Store(false)
			eps[0].times = 0
			fill(eps[0], cfg, kindFail) // the ejection emptied its window
			if changed, _ := bal.decide(now, cfg, eps); len(changed) != 1 || changed[0] != eps[0] {
				b.Fatalf("changed %d endpoints, want the failing one", len(changed))
			}
		}
	})
}
