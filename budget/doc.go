// Package budget implements a per-target retry budget: it caps the retries
// and hedges a client sends to one target at a fraction of the requests it
// sends there, so that a failing dependency sees about 1.1 times its normal
// load, not three times, whether that load comes from one busy client or
// from a fleet of quiet ones.
//
// Each logical call makes one Deposit before its first attempt (never
// refused); each retry makes one Withdraw and each hedge one Hedge, and is
// sent only if it returned true. A Registry keeps one Budget per target.
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
// # Credit and loans
//
// Every Deposit credits Ratio of a retry (in fixed point: units of 1e-6 of
// a retry, so 0.1 is exactly 100000 units and 50 deposits credit exactly 5
// retries); every granted Withdraw costs one retry. A Withdraw is granted:
//
//   - from the credit, when the requests have paid for a whole retry. The
//     credit holds at most MaxCredit (two retries): healthy traffic banks
//     nothing more that a failure could spend later;
//   - else as a loan, when the Budget lends: its credit may go down to
//     minus max(Burst, Ratio × the requests of the last ShortWindow), and
//     the requests that follow repay the loan before they fund anything
//     else. A fresh client can so retry its first failures (up to Burst,
//     5 by default), and a client at 1,000 requests per second whose
//     connection drops 50 calls at once can retry all 50 (up to 100).
//
// A Budget lends only in the first LendFor (3 s) of a failure, which
// begins at the first retry or hedge asked for since its credit was last
// full (MaxCredit), and only until it has lent all it may; it lends again
// once the requests have repaid the loans and filled the credit, which
// takes a stretch of calls that need fewer retries than Ratio. So a failure
// that asks for more than Ratio is funded by loans for at most its first
// LendFor and by the ratio alone after, while a client whose failures stay
// below Ratio keeps lending for its bursts.
//
// A hedge (Hedge) is granted from the credit as a retry is, but lent only
// while the Budget is owed at most half its loan limit, and refusing it
// neither stops the Budget lending nor counts against it when the Budget
// judges whether to lend again: hedges buy latency, and the rest of the
// loan is kept for the retries that rescue failures. A burst of slow calls
// (a fresh client's first calls, slower than those its hedging delay was
// learned from; a pause of the whole process) so neither leaves the next
// failure without its retry nor stops hedging until a whole loan is repaid.
//
// On false nothing is withdrawn.
//
// # Guarantees
//
// With credit c(t) (in retries: at most MaxCredit, and at least minus the
// loan limit), over any interval [a, b] the grants are at most
//
//	Ratio × deposits + c(a) − c(b) < Ratio × deposits + MaxCredit + owed(b)
//
// where owed(b) = max(0, −c(b)). During a failure that asks for more than
// Ratio, the Budget lends only in the failure's first LendFor, and is
// repaid by the requests that follow. So, for one client, its retries and
// hedges are less than Ratio × its requests plus MaxCredit (the credit it
// may hold when the interval begins): from LendFor into the failure on,
// and over the whole failure once it is repaid; before that, plus what it
// owes, at most max(Burst, Ratio × the last second's requests).
//
// A fleet of N clients, each with its own Budget (the common shape of a
// microservice dependency), sums this up: with the defaults, a fleet of 20
// to 1,000 clients sends at most 1.10× its calls from 5 s into a failure
// on (TestFleetBound). The grid behind that figure, and why a per-client
// floor of retries per second cannot give such a bound, are in the
// package's design notes, budget/README.md.
//
// # A server's budget
//
// A Method is the budget a server applies to one of its methods: the
// first attempts it admits pay for the retries and hedges it admits, so
// that what reaches the method is bounded whatever its callers run (their
// own budgets, or none). It refuses retries only while the method fails
// more than Ratio of its recent calls (MethodWindow): while it serves, the
// retries it gets are fail-overs from other servers, and cost nothing.
//
//	m := budget.NewMethod(budgets.For(method))
//	if !m.AdmitAt(now, isRetry, clientConn) {
//		return errOverBudget // before the method runs; say "do not retry"
//	}
//	err := run()
//	m.DoneAt(time.Now(), failedTheCaller(err))
//	if failedTheCaller(err) && !m.PromiseAt(time.Now(), isRetry) {
//		// say the budget is dry: the caller's Budget starts no loan for a
//		// retry (PeekNoNewLoanAt, WithdrawNoNewLoanAt)
//	}
//
// A Method's PromiseAt, asked when a call fails, tells its caller whether
// a retry would be admitted, so that a retry the Method would refuse is
// not sent on a loan: a fleet of quiet clients, whose own first failures
// (and start-up loans) come long after the fleet's, then sends about what
// the Method admits. While the method fails, a first attempt's retry it
// can pay for is withdrawn then, and held for the retry that comes.
//
// # Time
//
// A Budget needs the time to place deposits in its windows and to age its
// loans. Deposit, Withdraw and Stats read the monotonic clock; DepositAt,
// WithdrawAt and StatsAt take the time as an argument, so that a caller
// that already read the clock (an interceptor) or a simulation can drive
// the Budget. Times earlier than the latest one the Budget has seen are
// treated as that latest time: a clock that goes backwards stands still.
//
// # Invalid configuration
//
// Nothing panics, at New or later. In Config, 0 means the default; NaN and
// ±Inf Ratio are treated like 0; a negative Ratio means "no credit" and a
// negative Burst "no minimum loan", so Config{Ratio: -1, Burst: -1} grants
// nothing; very large Ratio and Burst are lowered to MaxRatio and MaxBurst.
//
// # Cost
//
// Deposit takes no lock while its slot does not change (one atomic add);
// Withdraw and Stats take one short mutex-protected critical section. None
// allocates; nor do a Method's AdmitAt and DoneAt (DoneAt takes no lock,
// AdmitAt only the Budget's). Deposit, Withdraw and Stats read the
// monotonic clock once; the At forms do not read it. No method starts a
// goroutine; there is no background work: windows are moved forward
// lazily by the calls themselves.
package budget
