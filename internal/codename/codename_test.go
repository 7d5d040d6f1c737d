package codename

import (
	"testing"

	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRoundTrip(t *testing.T) {
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		got, ok := Parse(Name(c))
		if !ok || got != c {
			t.Fatalf("Parse(Name(%d)) = %v, %v", c, got, ok)
		}
	}
	if Name(codes.Unavailable) != "UNAVAILABLE" || Name(codes.Canceled) != "CANCELLED" {
		t.Fatal("wrong canonical names")
	}
	if Name(99) != "CODE(99)" {
		t.Fatalf("Name(99) = %q", Name(99))
	}
	if _, ok := Parse("Unavailable"); ok {
		t.Fatal("Parse is exact")
	}
}
