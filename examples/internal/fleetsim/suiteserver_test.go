package fleetsim

import (
	"fmt"
	"testing"
	"time"
)

// overloadShape is one of the storm lab's overload scenarios, in the
// model: 4 clients, strictly periodic (the lab's 4 connections), against
// one backend of 4 workers whose service time goes up 3.2 times (to 31%
// of its capacity) from 2 s to 4 s of a 10 s run.
type overloadShape struct {
	name     string
	rate     float64 // per client
	service  time.Duration
	queue    int
	deadline time.Duration
}

// The lab's metastable failure (70% of 200/s, 1 s deadlines, a queue of
// 500) and overload blip (70% of 800/s, 100 ms deadlines, a queue of 100).
var (
	metastableShape = overloadShape{"metastable", 35, 20 * time.Millisecond, 500, time.Second}
	blipShape       = overloadShape{"blip", 140, 5 * time.Millisecond, 100, 100 * time.Millisecond}
)

func (o overloadShape) config(client *ClientPolicy, server *ServerPolicy) Config {
	return Config{
		Groups:   []Group{{Clients: 4, Rate: o.rate}},
		Backends: Backends{M: 1, Workers: 4, Queue: o.queue, Service: o.service, RTT: 200 * time.Microsecond},
		Failure:  Failure{Mode: CapacityDrop, Factor: 3.2, Start: 2 * time.Second, End: 4 * time.Second},
		Duration: 10 * time.Second, Deadline: o.deadline, Settle: time.Second, Seed: 1, Client: client, Server: server,
	}
}

// TestTheSuiteServerQueuesInOverload: in the storm lab's metastable
// failure and overload blip, modelled, the suite's server holds first
// attempts in its queue once its adaptive limit engages, gives them places
// in order, and refuses those that can no longer end in time: its callers
// complete at least as many calls as with no retries at all and recover no
// later (the lab's do-no-harm checks), and in the metastable failure, where
// the deadline (1 s) outlasts the backend's queue, the handler works at
// most 5% of its requests for callers who had left (the lab's waste
// bound). Every held attempt is accounted for: admitted, refused, or gone
// with its caller.
func TestTheSuiteServerQueuesInOverload(t *testing.T) {
	for _, o := range []overloadShape{metastableShape, blipShape} {
		for _, c := range []*ClientPolicy{PolicySuite(), PolicyGRPC()} {
			t.Run(fmt.Sprintf("%s/%s", o.name, c.Key), func(t *testing.T) {
				none := run(t, o.config(PolicyNone(), nil))
				s := run(t, o.config(c, PolicySuiteServer()))
				t.Logf("%s behind the suite's server: ok %d of %d (no retries %d), recovery %v (%v), wasted %d of %d handled (%d), held %d, left %d, refused %d",
					c.Name, s.All.OK, s.All.Calls, none.All.OK, s.Recovery, none.Recovery, s.Wasted, s.All.Handled, none.Wasted, s.ServerHeld, s.ServerLeft, s.ServerRefused)
				if s.ServerHeld == 0 {
					t.Errorf("no attempt waited in the server's queue")
				}
				if s.All.OK < none.All.OK {
					t.Errorf("ok %d, below no retries' %d", s.All.OK, none.All.OK)
				}
				if s.Recovery < 0 || s.Recovery > none.Recovery {
					t.Errorf("recovery %v, later than no retries' %v", s.Recovery, none.Recovery)
				}
				if o.deadline >= time.Second && float64(s.Wasted) > 0.05*float64(s.All.Handled) {
					t.Errorf("wasted %d of %d requests handled, want at most 5%%", s.Wasted, s.All.Handled)
				}
			})
		}
	}
}
