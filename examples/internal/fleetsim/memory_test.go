package fleetsim

import "testing"

// TestStateMemory bounds each policy's state per client: the suite's
// (a budget, a breaker, the engine's share) under 4 KiB, each rival's
// under 256 bytes. A client's state is what a fleet of 100,000 costs a
// simulation, and what a process that talks to 100,000 targets would hold.
func TestStateMemory(t *testing.T) {
	for _, p := range append(Rivals(), PolicySuite()) {
		limit := 256.0
		if p.Key == "suite" {
			limit = 4096
		}
		b := StateBytes(p, 20_000, 3)
		t.Logf("%s: %.0f bytes per client", p.Name, b)
		if b > limit {
			t.Errorf("%s: %.0f bytes per client, want at most %.0f", p.Name, b, limit)
		}
	}
}
