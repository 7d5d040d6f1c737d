// Package fleetsim simulates a fleet of gRPC clients calling one target on
// a virtual clock: N clients at r calls per second each (open loop, or a
// few closed-loop workers), M backends behind the target, each a server
// with workers and a bounded queue, and a failure of one of several modes
// (independent failures, one backend dead, a full outage, a capacity drop,
// a latency tail, throttling with pushback). It is the model of
// examples/stormsim and of the storm lab's comparisons; it is not API.
//
// Everything that decides for the suite is the library's code, driven
// with explicit times: the client's attempt engine (internal/engine, with
// its retry budget, breaker and endpoint table; the model is an adapter of
// it, as the interceptor is), the server's admission and queue
// (overload.Method) and its retry budget (budget.Method). Nothing of the
// suite is transcribed. The rival policies
// (grpc-go's retryThrottling, the AWS SDKs' standard retry quota, Envoy's
// and Finagle's retry budgets, Google SRE's adaptive throttling, naive
// retries and none) are a few lines each, every constant's source cited.
//
// A run is deterministic: one goroutine, one seeded generator, and
// failure draws hashed from the call and the attempt, so that every policy
// sees the same first attempts fail.
package fleetsim
