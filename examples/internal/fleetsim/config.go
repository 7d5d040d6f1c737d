package fleetsim

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Mode is a failure mode of the target.
type Mode uint8

// The failure modes. Each applies from Failure.Start to Failure.End.
const (
	// Healthy: nothing fails.
	Healthy Mode = iota
	// Independent: each attempt fails with UNAVAILABLE, at once, with
	// probability Failure.P (a draw per call and attempt).
	Independent
	// BackendDead: the first backend answers UNAVAILABLE to everything, at
	// once; the others serve.
	BackendDead
	// Outage: every backend answers UNAVAILABLE to everything, at once.
	Outage
	// CapacityDrop: every request takes Failure.Factor times the service
	// time, so the backends serve 1/Factor of their capacity.
	CapacityDrop
	// LatencyTail: a share Failure.P of each backend's requests (exactly:
	// one in 1/P) take Failure.Factor times the service time.
	LatencyTail
	// Throttling: each backend serves at most Failure.Limit requests a
	// second (a token bucket of a tenth of a second's worth) and answers
	// the others RESOURCE_EXHAUSTED at once, with a pushback of
	// Failure.Pushback.
	Throttling
)

var modeNames = [...]string{"healthy", "independent", "backend-dead", "outage", "capacity-drop", "latency-tail", "throttling"}

// String returns the mode's name, as ParseMode takes it.
func (m Mode) String() string {
	if int(m) < len(modeNames) {
		return modeNames[m]
	}
	return fmt.Sprintf("Mode(%d)", m)
}

// ParseMode returns the mode named s.
func ParseMode(s string) (Mode, error) {
	for i, n := range modeNames {
		if n == s {
			return Mode(i), nil
		}
	}
	return 0, fmt.Errorf("unknown failure mode %q (want one of %v)", s, modeNames)
}

// Failure is what goes wrong, and when.
type Failure struct {
	Mode Mode
	// P is the probability an attempt fails (Independent), or the share of
	// requests that are slow (LatencyTail).
	P float64
	// Factor multiplies the service time (CapacityDrop; LatencyTail's slow
	// requests).
	Factor float64
	// Limit is what each backend serves a second while Throttling.
	Limit float64
	// Pushback is the grpc-retry-pushback-ms a throttled attempt gets.
	Pushback time.Duration
	// Start and End bound the failure, from the start of the run.
	Start, End time.Duration
}

// Group is a set of alike clients: open loop (Rate calls a second each,
// evenly spaced from a seeded phase), or closed loop (Workers workers
// each, each sending its next call Think after its last one ended, Calls
// calls in all per client).
//
// An open-loop client's k-th call is due in the k-th period (1/Rate) of
// the run, at its phase (a seeded share of the period) moved on by a
// random share in [0, Jitter) of a period, wrapped around within the
// period: with Jitter 1 each client makes one call in each period, at a
// random time in it. Without jitter (the storm lab's fleet), every client
// calls at the same phase of every period, and a server whose answers
// depend on when requests come (a rate limit) answers the same clients
// alike period after period.
type Group struct {
	Clients int
	Rate    float64
	Jitter  float64
	Workers int
	Calls   int
	Think   time.Duration
}

// Backends is the target's side: M backends, each a server with Workers
// workers (0: as many as it needs) and a FIFO queue of Queue requests
// (full: UNAVAILABLE at once), each request taking about Service (±25%)
// of a worker; RTT is the network's round trip (±50%).
type Backends struct {
	M       int
	Workers int
	Queue   int
	Service time.Duration
	RTT     time.Duration
}

// Config is one run: a fleet against a target, one client policy and one
// server policy.
type Config struct {
	Groups   []Group
	Backends Backends
	Failure  Failure
	// Duration is how long calls are made; the run goes on until the
	// last call has ended.
	Duration time.Duration
	// Deadline is every call's deadline, from its start.
	Deadline time.Duration
	// Settle is the failure's first part, which the "after" figures leave
	// out (the start-up allowance of the fleet bound): 5 s by default.
	Settle time.Duration
	// Step is the time series' resolution: 100 ms by default.
	Step time.Duration
	// Seed seeds the run's random choices (phases, jitter, draws).
	Seed uint64
	// Client is the client policy; Server the server policy (nil: a
	// plain server).
	Client *ClientPolicy
	Server *ServerPolicy
	// Draw, if set, replaces the run's hashed draw of whether attempt a of
	// call k of client i fails (Independent): it returns a number in
	// [0, 1), compared with Failure.P. The storm lab's
	// cells use it to draw as the lab does.
	Draw func(client, k, attempt int, due time.Duration) float64
	// Probe, if set, is called once at ProbeAt with every client's state
	// (tests read what the library's structures hold then).
	Probe   func(clients []Client, now time.Time)
	ProbeAt time.Duration
}

