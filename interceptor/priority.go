package interceptor

import (
	"context"

	"google.golang.org/grpc/metadata"

	"github.com/stormguard/stormguard/priority"
	"github.com/stormguard/stormguard/semconv"
)

// callPriority is a call's priority (package priority): the one its
// context carries, set by its caller or, in a handler served by the
// suite's Server, honoured by that Server for the incoming call.
type callPriority struct {
	p   priority.Priority
	set bool // the context carries one (the call span records it)
}

// from reads the call's priority from ctx and returns the context its
// attempts are sent with: a call with a priority of its own drops a
// stormguard-priority value already in the outgoing metadata (a proxy's
// copy of its incoming metadata), since its attempts send their own. A
// call without one leaves the metadata as it is, and costs one context
// lookup.
func (cp *callPriority) from(ctx context.Context) context.Context {
	cp.p, cp.set = priority.FromContext(ctx)
	if cp.set && metadata.ValueFromOutgoingContext(ctx, semconv.PriorityKey) != nil {
		ctx = removeOutgoing(ctx, semconv.PriorityKey)
	}
	return ctx
}

// sent reports whether the call's attempts carry the priority header:
// a priority other than Default (no header means Default).
func (cp *callPriority) sent() bool { return cp.p != priority.Default }
