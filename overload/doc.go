// Package overload protects a server from overload, and from staying
// overloaded after its cause has passed (a metastable failure): it decides,
// per request on arrival, whether to run it, using two mechanisms per
// method. It knows nothing of gRPC; interceptor.NewServer applies it to
// unary calls (see interceptor.WithOverload).
//
//	g := overload.New(overload.Config{})
//	m := g.Method("/pkg.Svc/Method") // cache it: a lookup without a lock
//	t, d := m.Admit(overload.Request{Deadline: deadline, Retry: isRetry})
//	if d.Reason != overload.Admitted {
//		return refusal(d) // d.RetryAfter < 0: tell the caller not to retry
//	}
//	err := handle()
//	switch {
//	case err == nil:
//		t.Done() // completed: what the method took
//	case ctx.Err() != nil:
//		t.Abandon() // cut short (caller left, deadline passed): took longer
//	default:
//		t.Discard() // failed on its own, often at once: teaches nothing
//	}
//
// # Deadline-aware admission
//
// A request whose remaining deadline is already shorter than what the
// method needs now is refused on arrival (RefusedDeadline), and its caller
// is told not to retry with the same deadline: a queue of requests that
// will miss their deadlines is not worked through. What the method needs
// now is the smaller of two estimates, so that both must agree: the
// Quantile (0.1) of the handler latencies that ended in the last Window
// (1 s), and the requests in flight, plus this one, at the rate requests
// ended in that window (Little's law). While every request of the method
// waits in a queue (its least latency in the last LimitWindow beyond
// Tolerance times its baseline), it is the second alone, at the rate
// requests ended in the last quarter to half of the Window, with a margin
// of a quarter: the queue is where the time goes, and a request admitted
// at its deadline's edge would be worked for a caller who has left.
// Nothing is refused before MinSamples (20) latencies, or for a request
// without a deadline.
//
// # Retry-aware shedding
//
// Each method has an adaptive concurrency limit, a gradient limiter after
// Netflix's concurrency-limits, updated every LimitWindow (100 ms). It
// engages only when the method is slow (every request of a window beyond
// Tolerance (2) times its baseline latency and DeadlineShare (half) of
// what its callers had left) and also fails to keep up (its queue grows,
// or its callers miss deadlines it could meet): a method that is only
// slower is not limited. MaxConcurrency sets a fixed limit over all
// methods besides.
//
// At a limit, retries and hedges (see IsRetry) are shed first: from
// RetryShare (half) of it, with "do not retry". First attempts are shed at
// the limit itself, with a pushback of RetryAfter (100 ms): at
// MaxConcurrency always, at an adaptive limit only when admission cannot
// judge them (no deadline, one beyond MaxDeadline, or NoAdmission).
//
// # Waiting for a place
//
// At an engaged adaptive limit, a first attempt that admission judges
// (one with a deadline) waits for a place under the limit instead
// (Queued; Ticket.Wait), in order of arrival, critical ones ahead: the
// queue is the server's, not its handler's. A waiting request whose caller
// leaves is gone without the method working for it, and one that, given a
// place, has less time left than the method needs then (the requests in
// flight and it, at the rate requests end) is refused for its deadline
// instead of being started. So a handler that does not watch its context
// works next to nothing for callers who have left, and a capacity drop
// costs no more calls than it must: the waiting requests are served in
// order as soon as places free, however short the drop.
//
// # Priorities
//
// A request may carry a priority (package priority; Request.Priority).
// Sheddable requests are shed before retries, from half of RetryShare of
// a limit (a quarter), deadline or not, and, while no adaptive limit is
// engaged, once the requests in flight would take longer than the method
// tolerates to drain; critical first attempts after default ones, only
// once the critical requests in flight alone fill the limit. Retries and hedges of critical calls are shed as retries. A
// request without a priority is Default, and is decided as it was before
// priorities existed; when every request is critical, the Guard decides
// as when none is.
//
// # What is learned
//
// Each admitted request reports its end on its Ticket, and teaches only
// what it proves: Done, a completed request's latency; Abandon, for one
// cut short (its caller left, or its deadline passed), that the method
// took at least that long; Discard, for one that failed on its own,
// nothing, so that a method that answers "busy" at once when overloaded
// does not look fast. Refusals teach nothing.
//
// # What a caller claims
//
// A request's deadline, attempt number and priority are metadata its
// caller chooses (grpc-timeout or stormguard-deadline-ms;
// grpc-previous-rpc-attempts; stormguard-priority), not facts. A deadline
// more than MaxDeadline (10 s) away is treated as no deadline at all, so
// that claiming a longer one than the caller has buys nothing. See IsRetry
// for what the attempt number protects from, and Method.AdmitAt
// for what claiming critical buys: no more than the limit's worth of
// critical work, no deadline that cannot be met, no retry past the
// retries' threshold.
//
// # Cost and bounds
//
// A decision and its Done are a handful of atomic operations and no
// allocation; no lock is taken but one TryLock per limit window, and,
// while requests wait for a place, the method's queue lock (a waiting
// request allocates twice, about 200 bytes). A method keeps 2.9 KB (four
// histograms of 128 counters for its history, one for its callers'
// deadlines: 2.9 MiB for MaxMethods, 1024, beyond which further methods
// share one state). Every Guard is safe for concurrent use.
//
// # Time
//
// The methods without a time (Admit, Ticket.Done, Ticket.Abandon,
// Ticket.Discard, Need) read the monotonic clock; each has an At form
// (AdmitAt, DoneAt, AbandonAt, DiscardAt, NeedAt) that takes the time from
// the caller, so that a test or a simulator drives a Guard on its own
// clock, as x/time/rate's AllowN does. Ticket.Wait blocks on its caller's
// context; its At form, WaitAt, never blocks: it returns the decision made
// by the time it is given, or Queued, and makes the request leave once its
// deadline has passed, so that a simulator asks again after each end it
// reports. A Guard's time line, and its history's slots, start at the
// first time it is given.
//
// docs/overload.md states the rules in full, says why they are these, and
// gives the measurements behind the defaults.
package overload
