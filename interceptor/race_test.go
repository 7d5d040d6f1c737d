//go:build race

package interceptor_test

// raceEnabled: under the race detector the fleet tests run smaller fleets
// (it slows them tenfold; CI runs the larger ones without it).
const raceEnabled = true
