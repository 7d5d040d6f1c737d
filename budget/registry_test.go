package budget_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stormguard/stormguard/budget"
)

func TestRegistrySameBudgetPerTarget(t *testing.T) {
	r := budget.NewRegistry(budget.Config{Burst: -1})
	a, b := &clocked{Budget: r.For("a:443")}, &clocked{Budget: r.For("b:443")}
	if a.Budget == nil || b.Budget == nil || a.Budget == b.Budget {
		t.Fatalf("For: a=%p b=%p, want two distinct Budgets", a.Budget, b.Budget)
	}
	if r.For("a:443") != a.Budget || r.For("b:443") != b.Budget {
		t.Fatal("For returned a different Budget for the same target")
	}
	// Per target: a's deposits do not fund b's retries.
	a.deposit(50)
	if got := b.withdraw(10); got != 0 {
		t.Fatalf("b granted %d retries funded by a", got)
	}
	if got := a.withdraw(10); got != 7 {
		t.Fatalf("a granted %d, want 7 (credit 2, loan 5: the Registry's Config, no minimum loan)", got)
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
	b := &clocked{Budget: z.For("x")}
	b.deposit(50)
	if got := b.withdraw(100); got != 7 || z.For("x") != b.Budget {
		t.Fatalf("zero Registry: %d granted, want the defaults' credit 2 + loan 5 = 7", got)
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
