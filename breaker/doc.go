// Package breaker is a per-target circuit breaker for RPC clients.
//
// A retry budget bounds retries while a dependency partly works; a breaker
// stops the traffic once the dependency has proven it is down, and finds out
// quickly and gently when it is back. The package knows nothing of gRPC: a
// Breaker is a plain concurrent data structure, and the caller decides which
// attempt outcomes count as failures.
//
// # Defaults
//
// By default a breaker opens only when every attempt in its 10 s window
// failed, at least 20 of them, and lets a probe through after 1 s (plus up
// to 20% jitter), a period each failed probe round doubles up to 4 s. A
// breaker that refused a dependency still serving some calls, or kept
// refusing one that had healed, would cost availability that no retries at
// all would have had.
//
// # States
//
// A Breaker is closed (attempts pass and their outcomes are counted), open
// (attempts are refused with ErrOpen) or half-open (a few trial attempts,
// "probes", are let through to find out whether the dependency is back).
//
//   - closed → open when, among the outcomes reported in the sliding Window,
//     failures/attempts ≥ FailureRatio and attempts ≥ MinAttempts; or, if
//     ConsecutiveFailures > 0, after that many failures in a row.
//   - open → half-open once the open period has passed. The period is
//     OpenTimeout, doubled for each consecutive failed probe round and capped
//     at MaxOpenTimeout, plus a random Jitter share so that a fleet of
//     clients does not probe in lockstep.
//   - half-open admits at most HalfOpenProbes concurrent probes; refused
//     calls get ErrOpen. It closes once HalfOpenProbes probes have succeeded,
//     and reopens on the first failed probe. A probe that reports nothing
//     for a whole Window is presumed failed.
//
// # Reporting outcomes
//
// Allow is the two-step API of the contract: it returns a done func to be
// called once with the attempt's outcome. Admit returns a Ticket, a value
// with the same meaning that never allocates, plus Ticket.Ignore for
// attempts whose outcome says nothing about the dependency (for example a
// call cancelled by its caller). Either way:
//
//   - every state change starts a new generation, and an outcome reported
//     for an attempt admitted in an older generation is ignored;
//   - reporting the same attempt twice counts once.
//
// # Concurrency and time
//
// All methods are safe for concurrent use. A Breaker starts no goroutines:
// the window and the state advance lazily, whenever the Breaker is used or
// inspected. The methods without a time (Admit, Ticket.Done, State, ...)
// read the monotonic clock; each has an At form (AdmitAt, Ticket.DoneAt,
// StateAt, ...) that takes the time from the caller, so that a test or a
// simulator drives a Breaker on its own clock, as x/time/rate's AllowN
// does. A Breaker's time line, and its window's buckets, start at the first
// time it is given. OnStateChange runs outside any lock, one call at a time
// and in the order of the transitions, so a callback may call back into its
// Breaker.
//
// # Cost
//
// On a closed Breaker, Admit and the report of a success take no lock and
// do not allocate. A Breaker whose FailureRatio is 1 (the default) makes
// its window at its first failure: until then it needs to know only its
// latest success, so a Breaker of a method that never fails costs about
// 250 bytes (with its window, about 600), and decides exactly as one
// that counted every success.
package breaker
