// Package budget implements a per-target retry budget: it caps the retries
// and hedges a client sends to one target at a fraction of the requests it
// sends there, so that a failing dependency sees about 1.1 times its normal
// load, not three times.
//
// Each logical call makes one Deposit before its first attempt (never
// refused); each retry and each hedge makes one Withdraw and is sent only if
// Withdraw returns true. A Registry keeps one Budget per target.
//
//	b := budgets.For(target)
//	b.Deposit()
//	for attempt := 1; ; attempt++ {
//		err := call()
//		if err == nil || attempt == maxAttempts || !retryable(err) || !b.Withdraw() {
//			return err
//		}
//	}
//
// # What a retry is funded by
//
// A Withdraw is granted if either of these has room for it:
//
//   - The ratio. Every Deposit credits Ratio retries (in fixed point: units
//     of 1e-6 of a retry, so 0.1 is exactly 100000 units and 50 deposits fund
//     exactly 5 retries). A ratio-funded retry needs credit in two windows at
//     once: in the last TTL, Ratio × deposits − ratio-funded retries ≥ 1; and
//     the same in the last ShortWindow (one second), if TTL is longer.
//   - The floor: a token bucket that refills at MinPerSecond and holds at
//     most max(1, MinPerSecond) tokens, starting full. Every granted retry
//     takes a token if there is one, and counts against the ratio's credit,
//     whatever funded it; a retry the ratio refuses is granted only on a
//     token. The floor is a minimum, not an addition: a second's retries
//     are about max(Ratio × requests, MinPerSecond), never the sum. (With
//     the defaults, 50 callers failing at once get max(5, 10) = 10
//     retries; an additive floor would give them 15.)
//
// On false nothing is withdrawn from either.
//
// # Guarantees
//
// Deposits expire after TTL, and a ratio-funded retry also needs credit
// from the last second: healthy traffic banks nothing that an outage could
// spend at once, and the retries granted in any one second stay near Ratio
// × that second's requests. Over any interval of length L, granted ≤ Ratio
// × deposits (in the interval extended min(TTL, ShortWindow) into the past)
// + MinPerSecond × L + max(1, MinPerSecond); the property test checks
// exactly this. README.md explains why two windows and a floor, with the
// measurements behind them.
//
// # Invalid configuration
//
// Nothing panics, at New or later. In Config, 0 means the default; NaN and
// ±Inf are treated like 0; a negative Ratio means "no ratio" and a negative
// MinPerSecond "no floor", so Config{Ratio: -1, MinPerSecond: -1} grants
// nothing; a TTL ≤ 0 means the default; very large Ratio and MinPerSecond
// are lowered to MaxRatio and MaxMinPerSecond. A clock that goes backwards is
// treated as standing still.
//
// # Cost
//
// Deposit and Withdraw take one short mutex-protected critical section, read
// the clock once (DepositAt and WithdrawAt not at all) and do not allocate.
// On the default clock they read only the monotonic clock. Where the caller
// already has the time, as an interceptor does, the At forms save that read.
// No method starts a goroutine; there is no background work: windows are
// moved forward lazily by the calls themselves.
package budget
