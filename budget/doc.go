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
// # Why two windows and a floor
//
// The TTL window makes deposits expire: traffic older than TTL funds nothing,
// and over any TTL the ratio-funded retries stay within Ratio × the requests.
// But a TTL window alone is a bank. Ten healthy minutes at 900 requests per
// second leave Ratio × 9000 = 900 retries of credit in a 10 s window, and an
// outage that begins then could spend all 900 in its first second: the
// decaying bucket of the seed article reached 1,169 attempts per tick against
// 900 requests for that reason (1,321 in this package's model of that
// simulation). The short window removes the bank: a retry also needs credit
// from the last second's requests, so the retries granted in any one second
// stay within about Ratio × that second's requests (exactly: for every
// interval I, ratio-funded retries in I ≤ Ratio × deposits in I extended
// min(TTL, ShortWindow) into the past). In the seed's simulation this budget
// peaks at 990 attempts per tick (900 + 90) and serves the
// same 15,900 requests as no budget at all. In steady traffic the short window
// is the binding one; the TTL window still caps the ratio-funded retries in
// the last TTL (to a slot) at Ratio × its requests, which the short window
// alone would let exceed by up to one second's worth of credit.
//
// A client that sends fewer than 1/Ratio requests per second never has a
// whole retry of credit in one second; the floor serves it. The default floor,
// 10 retries per second with a burst of 10 (the rate of Finagle's default
// RetryBudget, as a minimum rather than an addition), lets a fresh or quiet
// client retry its first failures. The floor does not accumulate: a burst of
// failures gets at most max(1, MinPerSecond) floor retries at once, then
// MinPerSecond per second.
// So over any interval
// of length L, granted ≤ Ratio × deposits (in the interval extended by
// min(TTL, ShortWindow) into the past) + MinPerSecond × L +
// max(1, MinPerSecond); the package's property test checks exactly this.
// (Deposits must be counted from before the interval: in any budget where a
// deposit funds a later retry, an interval can start between the two.)
//
// Both windows are rings of slots (100 for TTL, 10 for the short window), so
// a Budget uses about 2 KiB and constant time per call. Slots make expiry
// early, never late: a deposit stops counting between one slot and zero slots
// before its window has passed.
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
