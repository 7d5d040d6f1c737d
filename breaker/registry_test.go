package breaker

import (
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestRegistryForIsPerTarget(t *testing.T) {
	clk := newClock()
	var mu sync.Mutex
	var changes []string
	r := NewRegistry(Config{
		MinAttempts: 2, OpenTimeout: 5 * time.Second, Jitter: -1,
		OnStateChange: func(target string, from, to State) {
			mu.Lock()
			changes = append(changes, target+":"+from.String()+">"+to.String())
			mu.Unlock()
		},
	})
	a, b := r.For("a:443"), r.For("b:443")
	if a == b || r.For("a:443") != a {
		t.Fatal("For does not return one Breaker per target")
	}
	if a.Target() != "a:443" || b.Target() != "b:443" {
		t.Fatalf("targets %q, %q", a.Target(), b.Target())
	}
	for range 2 {
		tk, _ := a.AdmitAt(clk.Now())
		tk.DoneAt(true, clk.Now())
	}
	if a.StateAt(clk.Now()) != StateOpen || b.StateAt(clk.Now()) != StateClosed {
		t.Fatalf("a %v, b %v: breakers share state", a.StateAt(clk.Now()), b.StateAt(clk.Now()))
	}
	if got := strings.Join(changes, " "); got != "a:443:closed>open" {
		t.Fatalf("changes %q", got)
	}
	if a.RetryAfterAt(clk.Now()) != 5*time.Second {
		t.Fatalf("RetryAfter = %v; registry config not applied", a.RetryAfterAt(clk.Now()))
	}
}

func TestRegistryRangeAndLen(t *testing.T) {
	var r Registry // the zero value is usable
	for _, target := range []string{"x", "y", "z"} {
		r.For(target)
	}
	if r.Len() != 3 {
		t.Fatalf("Len = %d", r.Len())
	}
	var seen []string
	r.Range(func(target string, b *Breaker) bool {
		if b != r.For(target) || b.Target() != target {
			t.Errorf("Range gave %q a foreign breaker", target)
		}
		seen = append(seen, target)
		return true
	})
	sort.Strings(seen)
	if strings.Join(seen, ",") != "x,y,z" {
		t.Fatalf("Range saw %v", seen)
	}
	n := 0
	r.Range(func(string, *Breaker) bool { n++; return false })
	if n != 1 {
		t.Fatalf("Range went on after false: %d calls", n)
	}
}

func TestRegistryConcurrentFor(t *testing.T) {
	r := NewRegistry(Config{})
	got := make([]*Breaker, 16)
	var wg sync.WaitGroup
	for i := range got {
		wg.Go(func() { got[i] = r.For("same") })
	}
	wg.Wait()
	for i := range got {
		if got[i] != got[0] {
			t.Fatalf("goroutine %d got a different Breaker", i)
		}
	}
}

func TestRegistryForDoesNotAllocate(t *testing.T) {
	r := NewRegistry(Config{})
	r.For("t")
	if n := testing.AllocsPerRun(100, func() { r.For("t") }); n != 0 {
		t.Fatalf("For on an existing target: %v allocs", n)
	}
}
