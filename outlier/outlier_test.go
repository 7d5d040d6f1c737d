package outlier

import (
	"context"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/internal/origin"
)

// step is the virtual time between two sequential calls: about 333
// requests per second.
const step = 3 * time.Millisecond

// deadRun makes n sequential calls against c, whose origin dead answers
// UNAVAILABLE to everything, and returns the number of calls made when the
// policy first had dead ejected (-1 if never), and the calls made and
// succeeded from then on.
func deadRun(t *testing.T, c *cluster, dead, n int) (known, after, okAfter int) {
	t.Helper()
	known = -1
	for i := range n {
		err := c.call(context.Background())
		if known >= 0 {
			after++
			if err == nil {
				okAfter++
			}
		}
		c.clk.Advance(step)
		if known < 0 && slices.Contains(c.ejected(), dead) {
			known = i + 1
		}
	}
	return known, after, okAfter
}

// TestOneDeadBackendIsEjected: one of two, and one of three, backends
// answers UNAVAILABLE to everything; the policy ejects it within 100
// requests (300 ms at 333 requests per second), and from then on at least
// 99% of the calls succeed without any retry, the dead backend getting only
// the requests that find out whether it is back.
func TestOneDeadBackendIsEjected(t *testing.T) {
	for _, n := range []int{2, 3} {
		t.Run(fmt.Sprintf("one of %d", n), func(t *testing.T) {
			c := newCluster(t, n, Config{})
			c.origins[0].SetScript(origin.Always(codes.Unavailable))
			known, after, okAfter := deadRun(t, c, 0, 2000)
			t.Logf("one of %d dead: ejected after %d calls (%v of virtual time at %v per call); %d/%d ok after that; requests per backend %v; ejections %v",
				n, known, time.Duration(known)*step, step, okAfter, after, c.totals(), c.ejections())
			if known < 0 || known > 100 {
				t.Fatalf("dead backend ejected after %d calls, want within 100", known)
			}
			if float64(okAfter) < 0.99*float64(after) {
				t.Errorf("after ejection %d/%d ok, want ≥ 99%%", okAfter, after)
			}
			if got := c.ejections(); got[0] == 0 || slices.Max(got[1:]) != 0 {
				t.Errorf("ejections per backend %v: want the dead one only", got)
			}
		})
	}
}

// TestSheddingBackendIsNotEjected: a backend that refuses every request on
// purpose, with grpc-retry-pushback-ms (a stormguard server shedding load),
// is not a broken host: it is not ejected, so its load does not move onto
// the others. The same backend without the trailer is (TestOneDeadBackendIsEjected).
func TestSheddingBackendIsNotEjected(t *testing.T) {
	c := newCluster(t, 2, Config{})
	c.origins[0].SetScript(func(origin.Call) origin.Reply {
		return origin.Reply{Code: codes.Unavailable, Message: "shed", Trailer: metadata.Pairs("grpc-retry-pushback-ms", "-1")}
	})
	c.run(1000, step)
	assert.Equal(t, []int{0, 0}, c.ejections(), "no ejection")
	assert.Greater(t, c.origins[0].Total(), 300, "the shedding backend kept its share of the calls")
}

// TestIndependentFailuresEjectNothing: every backend fails each request
// with the same probability p (seeded, independent): no backend stands
// out, so none is ejected, at any p.
func TestIndependentFailuresEjectNothing(t *testing.T) {
	for _, tc := range []struct {
		n int
		p float64
	}{{2, 0.5}, {2, 0.9}, {3, 0.3}, {3, 0.5}, {3, 0.9}} {
		t.Run(fmt.Sprintf("%d backends p=%g", tc.n, tc.p), func(t *testing.T) {
			c := newCluster(t, tc.n, Config{})
			for i, o := range c.origins {
				o.SetScript(failWith(uint64(100+i), tc.p))
			}
			ok := c.run(1500, step)
			t.Logf("%d/1500 ok; requests per backend %v; ejections %v", ok, c.totals(), c.ejections())
			if got := c.ejections(); slices.Max(got) != 0 {
				t.Errorf("ejections per backend %v: want none", got)
			}
			if ok == 0 || ok == 1500 {
				t.Errorf("%d/1500 ok: the failures did not happen as scripted", ok)
			}
		})
	}
}

