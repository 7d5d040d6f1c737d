// Package overload protects a server from overload, and from staying
// overloaded after its cause has passed (a metastable failure): it decides,
// per request on arrival, whether to run it, using two mechanisms per
// method. It knows nothing of gRPC; interceptor.NewServer applies it to
// unary calls (see interceptor.WithOverload).
//
//	g := overload.New(overload.Config{})
//	m := g.Method("/pkg.Svc/Method") // cache it: a lookup without a lock
//	t, d := m.Admit(deadline, hasDeadline, isRetry)
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
// # What a caller claims
//
// A request's deadline and attempt number are metadata its caller chooses
// (grpc-timeout or stormguard-deadline-ms; grpc-previous-rpc-attempts),
// not facts. A deadline more than MaxDeadline (10 s) away is treated as
// no deadline at all, so that claiming a longer one than the caller has
// buys nothing that a request without one does not get. The attempt number
// protects the server from the retries of clients that send it: see
// IsRetry for what it does not protect from.
//
// # Deadline-aware admission
//
// A request whose remaining deadline is already shorter than what the
// method needs now is refused on arrival (RefusedDeadline): a queue of
// requests that will miss their deadlines is not worked through, and the
// caller is told not to retry with the same deadline. What the method
// needs now is the smaller of two estimates, so that both must agree:
//
//   - its recent history: the Quantile (0.1) of the handler latencies that
//     ended in the last Window (1 s);
//   - its backlog: the requests in flight, plus this one, at the rate
//     requests ended in that window (Little's law).
//
// The history alone would go on refusing after a backlog has drained:
// refused requests teach it nothing, and it is not fooled by them (a
// refusal is no latency). The backlog alone would refuse during a burst
// that parallel handlers absorb. Requests reported with Done are learned,
// and those reported with Abandon as what they prove, that the method took
// at least that long (a lower bound only lowers the estimate: admission
// then refuses less, never more); a method that answers "busy" at once
// when overloaded (Discard) must not look fast. Nothing is refused before
// MinSamples (20) latencies, or for a request without a deadline. A low
// Quantile keeps refusals to requests that only the fastest tenth of
// recent requests would have served in time.
//
// # Retry-aware shedding
//
// Each method has an adaptive concurrency limit, a gradient limiter after
// Netflix's concurrency-limits: every LimitWindow (100 ms, at least 5
// ends) it looks at the least latency of the window. A window is slow when
// every request in it took longer than both Tolerance (2) times the
// method's baseline latency and DeadlineShare (half) of what its callers
// had left (their 10th percentile). Slowness alone is no overload: a
// method whose dependency became slower, and that serves every request,
// keeps up, and its baseline learns the new latency (in about 5 s). A slow
// window is overloaded when the method also fails to keep up: its queue
// grows (the requests in flight rose in each half of the last six
// windows, beyond noise, so that the step of a method that became slower
// does not count), or callers missed deadlines it could meet (refused on
// arrival, or ended after them; this is remembered for six windows), and
// the requests in flight did not fall (a server catching up after a pause
// has a backlog, not a standing queue). Two overloaded windows in a row
// engage a limit at the concurrency that, at the window's throughput, has
// the tolerated latency. While engaged, the limit shrinks by the ratio of
// the tolerated to the seen latency (at most by half per window) in
// overloaded windows and, once callers have missed deadlines under it, in
// slow ones; engaged by a growing queue alone, it grows while the method
// keeps up. It grows by its square root while the latency is tolerable,
// and is let go once fewer than half of it are in flight. A burst or a
// pause does not engage it (some requests of the window are fast, or the
// backlog drains), nor does a slow method whose callers' deadlines leave
// room, nor one that keeps up. The limit learns only what a request
// proves: the latency of one that completed, and of one cut short only
// that it took longer, which counts when even that is beyond the tolerated
// latency (so that calls cancelled at once make a method look neither
// fast nor slow). MaxConcurrency sets a fixed limit over all methods
// besides.
//
// At a limit, retries and hedges (grpc-previous-rpc-attempts > 0, see
// IsRetry) are shed first: from RetryShare (half) of it, with "do not
// retry"; first attempts only at the limit itself, with a pushback of
// RetryAfter (100 ms), after which a retry meets the retries' threshold.
// An adaptive limit sheds a first attempt only when admission cannot
// judge it (it has no deadline, or one beyond MaxDeadline, or
// NoAdmission): admission already refuses the first attempts that would
// miss their deadlines, and the others, queued past the limit, are served
// in time, as they would be without a Guard. Shedding them as well cost 99
// of the 1,311 calls that no retries serve in the storm lab's metastable
// scenario (a capacity drop, callers without a per-attempt timeout).
// MaxConcurrency, a limit the user chose, sheds first attempts at it in
// every case.
//
// # Cost and bounds
//
// A decision and its Done are a handful of atomic operations and no
// allocation; no lock is taken but one TryLock per limit window. A method
// keeps 2.8 KB (four histograms of 128 counters for its history, one
// for its callers' deadlines: 2.8 MiB for MaxMethods, 1024, beyond which
// further methods share one state). Every Guard is safe for concurrent use;
// its clock is Config.Now, and the At forms take the time from the caller.
package overload
