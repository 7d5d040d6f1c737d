package budget_test

import (
	"fmt"
	"time"

	"github.com/stormguard/stormguard/budget"
)

func Example() {
	// Explicit times, so that the example does not depend on the clock:
	// everything below happens in the same instant.
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	b := budget.New(budget.Config{}) // 10%, lending at least 5

	for range 50 {
		b.DepositAt(now) // one per logical call, before its first attempt
	}
	retries := 0
	for b.WithdrawAt(now) { // one per retry or hedge
		retries++
	}
	// Two retries of credit (the most it banks), then a loan of 10% of the
	// last second's calls, which the next calls repay.
	fmt.Println("retries granted:", retries)
	fmt.Printf("%+v\n", b.StatsAt(now))
	// Output:
	// retries granted: 7
	// {Requests:50 Granted:7 Lent:5 Refused:1 Credit:-5 Lending:false Balance:0}
}

func ExampleRegistry() {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	budgets := budget.NewRegistry(budget.Config{
		Ratio: 0.2,
		Burst: -1, // no minimum loan: only the requests fund retries
	})
	for range 10 {
		budgets.For("payments:443").DepositAt(now)
	}
	b := budgets.For("payments:443")
	fmt.Println(b.WithdrawAt(now), b.WithdrawAt(now), b.WithdrawAt(now), b.WithdrawAt(now), b.WithdrawAt(now))
	fmt.Println(budgets.For("ledger:443").WithdrawAt(now)) // another target: no credit of its own
	fmt.Println(budgets.Len(), "targets")
	// Output:
	// true true true true false
	// false
	// 2 targets
}

func ExampleConfig_none() {
	// Negative Ratio and Burst mean none: this budget refuses every retry,
	// however many requests it sees.
	b := budget.New(budget.Config{Ratio: -1, Burst: -1})
	for range 1000 {
		b.Deposit()
	}
	fmt.Println(b.Withdraw())
	// Output: false
}

// A fresh client's first failures are lent for, and repaid by the calls
// that follow: the start-up burst.
func ExampleBudget_WithdrawAt() {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	b := budget.New(budget.Config{})
	granted := make([]bool, 8)
	for i := range granted {
		now := start.Add(time.Duration(i) * 100 * time.Millisecond)
		b.DepositAt(now)
		granted[i] = b.WithdrawAt(now) // every call fails once
	}
	fmt.Println(granted)
	fmt.Printf("owed %.1f retries\n", -b.StatsAt(start.Add(time.Second)).Credit)
	// Output:
	// [true true true true true false false false]
	// owed 4.2 retries
}

func ExampleMethod() {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	budgets := budget.NewRegistry(budget.Config{}) // one Budget per method
	m := budget.NewMethod(budgets.For("/shop.v1.Orders/Get"))

	// 100 first attempts arrive, and the method fails them all.
	for range 100 {
		m.AdmitAt(now, false, 0)
		m.DoneAt(now, true)
	}
	// Their callers retry every one: the budget admits the two retries of
	// credit it banks at most, and lends 10% of the last second's first
	// attempts, which the next first attempts repay.
	admitted := 0
	for range 100 {
		if m.AdmitAt(now, true, 0) {
			admitted++
		}
	}
	fmt.Println("failing:", m.FailingAt(now), "retries admitted:", admitted)
	// Output:
	// failing: true retries admitted: 12
}
