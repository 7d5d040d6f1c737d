package fleetsim

import (
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

// Phase is when client i's first call is due in an open-loop group of
// period p: a uniform in [0, p) seeded by the seed and the client's index
// in the fleet. It is the storm lab's fleet offset, so that the lab's
// fleet and the model's make their calls at the same offsets.
func Phase(seed uint64, i int, p time.Duration) time.Duration {
	return time.Duration(rand.New(rand.NewPCG(seed, uint64(i))).Float64() * float64(p))
}

// The packing of a period's calls into one word: the call's offset in its
// period (ns) above clientBits bits of the client's index in its group.
const (
	clientBits = 20 // MaxClients ≤ 1 << clientBits
	clientMask = 1<<clientBits - 1
)

// source yields the calls of one open-loop group in time order. Client
// i's k-th call is due in the k-th period of the group, at its phase (a
// share of the period), moved on by a random share in [0, jitter) of a
// period, wrapped around within the period: without jitter at phase_i +
// k × period, with jitter 1 anywhere in the period. Each period's calls
// are sorted once, as the period starts.
type source struct {
	seed   uint64
	first  int // the group's first client in the fleet
	period int64
	jitter float64
	phases []float64 // client i's phase, as a share of the period
	cur    []uint64  // this period's calls, sorted
	k      int64     // this period
	j      int       // the next call in it
}

func newSource(seed uint64, first int, g Group) *source {
	p := time.Duration(float64(time.Second) / g.Rate) // as the storm lab's fleet
	s := &source{seed: seed, first: first, period: int64(p), jitter: g.Jitter,
		phases: make([]float64, g.Clients), cur: make([]uint64, g.Clients)}
	for i := range s.phases {
		s.phases[i] = float64(Phase(seed, first+i, p)) / float64(p)
	}
	s.fill()
	return s
}

// fill lays out period k's calls in time order.
func (s *source) fill() {
	if s.jitter == 0 && s.k > 0 {
		return // the same offsets every period
	}
	for i, ph := range s.phases {
		f := ph
		if s.jitter > 0 {
			f += draw(s.seed, saltJitter, s.first+i, int(s.k), 0) * s.jitter
			f -= math.Floor(f)
		}
		off := min(int64(f*float64(s.period)), s.period-1)
		s.cur[i] = uint64(off)<<clientBits | uint64(i)
	}
	slices.Sort(s.cur)
}

// peek returns when the next call is due.
func (s *source) peek() int64 { return s.k*s.period + int64(s.cur[s.j]>>clientBits) }

// next returns the next call: its client and its number; peek says when.
func (s *source) next() (client int, k int) {
	client, k = s.first+int(s.cur[s.j]&clientMask), int(s.k)
	if s.j++; s.j == len(s.cur) {
		s.j = 0
		s.k++
		s.fill()
	}
	return client, k
}
