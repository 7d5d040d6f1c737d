package budget_test

import (
	"fmt"
	"time"

	"github.com/stormguard/stormguard/budget"
)

func Example() {
	// A fixed clock: everything below happens in the same instant.
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	// The defaults: 10%, a 10s TTL, a floor of 10/s with a burst of 10.
	b := budget.New(budget.Config{Now: func() time.Time { return now }})

	for range 50 {
		b.Deposit() // one per logical call, before its first attempt
	}
	retries := 0
	for b.Withdraw() { // one per retry or hedge
		retries++
	}
	fmt.Println("retries granted:", retries) // max(10% of 50, 10): a minimum, not a sum
	fmt.Printf("%+v\n", b.Stats())
	// Output:
	// retries granted: 10
	// {Requests:50 Granted:10 FromFloor:5 Refused:1 Balance:0}
}

func ExampleRegistry() {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	budgets := budget.NewRegistry(budget.Config{
		Ratio:        0.2,
		MinPerSecond: -1, // no floor: only the ratio funds retries
		Now:          func() time.Time { return now },
	})
	for range 10 {
		budgets.For("payments:443").Deposit()
	}
	fmt.Println(budgets.For("payments:443").Withdraw(), budgets.For("payments:443").Withdraw(),
		budgets.For("payments:443").Withdraw())
	fmt.Println(budgets.For("ledger:443").Withdraw()) // another target: no credit of its own
	fmt.Println(budgets.Len(), "targets")
	// Output:
	// true true false
	// false
	// 2 targets
}

func ExampleConfig_none() {
	// Negative Ratio and MinPerSecond mean none: this budget refuses every
	// retry, however many requests it sees.
	b := budget.New(budget.Config{Ratio: -1, MinPerSecond: -1})
	for range 1000 {
		b.Deposit()
	}
	fmt.Println(b.Withdraw())
	// Output: false
}
