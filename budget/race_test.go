//go:build race

package budget_test

// raceEnabled: the race detector slows the fleet simulations tenfold, and
// they run on one goroutine, where it finds nothing; under it the fleet
// test runs its small cells only (CI runs the whole grid without it).
const raceEnabled = true
