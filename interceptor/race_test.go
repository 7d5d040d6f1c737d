//go:build race

package interceptor_test

// Under the race detector every goroutine hand-off is several times
// slower, so the latency bound of the long-tail test is relative; CI also
// runs that test without -race, against the 50 ms bound.
const raceEnabled = true