// TestHealedBackendReturns: an ejected backend that heals gets traffic
// again once its ejection time (BaseEjectionTime) has passed, not before.
func TestHealedBackendReturns(t *testing.T) {
	cfg := Config{BaseEjectionTime: 2 * time.Second}
	c := newCluster(t, 2, cfg)
	c.origins[0].SetScript(origin.Always(codes.Unavailable))
	if known, _, _ := deadRun(t, c, 0, 300); known < 0 {
		t.Fatal("dead backend not ejected")
	}
	c.origins[0].SetScript(nil) // healed
	c.origins[0].Reset()
	ejectedAt := c.ejectedAt(0)
	c.clk.Advance(ejectedAt.Add(cfg.BaseEjectionTime - 50*time.Millisecond).Sub(c.clk.Now()))
	if got := c.run(20, 0); got != 20 || c.origins[0].Total() != 0 || len(c.ejected()) != 1 {
		t.Fatalf("before its time: %d/20 ok, healed backend got %d requests, ejected %v; want 20, 0, [0]", got, c.origins[0].Total(), c.ejected())
	}
	c.clk.Advance(200 * time.Millisecond) // a tick (every 100ms) comes after the ejection time
	if got := c.ejected(); len(got) != 0 {
		t.Fatalf("ejected %v after the ejection time, want none", got)
	}
	if ok := c.run(100, step); ok != 100 || c.origins[0].Total() < 40 {
		t.Errorf("after return: %d/100 ok, healed backend got %d; want 100 and about half", ok, c.origins[0].Total())
	}
}

// TestRepeatOffenderStaysOutLonger: a backend that is still dead when it
// returns is ejected again, for twice as long, and a third time for three
// times as long up to MaxEjectionTime.
func TestRepeatOffenderStaysOutLonger(t *testing.T) {
	cfg := Config{BaseEjectionTime: time.Second, MaxEjectionTime: 2500 * time.Millisecond}
	c := newCluster(t, 2, cfg)
	c.origins[0].SetScript(origin.Always(codes.Unavailable))
	for round, want := range []time.Duration{time.Second, 2 * time.Second, 2500 * time.Millisecond} {
		if known, _, _ := deadRun(t, c, 0, 300); known < 0 {
			t.Fatalf("round %d: dead backend not ejected", round+1)
		}
		at := c.ejectedAt(0)
		c.clk.Advance(at.Add(want - 20*time.Millisecond).Sub(c.clk.Now()))
		if len(c.ejected()) != 1 {
			t.Fatalf("round %d: back before %v", round+1, want)
		}
		c.clk.Advance(at.Add(want + 100*time.Millisecond).Sub(c.clk.Now()))
		if len(c.ejected()) != 0 {
			t.Fatalf("round %d: still ejected %v after %v", round+1, c.clk.Now().Sub(at), want)
		}
	}
	if got := c.ejections()[0]; got != 3 {
		t.Errorf("%d ejections, want 3", got)
	}
}

