package budget_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stormguard/stormguard/budget"
)

func TestRegistrySameBudgetPerTarget(t *testing.T) {
	clk := new(fakeClock)
	r := budget.NewRegistry(budget.Config{MinPerSecond: -1, Now: clk.Now})
	a, b := r.For("a:443"), r.For("b:443")
	if a == nil || b == nil || a == b {
		t.Fatalf("For: a=%p b=%p, want two distinct Budgets", a, b)
	}
	if r.For("a:443") != a || r.For("b:443") != b {
		t.Fatal("For returned a different Budget for the same target")
	}
	// Per target: a's deposits do not fund b's retries.
	deposit(a, 50)
	if got := withdraw(b, 10); got != 0 {
		t.Fatalf("b granted %d retries funded by a", got)
	}
	if got := withdraw(a, 10); got != 5 {
		t.Fatalf("a granted %d, want 5 (the Registry's Config: floor off)", got)
	}
	if r.Len() != 2 {
		t.Fatalf("Len = %d, want 2", r.Len())
	}
}

func TestRegistryConcurrentFor(t *testing.T) {
	r := budget.NewRegistry(budget.Config{})
	const goroutines, targets = 16, 20
	got := make([][]*budget.Budget, goroutines)
	var wg sync.WaitGroup
	for g := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range targets {
				b := r.For(fmt.Sprint("t", i))
				b.Deposit()
				b.Withdraw()
				got[g] = append(got[g], b)
			}
		}()
	}
	wg.Wait()
	for g := range got {
		for i := range targets {
			if got[g][i] != got[0][i] {
				t.Fatalf("goroutine %d got a different Budget for t%d", g, i)
			}
		}
	}
	for i := range targets {
		if s := r.For(fmt.Sprint("t", i)).Stats(); s.Requests != goroutines {
			t.Fatalf("t%d: %d requests, want %d", i, s.Requests, goroutines)
		}
	}
}

func TestRegistryForHitDoesNotAllocate(t *testing.T) {
	r := budget.NewRegistry(budget.Config{})
	target := "payments.internal:443"
	r.For(target)
	if n := testing.AllocsPerRun(1000, func() { r.For(target) }); n != 0 {
		t.Fatalf("For on an existing target: %v allocations, want 0", n)
	}
}

func TestRegistryRange(t *testing.T) {
	r := budget.NewRegistry(budget.Config{})
	want := map[string]*budget.Budget{}
	for _, tg := range []string{"a", "b", "c"} {
		want[tg] = r.For(tg)
	}
	seen := map[string]*budget.Budget{}
	r.Range(func(target string, b *budget.Budget) bool {
		seen[target] = b
		return true
	})
	if len(seen) != 3 || seen["a"] != want["a"] || seen["b"] != want["b"] || seen["c"] != want["c"] {
		t.Fatalf("Range saw %v, want %v", seen, want)
	}
	n := 0
	r.Range(func(string, *budget.Budget) bool { n++; return false })
	if n != 1 {
		t.Fatalf("Range called f %d times after it returned false", n)
	}
}

func TestRegistryZeroAndNil(t *testing.T) {
	var z budget.Registry
	b := z.For("x")
	deposit(b, 50)
	if got := withdraw(b, 100); got != 10 || z.For("x") != b {
		t.Fatalf("zero Registry: %d granted, want the defaults' max(5, 10) = 10", got)
	}

	var n *budget.Registry
	if n.For("x") != nil || n.Len() != 0 {
		t.Fatal("nil Registry returned a Budget")
	}
	n.Range(func(string, *budget.Budget) bool { t.Fatal("nil Registry called f"); return false })
	if !n.For("x").Withdraw() {
		t.Fatal("the nil Budget of a nil Registry refused")
	}
}

func TestRegistryUsesTheClock(t *testing.T) {
	clk := new(fakeClock)
	r := budget.NewRegistry(budget.Config{Ratio: -1, MinPerSecond: 1, Now: clk.Now})
	b := r.For("x")
	if !b.Withdraw() || b.Withdraw() {
		t.Fatal("floor burst is 1")
	}
	clk.Advance(time.Second)
	if !b.Withdraw() {
		t.Fatal("the floor did not refill on the Registry's clock")
	}
}
