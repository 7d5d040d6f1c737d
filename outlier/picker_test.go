package outlier

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestAvoidContextBounds(t *testing.T) {
	ctx := context.Background()
	if AvoidContext(ctx, "") != ctx || Avoided(ctx) != nil {
		t.Error("an empty address changed the context")
	}
	a := AvoidContext(ctx, "10.0.0.1:80")
	if AvoidContext(a, "[::ffff:10.0.0.1]:80") != a {
		t.Error("an address already avoided made a new context")
	}
	for i := range 40 {
		a = AvoidContext(a, fmt.Sprintf("10.0.1.%d:80", i))
	}
	got := Avoided(a)
	if len(got) != maxAvoid || got[0] != "10.0.1.24:80" || got[maxAvoid-1] != "10.0.1.39:80" {
		t.Errorf("after 41 addresses: %v, want the last %d", got, maxAvoid)
	}
	// Avoided returns a copy.
	got[0] = "x"
	if slices.Contains(Avoided(a), "x") {
		t.Error("Avoided shares its slice")
	}
	// The parent context is unchanged.
	if p := Avoided(AvoidContext(ctx, "10.0.0.1:80")); len(p) != 1 {
		t.Errorf("a fresh chain avoids %v", p)
	}
}

func TestCodeOf(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want codes.Code
	}{
		{nil, codes.OK},
		{status.Error(codes.Unavailable, "x"), codes.Unavailable},
		{context.Canceled, codes.Canceled},
		{fmt.Errorf("wrapped: %w", context.Canceled), codes.Canceled},
		{status.Error(codes.Code(99), "x"), codes.Unknown},
		{fmt.Errorf("plain"), codes.Unknown},
	} {
		if got := codeOf(tc.err); got != tc.want {
			t.Errorf("codeOf(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