// TestNeverEjectsAll: two dead backends of two are not outliers; of three
// backends two dead, at most one is ejected (MaxEjectionPercent 50); and
// when the only backend left stops, the ejected one comes back.
func TestNeverEjectsAll(t *testing.T) {
	t.Run("all dead", func(t *testing.T) {
		c := newCluster(t, 2, Config{})
		for _, o := range c.origins {
			o.SetScript(origin.Always(codes.Unavailable))
		}
		c.run(500, step)
		if got := c.ejections(); slices.Max(got) != 0 {
			t.Errorf("ejections %v, want none", got)
		}
	})
	t.Run("two of three dead", func(t *testing.T) {
		c := newCluster(t, 3, Config{})
		c.origins[0].SetScript(origin.Always(codes.Unavailable))
		c.origins[1].SetScript(origin.Always(codes.Unavailable))
		most := 0
		for range 1000 {
			_ = c.call(context.Background())
			c.clk.Advance(step)
			most = max(most, len(c.ejected()))
		}
		if got := c.ejections(); most != 1 || got[2] != 0 {
			t.Errorf("at most %d ejected at once, ejections %v; want 1, and never the healthy one", most, got)
		}
	})
	t.Run("last one stops", func(t *testing.T) {
		c := newCluster(t, 2, Config{BaseEjectionTime: time.Hour})
		c.origins[0].SetScript(origin.Always(codes.Unavailable))
		if known, _, _ := deadRun(t, c, 0, 300); known < 0 {
			t.Fatal("dead backend not ejected")
		}
		c.servers[1].Stop()
		deadline := time.Now().Add(20 * time.Second)
		for len(c.ejected()) != 0 {
			if time.Now().After(deadline) {
				t.Fatal("the ejected backend did not come back when the other one stopped")
			}
			c.clk.Advance(100 * time.Millisecond)
			time.Sleep(time.Millisecond) // let gRPC notice the closed connection
		}
		if err := c.call(context.Background()); status.Code(err) != codes.Unavailable {
			t.Errorf("call: %v, want the dead backend's UNAVAILABLE", err)
		}
		if c.origins[0].Total() == 0 {
			t.Error("the dead backend got no request: the call was not sent to it")
		}
	})
	t.Run("resolver drops the others", func(t *testing.T) {
		c := newCluster(t, 2, Config{BaseEjectionTime: time.Hour})
		c.origins[0].SetScript(origin.Always(codes.Unavailable))
		if known, _, _ := deadRun(t, c, 0, 300); known < 0 {
			t.Fatal("dead backend not ejected")
		}
		c.r.UpdateState(resolver.State{Endpoints: []resolver.Endpoint{{Addresses: []resolver.Address{{Addr: c.addrs[0]}}}}})
		if got := c.ejected(); len(got) != 0 {
			t.Fatalf("ejected %v with one endpoint left, want none", got)
		}
		before := c.origins[0].Total()
		if err := c.call(context.Background()); status.Code(err) != codes.Unavailable || c.origins[0].Total() != before+1 {
			t.Errorf("call: %v, dead backend requests %d → %d; want UNAVAILABLE from it", err, before, c.origins[0].Total())
		}
	})
}

