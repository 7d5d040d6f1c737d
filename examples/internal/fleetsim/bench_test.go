package fleetsim

import (
	"testing"
	"time"
)

// BenchmarkRun runs a fleet of 10,000 clients at a call a second each for
// 10 s (100,000 calls) against a target that serves 2.4 times that,
// independent failures at p = 0.5 from 2 s to 8 s, per row: ns/call is the
// wall time of a run (its clients' set-up included) per call.
func BenchmarkRun(b *testing.B) {
	for _, r := range Rows() {
		switch r.Key {
		case "none", "grpc-throttle", KeySuite:
		default:
			continue
		}
		b.Run(r.Key, func(b *testing.B) {
			cfg := Config{
				Groups:   []Group{{Clients: 10_000, Rate: 1, Jitter: 1}},
				Backends: Backends{M: 3, Workers: 80, Queue: 2560, Service: 10 * time.Millisecond, RTT: time.Millisecond},
				Failure:  Failure{Mode: Independent, P: 0.5, Start: 2 * time.Second, End: 8 * time.Second},
				Duration: 10 * time.Second, Seed: 1, Client: r.Client, Server: r.Server,
			}
			calls := 0
			for b.Loop() {
				res, err := Run(cfg)
				if err != nil {
					b.Fatal(err)
				}
				calls += res.All.Calls
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(calls), "ns/call")
		})
	}
}
