//go:build race

package main

// Under the race detector every goroutine hand-off is several times
// slower, so the long-tail test, which judges latency, does not run.
const raceEnabled = true
