package cowmap

import (
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestLoadOrCreateStoresOnce(t *testing.T) {
	var m Map[string, *int]
	var created atomic.Int32
	var wg sync.WaitGroup
	got := make([]*int, 16)
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i] = m.LoadOrCreate("k", func(string) *int { created.Add(1); return new(int) })
		}()
	}
	wg.Wait()
	if created.Load() != 1 {
		t.Fatalf("create ran %d times, want 1", created.Load())
	}
	for i := range got {
		if got[i] != got[0] {
			t.Fatalf("caller %d got a different value", i)
		}
	}
	if v, ok := m.Load("k"); !ok || v != got[0] {
		t.Fatalf("Load = %v, %v", v, ok)
	}
}

func TestMaxBoundsEntries(t *testing.T) {
	m := Map[string, int]{Max: 3}
	for i := range 10 {
		if v := m.LoadOrCreate(strconv.Itoa(i), func(string) int { return i }); v != i {
			t.Fatalf("LoadOrCreate(%d) = %d", i, v)
		}
	}
	if m.Len() != 3 {
		t.Fatalf("Len = %d, want 3", m.Len())
	}
	if _, ok := m.Load("9"); ok {
		t.Fatal("entry beyond Max was stored")
	}
	if v := m.LoadOrCreate("0", func(string) int { return -1 }); v != 0 {
		t.Fatalf("a full map created %d for a stored key", v)
	}
	n := 0
	m.Range(func(string, int) bool { n++; return true })
	if n != 3 {
		t.Fatalf("Range saw %d entries, want 3", n)
	}
}

func TestZeroValue(t *testing.T) {
	var m Map[int, int]
	if _, ok := m.Load(1); ok || m.Len() != 0 {
		t.Fatal("zero Map not empty")
	}
	m.Range(func(int, int) bool { t.Fatal("Range on empty map called f"); return false })
}

func BenchmarkLoad(b *testing.B) {
	var m Map[string, int]
	key := "/echo.v1.EchoService/Get"
	m.LoadOrCreate(key, func(string) int { return 1 })
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := m.Load(key); !ok {
			b.Fatal("missing")
		}
	}
}

// Adding n keys copies O(n) entries in all: the old map copied every entry
// on every insert (10,000 keys: 50 million copies).
func TestInsertsAreAmortized(t *testing.T) {
	var m Map[int, int]
	const n = 10_000
	for i := range n {
		m.LoadOrCreate(i, func(int) int { return i })
	}
	for i := range n {
		if v, ok := m.Load(i); !ok || v != i {
			t.Fatalf("Load(%d) = %d, %v", i, v, ok)
		}
	}
	if m.Len() != n {
		t.Fatalf("Len = %d", m.Len())
	}
	seen := 0
	m.Range(func(int, int) bool { seen++; return true })
	if seen != n {
		t.Fatalf("Range saw %d", seen)
	}
}

func BenchmarkInsert10k(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		var m Map[int, int]
		for i := range 10_000 {
			m.LoadOrCreate(i, func(int) int { return i })
		}
	}
}

func TestLoadOrCreateIfRoom(t *testing.T) {
	m := Map[string, int]{Max: 2}
	created := 0
	create := func(k string) int { created++; return len(k) }
	for _, k := range []string{"a", "bb", "a"} {
		if v, ok := m.LoadOrCreateIfRoom(k, create); !ok || v != len(k) {
			t.Fatalf("LoadOrCreateIfRoom(%q) = %d, %v", k, v, ok)
		}
	}
	if v, ok := m.LoadOrCreateIfRoom("ccc", create); ok || v != 0 {
		t.Fatalf("full map: LoadOrCreateIfRoom(ccc) = %d, %v; want 0, false", v, ok)
	}
	if v, ok := m.LoadOrCreateIfRoom("bb", create); !ok || v != 2 {
		t.Fatalf("full map, stored key: LoadOrCreateIfRoom(bb) = %d, %v", v, ok)
	}
	if created != 2 || m.Len() != 2 {
		t.Fatalf("created %d values, kept %d; want 2, 2", created, m.Len())
	}
}
