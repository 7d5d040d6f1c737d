package fleetsim

import (
	"math"
	"math/rand/v2"
	"runtime"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
)

// KernelBytesPerClient is what a run keeps per client besides its policy's
// state: the Client interface value in the clients' slice (16 bytes), its
// phase and its place in its group's period (16), and the counters of its
// calls and attempts in the failure (8).
const KernelBytesPerClient = 16 + 16 + 8

// StateBytes returns the heap that the state of n clients of policy p
// holds, per client, once each has called every one of 3 backends (what
// a client keeps of each endpoint included): the least of tries
// measurements (a measurement that a collection or another goroutine's
// allocation disturbs only comes out larger).
func StateBytes(p *ClientPolicy, n, tries int) float64 {
	e := &Env{Rand: rand.New(rand.NewPCG(1, 2)), Base: base, Backends: 3, Clients: n}
	return HeapPer(n, tries, func(i int) any {
		c := p.New(e, i)
		for k := range e.Backends {
			now := e.At(time.Duration(k) * time.Millisecond)
			call := &Call{Client: i, K: k, Deadline: now.Add(time.Second)}
			if c.Begin(call, now) {
				if b, ok := c.Pick(call, now, e.Backends); ok {
					call.Attempts++
					c.Settle(call, now, Outcome{Code: OK, Backend: b, Pushback: NoPushback})
				}
			}
			c.End(call, now, true)
		}
		return c
	})
}

// LibraryBytes returns the heap that one budget.Budget and one
// breaker.Breaker with their default Configs hold (the suite's state per
// client and target, besides the engine's), measured as StateBytes does.
func LibraryBytes(n, tries int) (budgetBytes, breakerBytes float64) {
	return HeapPer(n, tries, func(int) any { return budget.New(budget.Config{}) }),
		HeapPer(n, tries, func(int) any { return breaker.New(breaker.Config{}) })
}

// HeapPer returns the heap that n values made by newValue hold, per value: the
// least of tries measurements.
func HeapPer(n, tries int, newValue func(i int) any) float64 {
	best := math.Inf(1)
	for range max(tries, 1) {
		vs := make([]any, n) // outside the measurement
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for i := range vs {
			vs[i] = newValue(i)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		runtime.KeepAlive(vs)
		best = min(best, (float64(after.HeapAlloc)-float64(before.HeapAlloc))/float64(n))
	}
	return best
}
