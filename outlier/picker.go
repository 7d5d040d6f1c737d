package outlier

import (
	"context"
	"errors"
	"slices"

	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// maxRepicks bounds how often one pick asks the child again for an
// endpoint that is neither avoided nor ejected.
const maxRepicks = 8

// maxAvoid bounds the addresses one context avoids; older ones are dropped.
const maxAvoid = 16

// errDiscarded ends a pick the picker asked for and did not use.
var errDiscarded = status.Error(codes.Canceled, "outlier: pick discarded for another endpoint")

// picker wraps the child's picker: it counts each RPC's outcome for its
// endpoint, and asks the child again when it returned an endpoint that is
// ejected (until the child has heard) or that the RPC's context avoids.
type picker struct {
	child balancer.Picker
}

func (p *picker) Pick(info balancer.PickInfo) (balancer.PickResult, error) {
	res, err := p.child.Pick(info)
	if err != nil {
		return res, err
	}
	sc, ok := res.SubConn.(*subConn)
	if !ok {
		return res, nil
	}
	var av *avoidSet
	if info.Ctx != nil {
		av, _ = info.Ctx.Value(avoidKey{}).(*avoidSet)
	}
	if sc.ejected() || av.has(sc.key) {
		res, sc = p.repick(info, res, sc, av)
	}
	if done := res.Done; done != nil {
		res.Done = func(di balancer.DoneInfo) {
			sc.done(di)
			done(di)
		}
	} else {
		res.Done = sc.done
	}
	res.SubConn = sc.SubConn
	return res, nil
}

// repick asks the child again, at most maxRepicks times, for a SubConn that
// is neither ejected nor avoided. When it finds none it returns the first
// one that is not ejected, or else the first one: avoiding is a preference,
// and an ejection the child has not heard of yet is no reason to fail.
func (p *picker) repick(info balancer.PickInfo, first balancer.PickResult, firstSC *subConn, av *avoidSet) (balancer.PickResult, *subConn) {
	best, bestSC := first, firstSC
	last := firstSC
	for range maxRepicks {
		r, err := p.child.Pick(info)
		if err != nil {
			break
		}
		sc, ok := r.SubConn.(*subConn)
		if !ok || sc == last { // not ours, or the child does not rotate
			discard(r)
			break
		}
		last = sc
		if !sc.ejected() && !av.has(sc.key) {
			discard(best)
			return r, sc
		}
		if bestSC.ejected() && !sc.ejected() {
			discard(best)
			best, bestSC = r, sc
			continue
		}
		discard(r)
	}
	return best, bestSC
}

// discard ends a pick that will not be used.
func discard(r balancer.PickResult) {
	if r.Done != nil {
		r.Done(balancer.DoneInfo{Err: errDiscarded})
	}
}

// codeOf returns the status code of an RPC's error; OK for nil.
func codeOf(err error) codes.Code {
	if err == nil {
		return codes.OK
	}
	c := status.Code(err)
	switch {
	case c == codes.Unknown && errors.Is(err, context.Canceled):
		return codes.Canceled
	case c > codes.Unauthenticated:
		return codes.Unknown
	}
	return c
}

const cancelled = codes.Canceled

// avoidKey is the context key of the avoided addresses.
type avoidKey struct{}

// avoidSet is the addresses one RPC attempt should not be sent to. It is
// never changed once it is in a context.
type avoidSet struct{ addrs []string }

func (a *avoidSet) has(key string) bool {
	return a != nil && key != "" && slices.Contains(a.addrs, key)
}

// AvoidContext returns a context that asks the policy not to send the RPC
// attempt made with it to addr, a peer address as peer.Peer.Addr.String()
// spells it ("127.0.0.1:8080", "[::1]:8080"), in addition to the addresses
// ctx already avoids. A retry passes the address of the attempt that
// failed. The picker then asks the child policy for another endpoint, a
// bounded number of times; when every endpoint is avoided, the attempt goes
// to one of them anyway. At most 16 addresses are kept (the oldest are
// dropped); an empty addr, or one ctx already avoids, returns ctx. Without
// this policy on the channel the context has no effect.
func AvoidContext(ctx context.Context, addr string) context.Context {
	if addr == "" {
		return ctx
	}
	prev, _ := ctx.Value(avoidKey{}).(*avoidSet)
	key := canonicalAddr(addr)
	if prev.has(key) {
		return ctx
	}
	next := &avoidSet{}
	if prev != nil {
		next.addrs = make([]string, 0, min(len(prev.addrs)+1, maxAvoid))
		next.addrs = append(next.addrs, prev.addrs[max(0, len(prev.addrs)+1-maxAvoid):]...)
	}
	next.addrs = append(next.addrs, key)
	return context.WithValue(ctx, avoidKey{}, next)
}

// Avoided returns the addresses ctx avoids, in canonical form, oldest
// first; nil if none.
func Avoided(ctx context.Context) []string {
	a, _ := ctx.Value(avoidKey{}).(*avoidSet)
	if a == nil {
		return nil
	}
	return slices.Clone(a.addrs)
}
