package fleetsim

import (
	"cmp"
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

// source yields the calls of one open-loop group in time order: client
// i's k-th call is due at phase_i + k × period.
type source struct {
	period  int64
	jitter  float64
	phases  []int64 // sorted
	clients []int32 // the clients, in phase order
	k       int64   // the period being walked
	j       int     // the next client in it
}

func newSource(seed uint64, first int, g Group) *source {
	p := time.Duration(float64(time.Second) / g.Rate) // as the storm lab's fleet
	s := &source{period: int64(p), jitter: g.Jitter, phases: make([]int64, g.Clients), clients: make([]int32, g.Clients)}
	type ph struct {
		at int64
		i  int32
	}
	all := make([]ph, g.Clients)
	for i := range all {
		all[i] = ph{int64(Phase(seed, first+i, p)), int32(first + i)}
	}
	slices.SortFunc(all, func(a, b ph) int { return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.i, b.i)) })
	for i, x := range all {
		s.phases[i], s.clients[i] = x.at, x.i
	}
	return s
}

// peek returns when the next call is due.
func (s *source) peek() int64 { return s.phases[s.j] + s.k*s.period }

// next returns the next call: its client and its number; peek says when.
func (s *source) next() (client int, k int) {
	client, k = int(s.clients[s.j]), int(s.k)
	if s.j++; s.j == len(s.phases) {
		s.j = 0
		s.k++
	}
	return client, k
}