// TestFailureCodes: by default Internal counts as the backend's failure and
// NotFound does not (it is an answer), nor does the caller's cancellation.
func TestFailureCodes(t *testing.T) {
	t.Run("internal", func(t *testing.T) {
		c := newCluster(t, 2, Config{})
		c.origins[0].SetScript(origin.Always(codes.Internal))
		if known, _, _ := deadRun(t, c, 0, 300); known < 0 {
			t.Error("a backend failing every call with INTERNAL was not ejected")
		}
	})
	t.Run("not found", func(t *testing.T) {
		c := newCluster(t, 2, Config{})
		c.origins[0].SetScript(origin.Always(codes.NotFound))
		c.run(500, step)
		if got := c.ejections(); slices.Max(got) != 0 {
			t.Errorf("ejections %v: NOT_FOUND counted as a failure", got)
		}
	})
	t.Run("configured", func(t *testing.T) {
		c := newCluster(t, 2, Config{FailureCodes: []codes.Code{codes.NotFound}})
		c.origins[0].SetScript(origin.Always(codes.NotFound))
		if known, _, _ := deadRun(t, c, 0, 300); known < 0 {
			t.Error("FailureCodes NOT_FOUND: a backend answering NOT_FOUND was not ejected")
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		c := newCluster(t, 2, Config{})
		arrived := make(chan struct{}, 1)
		c.origins[0].SetScript(func(origin.Call) origin.Reply {
			arrived <- struct{}{}
			return origin.Reply{Delay: time.Minute} // until the caller leaves
		})
		ctx := AvoidContext(context.Background(), c.addrs[1])
		for range 3 * defaultMinRequests {
			cctx, cancel := context.WithCancel(ctx)
			errc := make(chan error, 1)
			go func() { errc <- c.call(cctx) }()
			<-arrived
			cancel()
			if err := <-errc; status.Code(err) != codes.Canceled {
				t.Fatalf("call: %v, want CANCELLED", err)
			}
		}
		c.clk.Advance(defaultInterval)
		if got := c.window(0); got != (counts{}) || len(c.ejected()) != 0 {
			t.Errorf("after %d cancelled calls: counted %+v, ejected %v; want nothing", 3*defaultMinRequests, got, c.ejected())
		}
	})
}

// TestAvoidContext: a call whose context avoids addresses is sent to
// another backend; when every backend is avoided it is sent anyway.
func TestAvoidContext(t *testing.T) {
	c := newCluster(t, 3, Config{})
	ctx := AvoidContext(context.Background(), c.addrs[0])
	if ok := c.run(300, step); ok != 300 {
		t.Fatalf("%d/300 ok", ok)
	}
	for _, o := range c.origins {
		o.Reset()
	}
	for range 300 {
		if err := c.call(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := c.totals(); got[0] != 0 || got[1]+got[2] != 300 {
		t.Errorf("avoiding backend 0: requests per backend %v", got)
	}
	ctx = AvoidContext(ctx, c.addrs[1])
	for _, o := range c.origins {
		o.Reset()
	}
	for range 100 {
		if err := c.call(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := c.totals(); got[2] != 100 {
		t.Errorf("avoiding backends 0 and 1: requests per backend %v, want all on 2", got)
	}
	all := AvoidContext(ctx, c.addrs[2])
	for range 30 {
		if err := c.call(all); err != nil {
			t.Fatalf("every backend avoided: %v, want the call sent anyway", err)
		}
	}
}

// TestRetryAvoidsFailedBackend is the interceptor's use: a call that failed
// on a backend is retried with AvoidContext(peer address), and the retry
// goes elsewhere, every time, even before (or without) any ejection.
func TestRetryAvoidsFailedBackend(t *testing.T) {
	for _, n := range []int{2, 3} {
		t.Run(fmt.Sprintf("one of %d", n), func(t *testing.T) {
			c := newCluster(t, n, Config{MinRequests: maxMinRequests}) // never ejects
			c.origins[0].SetScript(origin.Always(codes.Unavailable))
			failed := 0
			for i := range 300 {
				addr, err := c.callPeer(context.Background())
				if err == nil {
					continue
				}
				failed++
				if canonicalAddr(addr) != canonicalAddr(c.addrs[0]) {
					t.Fatalf("call %d failed on %s, not the dead backend %s: %v", i, addr, c.addrs[0], err)
				}
				if err := c.call(AvoidContext(context.Background(), addr)); err != nil {
					t.Fatalf("call %d: the retry avoiding %s failed: %v", i, addr, err)
				}
			}
			if failed < 300/n/2 {
				t.Errorf("%d of 300 first attempts failed: the dead backend got too few", failed)
			}
		})
	}
}

// ejectedAt returns when origin i was last ejected.
func (c *cluster) ejectedAt(i int) time.Time {
	b := c.balancer()
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.byAddr[canonicalAddr(c.addrs[i])].ejectedAt
}

// window sums the outcomes counted for origin i.
func (c *cluster) window(i int) counts {
	b := c.balancer()
	b.mu.Lock()
	defer b.mu.Unlock()
	ep := b.byAddr[canonicalAddr(c.addrs[i])]
	ok, fail := ep.win.Counts(math.MinInt64) // the window ending at its newest bucket
	return counts{ok: ep.ok.Load() + uint32(ok), fail: ep.fail.Load() + uint32(fail)}
}

// TestPickFirstChild: with pick_first as the child (one connection for all
// endpoints, no health listener) the policy ejects nothing and an avoided
// address is used anyway, since there is no other: it does no harm.
func TestPickFirstChild(t *testing.T) {
	c := newCluster(t, 2, Config{Child: "pick_first"})
	if err := c.call(context.Background()); err != nil {
		t.Fatal(err)
	}
	used := 0 // the backend pick_first connected to
	if c.origins[0].Total() == 0 {
		used = 1
	}
	ctx := AvoidContext(context.Background(), c.addrs[used])
	for range 50 {
		if err := c.call(ctx); err != nil {
			t.Fatalf("call avoiding the connected backend: %v, want it sent there anyway", err)
		}
	}
	c.origins[used].SetScript(origin.Always(codes.Unavailable))
	c.run(300, step)
	if got := c.ejections(); slices.Max(got) != 0 {
		t.Errorf("ejections %v, want none", got)
	}
	if got := c.totals(); got[1-used] != 0 {
		t.Errorf("requests per backend %v: pick_first's choice changed", got)
	}
}
