package fleetsim

import (
	"fmt"
	"hash/fnv"
)

// mix is splitmix64's finalizer.
func mix(x uint64) uint64 {
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// draw returns a number in [0, 1) fixed by the seed, a salt, the client,
// its call and the attempt: the same for every policy of a run, so that
// every policy sees the same first attempts fail.
func draw(seed, salt uint64, client, k, attempt int) float64 {
	x := mix(seed ^ salt*0x9e3779b97f4a7c15)
	x = mix(x ^ uint64(client)*0xd1b54a32d192ed03)
	x = mix(x ^ uint64(k)*0xaef17502108ef2d9 ^ uint64(attempt))
	return float64(x>>11) / (1 << 53)
}

// LabUniform returns a number in [0, 1) fixed by the seed, a request id
// and the attempt: the storm lab's seeded choice of which attempts fail
// (the lab's origin draws with it), so that the model's cells shared
// with the lab fail the same attempts of the same calls.
func LabUniform(seed uint64, id string, attempt int) float64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/%s/%d", seed, id, attempt)
	// mixed: FNV's high bits are weak for short keys
	return float64(mix(h.Sum64())>>11) / (1 << 53)
}
