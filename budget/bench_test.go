package budget_test

import (
	"testing"
	"time"

	"github.com/stormguard/stormguard/budget"
)

// The pair a logical call with one retry costs: Deposit, then Withdraw, on
// the monotonic clock.
func BenchmarkDepositWithdraw(b *testing.B) {
	bg := budget.New(budget.Config{})
	b.ReportAllocs()
	for b.Loop() {
		bg.Deposit()
		bg.Withdraw()
	}
}

func BenchmarkDepositWithdrawParallel(b *testing.B) {
	bg := budget.New(budget.Config{})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			bg.Deposit()
			bg.Withdraw()
		}
	})
}

// The At forms, as the interceptor calls them: one time.Now per pair.
func BenchmarkDepositWithdrawAt(b *testing.B) {
	bg := budget.New(budget.Config{})
	b.ReportAllocs()
	for b.Loop() {
		now := time.Now()
		bg.DepositAt(now)
		bg.WithdrawAt(now)
	}
}

func BenchmarkDepositWithdrawAtParallel(b *testing.B) {
	bg := budget.New(budget.Config{})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			now := time.Now()
			bg.DepositAt(now)
			bg.WithdrawAt(now)
		}
	})
}

// The Budget's own cost, without the clock: the At forms with a time that
// moves 1µs per pair (so slots still roll over), not read from the system.
func BenchmarkDepositWithdrawNoClock(b *testing.B) {
	bg := budget.New(budget.Config{})
	t0 := time.Now()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		now := t0.Add(time.Duration(i) * time.Microsecond)
		bg.DepositAt(now)
		bg.WithdrawAt(now)
		i++
	}
}

func BenchmarkDepositWithdrawNoClockParallel(b *testing.B) {
	bg := budget.New(budget.Config{})
	t0 := time.Now()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			now := t0.Add(time.Duration(i) * time.Microsecond)
			bg.DepositAt(now)
			bg.WithdrawAt(now)
			i++
		}
	})
}

// References for the above: what reading the clock costs on this machine.
// Deposit and Withdraw on the default clock each read the monotonic clock
// once (time.Since); time.Now reads it and the wall clock.
func BenchmarkClockTimeNow(b *testing.B) {
	for b.Loop() {
		_ = time.Now()
	}
}

func BenchmarkClockTimeSince(b *testing.B) {
	t0 := time.Now()
	for b.Loop() {
		_ = time.Since(t0)
	}
}

func BenchmarkRegistryFor(b *testing.B) {
	r := budget.NewRegistry(budget.Config{})
	target := "payments.internal:443"
	for _, t := range []string{"a:443", "b:443", target, "c:443"} {
		r.For(t)
	}
	b.ReportAllocs()
	for b.Loop() {
		if r.For(target) == nil {
			b.Fatal("nil")
		}
	}
}

func BenchmarkRegistryForParallel(b *testing.B) {
	r := budget.NewRegistry(budget.Config{})
	target := "payments.internal:443"
	r.For(target)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if r.For(target) == nil {
				b.Fatal("nil")
			}
		}
	})
}

func BenchmarkStats(b *testing.B) {
	bg := budget.New(budget.Config{})
	b.ReportAllocs()
	for b.Loop() {
		bg.Stats()
	}
}
