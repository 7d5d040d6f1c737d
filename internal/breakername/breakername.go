// Package breakername names the breaker a breaker.Config makes, which
// package breaker does not export (its Registry names the breakers it
// makes): the module's client names each route's breaker after its target
// and method without a Registry per route.
package breakername

// Set sets the name of the *breaker.Config c points to: breaker.New(*c)
// returns a Breaker whose Target is name. Package breaker sets Set when it
// is initialized, which is before any program can make a breaker.Config.
var Set func(c any, name string)