// Defaults applied by Run to zero Config fields.
const (
	DefaultSettle   = 5 * time.Second
	DefaultStep     = 100 * time.Millisecond
	DefaultDeadline = 2 * time.Second
)

// Limits of a run: what Run refuses.
const (
	MaxClients  = 1_000_000
	MaxRate     = 1000.0
	MinRate     = 0.01
	MaxBackends = 64
	MaxDuration = time.Hour
)

func (c *Config) fill() {
	if c.Settle <= 0 {
		c.Settle = DefaultSettle
	}
	if c.Step <= 0 {
		c.Step = DefaultStep
	}
	if c.Deadline <= 0 {
		c.Deadline = DefaultDeadline
	}
	if c.Backends.M <= 0 {
		c.Backends.M = 1
	}
	if c.Client == nil {
		c.Client = PolicyNone()
	}
}

// Validate reports a Config Run cannot run.
func (c *Config) Validate() error {
	n := 0
	for _, g := range c.Groups {
		switch {
		case g.Clients < 1:
			return fmt.Errorf("a group of %d clients, want at least 1", g.Clients)
		case g.Workers > 0 && g.Calls < 1:
			return errors.New("a closed-loop group needs Calls")
		case g.Workers == 0 && (!(g.Rate >= MinRate) || g.Rate > MaxRate):
			return fmt.Errorf("%g calls/s per client, want %g to %g", g.Rate, MinRate, MaxRate)
		case !(g.Jitter >= 0 && g.Jitter <= 1):
			return fmt.Errorf("jitter %g, want one in [0, 1]", g.Jitter)
		}
		n += g.Clients
	}
	f := c.Failure
	switch {
	case n == 0:
		return errors.New("no clients")
	case n > MaxClients || n > clientMask+1:
		return fmt.Errorf("%d clients, want at most %d", n, MaxClients)
	case c.Backends.M > MaxBackends:
		return fmt.Errorf("%d backends, want at most %d", c.Backends.M, MaxBackends)
	case c.Backends.Workers < 0 || c.Backends.Queue < 0 || c.Backends.Service < 0 || c.Backends.RTT < 0:
		return errors.New("negative backend figures")
	case c.Duration <= 0 || c.Duration > MaxDuration:
		return fmt.Errorf("duration %v, want more than 0 and at most %v", c.Duration, MaxDuration)
	case !(f.P >= 0 && f.P <= 1):
		return fmt.Errorf("probability %g, want one in [0, 1]", f.P)
	case (f.Mode == CapacityDrop || f.Mode == LatencyTail) && !(f.Factor >= 1 && f.Factor <= 1000):
		return fmt.Errorf("factor %g, want 1 to 1000", f.Factor)
	case f.Mode == Throttling && !(f.Limit > 0 && !math.IsInf(f.Limit, 0)):
		return fmt.Errorf("throttling limit %g, want more than 0", f.Limit)
	case f.Mode != Healthy && (f.Start < 0 || f.End <= f.Start):
		return fmt.Errorf("failure from %v to %v, want 0 ≤ start < end", f.Start, f.End)
	case f.Mode == BackendDead && c.Backends.M < 2:
		return errors.New("backend-dead needs at least 2 backends")
	}
	return nil
}

// Clients returns the number of clients of the fleet.
func (c *Config) Clients() int {
	n := 0
	for _, g := range c.Groups {
		n += g.Clients
	}
	return n
}

// Rate returns the fleet's open-loop calls per second.
func (c *Config) Rate() float64 {
	r := 0.0
	for _, g := range c.Groups {
		if g.Workers == 0 {
			r += float64(g.Clients) * g.Rate
		}
	}
	return r
}
