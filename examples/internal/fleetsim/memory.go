package fleetsim

import (
	"math"
	"math/rand/v2"
	"runtime"
)

// KernelBytesPerClient is what a run keeps per client besides its policy's
// state: the Client interface value in the clients' slice (16 bytes), its
// phase and place in its group's order (12), and the per-client counters
// of the failure window (8).
const KernelBytesPerClient = 16 + 12 + 8

// StateBytes returns the heap that the state of n clients of policy p
// holds, per client: the least of tries measurements (a measurement that
// a collection or another goroutine's allocation disturbs only comes out
// larger).
func StateBytes(p *ClientPolicy, n, tries int) float64 {
	best := math.Inf(1)
	for range max(tries, 1) {
		e := &Env{Rand: rand.New(rand.NewPCG(1, 2)), Base: base, Backends: 3, Clients: n}
		clients := make([]Client, n) // outside the measurement: the kernel's
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for i := range clients {
			clients[i] = p.New(e, i)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		runtime.KeepAlive(clients)
		best = min(best, (float64(after.HeapAlloc)-float64(before.HeapAlloc))/float64(n))
	}
	return best
}
