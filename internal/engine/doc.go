// Package engine is the client's attempt engine without a transport: what
// happens to a logical call after each of its attempts, whatever RPC stack
// sends them. The interceptor package adapts it to grpc-go; the fleet
// simulator (examples/internal/fleetsim) drives it on a virtual clock. It
// imports nothing of gRPC, and every time it uses is given to it.
//
// Reading it:
//
//   - call.go: what a call is to the engine (its plan, what it has sent,
//     how its next retry is paid) and what it asks of its adapter (Host);
//   - step.go: the one step, from a finished attempt to what happens next
//     (Step: the call's answer, a refusal, or a retry after a delay; a
//     hedged call adds only "others are still in flight");
//   - gates.go: the one admission: may an attempt be sent (peek), and send
//     it (take: Open, Cut.Take, a pick's payment); the only place that asks
//     the deadline, the breaker, the throttle, the budget and the endpoint
//     table, reads shadow mode, and judges whether a target serves nothing;
//   - rules.go: the one rule set: whether and when a failed attempt is
//     retried or failed over, the backoff, and when a hedge is due; the
//     attempt limit and the user's predicate are asked there only;
//   - pick.go: what a pick decides (endpoints avoided, a guarded first
//     attempt, a fail-over with nowhere else to go);
//   - endpoints.go, yield.go, latency.go, probes.go: what a client keeps of
//     a target between calls (its endpoints' outcomes, its load, its
//     latencies, the probes of retry loops outside the client);
//   - outcome.go, route.go: the vocabulary (codes, outcomes, reasons,
//     kinds) and a route's configuration.
//
// An adapter for an RPC stack provides: a Route per target and method
// (budget, breaker, endpoint table, yield, rule); per call, the plan
// (Call.Rule, Repeatable, Deadline, ...) and a Host (the operator's
// configuration read again, the user's retry predicate); per attempt, an
// Outcome (the status code numbered as gRPC's, the server's pushback and
// RetryInfo parsed, the endpoint the attempt went to, the time); the
// endpoint each pick chose (Pick.Judge), if it can see picks; its clock
// and timers; and what to record of each Verdict and Admission.
package engine
