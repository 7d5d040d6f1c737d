// Command stormsim simulates a fleet of clients calling one target on a
// virtual clock, fast, with every retry policy users pick side by side:
// no retries, grpc-go's retryPolicy with and without retryThrottling, the
// AWS SDKs' standard retry quota (today's and 2026's), Envoy's and
// Finagle's retry budgets, Google SRE's adaptive throttling, and the
// suite's defaults, whose budget, breaker and server (admission, queue,
// retry budget) are the library's own code. It answers what the storm lab
// (real gRPC, real time) cannot on one machine: a fleet of 10,000 pods, or
// 100,000 clients at a call every ten seconds.
//
//	go run ./examples/stormsim                                   # 1,000 clients × 1/s, independent failures at p = 0.5
//	go run ./examples/stormsim -clients 100000 -rate 0.1 -seconds 600 -failure outage
//	go run ./examples/stormsim -mix 10x50,5000x0.1 -failure capacity-drop -svg run.svg
//	go run ./examples/stormsim -sweep                             # the suite's settings, for an operator to choose
//	go run ./examples/stormsim -grid                              # the README's grid and its verdicts
//	go run ./examples/stormsim -memory                            # state memory per client, per policy
//
// The model is examples/internal/fleetsim; the README says what it
// models, what it does not, and how it compares with the storm lab.
package main
