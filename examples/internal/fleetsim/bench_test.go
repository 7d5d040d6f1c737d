package fleetsim

import (
	"testing"
	"time"
)

// benchConfig is a fleet of 10,000 clients at 1 call a second each for
// 10 s against a target sized for it (2.4× the calls), independent
// failures at p = 0.5 from 2 s to 8 s.
func benchConfig(p *ClientPolicy, s *ServerPolicy) Config {
	return Config{
		Groups:   []Group{{Clients: 10_000, Rate: 1, Jitter: 1}},
		Backends: Backends{M: 3, Workers: 80, Queue: 2560, Service: 10 * time.Millisecond, RTT: time.Millisecond},
		Failure:  Failure{Mode: Independent, P: 0.5, Start: 2 * time.Second, End: 8 * time.Second},
		Duration: 10 * time.Second, Seed: 1, Client: p, Server: s,
	}
}

// BenchmarkRun measures a run of 100,000 calls per policy; ns/call is the
// wall time per call.
func BenchmarkRun(b *testing.B) {
	rows := append(Rows()[:1], Rows()[8:]...)
	rows = append(rows, Rows()[2])
	for _, r := range rows {
		b.Run(r.Key, func(b *testing.B) {
			cfg := benchConfig(r.Client, r.Server)
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
