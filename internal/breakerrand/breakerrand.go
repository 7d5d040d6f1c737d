// Package breakerrand gives a breaker.Config the source of randomness its
// open periods' jitter is drawn from, which package breaker does not
// export (it is no configuration): the module's tests, examples and
// simulators seed it, so that a half-open instant is exact or a run
// repeats.
package breakerrand

// Set sets the source of the *breaker.Config c points to: f returns a
// number in [0, 1) and must be safe for concurrent use when breakers share
// it (a Registry's do). Package breaker sets Set when it is initialized,
// which is before any program can make a breaker.Config.
var Set func(c any, f func() float64)
