package priority_test

import (
	"context"
	"testing"

	"github.com/stormguard/stormguard/priority"
)

func TestOrder(t *testing.T) {
	if !(priority.Sheddable < priority.Default && priority.Default < priority.Critical) {
		t.Fatalf("want Sheddable < Default < Critical, got %d %d %d", priority.Sheddable, priority.Default, priority.Critical)
	}
	var zero priority.Priority
	if zero != priority.Default {
		t.Fatalf("zero value = %v, want default", zero)
	}
}

func TestStringAndParseRoundTrip(t *testing.T) {
	for _, p := range []priority.Priority{priority.Sheddable, priority.Default, priority.Critical} {
		got, ok := priority.Parse(p.String())
		if !ok || got != p {
			t.Errorf("Parse(%q) = %v, %v; want %v, true", p.String(), got, ok, p)
		}
	}
	if s := priority.Priority(7).String(); s != "priority(7)" {
		t.Errorf("Priority(7).String() = %q", s)
	}
}

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want priority.Priority
		ok   bool
	}{
		{"critical", priority.Critical, true},
		{"CRITICAL", priority.Critical, true},
		{"Sheddable", priority.Sheddable, true},
		{"default", priority.Default, true},
		{"", priority.Default, false},
		{"critical ", priority.Default, false},
		{" critical", priority.Default, false},
		{"crit", priority.Default, false},
		{"1", priority.Default, false},
		{"critical-plus", priority.Default, false},
		{"sheddablex", priority.Default, false},
		{"\xffcritical", priority.Default, false},
	} {
		got, ok := priority.Parse(tc.in)
		if got != tc.want || ok != tc.ok {
			t.Errorf("Parse(%q) = %v, %v; want %v, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func TestParseDoesNotAllocate(t *testing.T) {
	if n := testing.AllocsPerRun(100, func() { _, _ = priority.Parse("Critical") }); n != 0 {
		t.Fatalf("Parse allocates %v times", n)
	}
}

func TestContext(t *testing.T) {
	ctx := context.Background()
	if p, ok := priority.FromContext(ctx); ok || p != priority.Default {
		t.Fatalf("FromContext(Background) = %v, %v; want default, false", p, ok)
	}
	crit := priority.NewContext(ctx, priority.Critical)
	if p, ok := priority.FromContext(crit); !ok || p != priority.Critical {
		t.Fatalf("FromContext = %v, %v; want critical, true", p, ok)
	}
	// A hop sets its own: the innermost wins.
	def := priority.NewContext(crit, priority.Default)
	if p, ok := priority.FromContext(def); !ok || p != priority.Default {
		t.Fatalf("FromContext after setting default = %v, %v; want default, true", p, ok)
	}
	// Values out of range are clamped.
	if p, _ := priority.FromContext(priority.NewContext(ctx, 100)); p != priority.Critical {
		t.Errorf("NewContext(100) carries %v, want critical", p)
	}
	if p, _ := priority.FromContext(priority.NewContext(ctx, -100)); p != priority.Sheddable {
		t.Errorf("NewContext(-100) carries %v, want sheddable", p)
	}
	if n := testing.AllocsPerRun(100, func() { _, _ = priority.FromContext(def) }); n != 0 {
		t.Fatalf("FromContext allocates %v times", n)
	}
}

// FuzzParse: any header value gives a priority in range, Default unless
// Parse accepts it, and an accepted one is a name of its String.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"critical", "sheddable", "default", "", "CrItIcAl", "x", "sheddable\x00", "\u212a"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, ok := priority.Parse(s)
		if p < priority.Sheddable || p > priority.Critical {
			t.Fatalf("Parse(%q) = %d, out of range", s, p)
		}
		if !ok && p != priority.Default {
			t.Fatalf("Parse(%q) = %v, false; want default", s, p)
		}
		if ok && len(s) != len(p.String()) {
			t.Fatalf("Parse(%q) = %v: not its name", s, p)
		}
	})
}
