package priority

import (
	"context"
	"strconv"
	"strings"
)

// Priority is how much a call matters to its caller. Priorities are
// ordered: Sheddable < Default < Critical, and compare with < and >. The
// zero value is Default.
type Priority int8

const (
	// Sheddable is work that may be dropped: an overloaded server sheds
	// it first, before retries.
	Sheddable Priority = -1
	// Default is the priority of a call that sets none.
	Default Priority = 0
	// Critical is work shed last: only when critical work alone fills a
	// server's limit, or when it cannot finish in time.
	Critical Priority = 1
)

// String returns "sheddable", "default" or "critical", the values of the
// header; any other Priority (out of range) gives "priority(N)".
func (p Priority) String() string {
	switch p {
	case Sheddable:
		return "sheddable"
	case Default:
		return "default"
	case Critical:
		return "critical"
	}
	return "priority(" + strconv.Itoa(int(p)) + ")"
}

// Parse returns the Priority that s names: "sheddable", "default" or
// "critical", in any ASCII case. Anything else, the empty string included,
// gives Default and false: a header a server cannot read is the same as no
// header. Parse never panics and never allocates, and reads no further
// than the length of a value longer than 9 bytes.
func Parse(s string) (Priority, bool) {
	if len(s) > len("sheddable") {
		return Default, false
	}
	switch {
	case strings.EqualFold(s, "sheddable"):
		return Sheddable, true
	case strings.EqualFold(s, "default"):
		return Default, true
	case strings.EqualFold(s, "critical"):
		return Critical, true
	}
	return Default, false
}

// clamp returns p within [Sheddable, Critical].
func clamp(p Priority) Priority { return min(max(p, Sheddable), Critical) }

type ctxKey struct{}

// NewContext returns a copy of ctx that carries priority p: the calls made
// with it, and the calls made from the handlers they reach on servers that
// propagate it, have priority p unless they set another. A p out of range
// is taken as the nearest of Sheddable and Critical.
func NewContext(ctx context.Context, p Priority) context.Context {
	return context.WithValue(ctx, ctxKey{}, clamp(p))
}

// FromContext returns the priority ctx carries, and false when it carries
// none (a call made with it is Default, and sends no header). It does not
// allocate.
func FromContext(ctx context.Context) (Priority, bool) {
	p, ok := ctx.Value(ctxKey{}).(Priority)
	return p, ok
}
