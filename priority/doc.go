// Package priority marks how much a call matters to its caller, so that an
// overloaded server sheds the work that matters least first.
//
// A call has one of three priorities, in order: [Sheddable] (work that may
// be dropped: prefetches, batch jobs, best-effort refreshes), [Default]
// (the zero value: what a call without a mark is), and [Critical] (work a
// user waits for and that has no substitute). A caller marks a call with
// [NewContext]:
//
//	ctx = priority.NewContext(ctx, priority.Sheddable)
//	resp, err := client.Refresh(ctx, req)
//
// # Down the chain
//
// The suite's client (package interceptor) sends a call's priority, when
// it is not Default, in the request header semconv.PriorityKey
// ("stormguard-priority"), on every attempt. The suite's server reads it,
// and puts the priority it honours in the handler's context, so that the
// calls the handler makes inherit it, as they inherit its deadline: a hop
// keeps its caller's priority unless it sets one with NewContext. A call
// without a header is Default; so is one whose header is not exactly one
// value that [Parse] accepts.
//
// # Under overload
//
// The suite's server sheds, at a concurrency limit, sheddable work first,
// then retries and hedges, then Default first attempts, and critical first
// attempts last: only when the critical requests in flight alone fill the
// limit. Before a limit engages, sheddable work is shed once the backlog
// would take longer than the method tolerates (package overload states
// the thresholds). A retry or hedge of a
// critical call is a retry: it is shed with the others.
//
// # What a caller claims
//
// The header is the caller's word. A caller that claims Critical for all
// its calls is shed after honest callers' Default and Sheddable work; it
// gains nothing over callers that claim Critical too (when every call is
// critical, the server sheds as if none were), it is still refused when
// its deadline cannot be met, its retries are still shed as retries, and
// critical requests are shed once they alone fill the limit. A server that
// does not trust its callers lowers what it honours
// (interceptor.WithPriorityCap). docs/overload.md says more.
//
// The package is free of gRPC; its functions are safe for concurrent use.
package priority
