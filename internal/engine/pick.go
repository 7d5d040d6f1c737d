package engine

import (
	"net"
	"slices"
	"time"
)

// How many times an attempt picks again when the transport picked an
// endpoint it avoids, before it is sent there all the same.
const (
	maxRepicks = 3
	// maxFreeRepicks: a fail-over retry, before it is taken for having
	// nowhere else to go (round_robin over two endpoints would have
	// offered the other one by then).
	maxFreeRepicks = 9
)

// Pick judges the picks of one attempt: every attempt avoids the target's
// outlier endpoints (those that fail while the others serve) by picking
// again, at most maxRepicks times, when the transport picked one of them;
// a first attempt an open breaker let through to its pick (guard) is
// refused if it still picks an endpoint that served nothing; a fail-over
// retry (free) whose picks all go to endpoints it avoids is paid then by
// the budget, or not sent.
//
// The adapter sets it up with Call.Pick on the call's goroutine before the
// attempt is sent, and asks Judge of each pick the transport makes, which
// may be on another goroutine: it must guard a Pick that way. A Pick reads
// nothing of the call. The zero Pick judges nothing: it sends every pick.
type Pick struct {
	r      *Route
	avoid  []net.Addr
	repick int  // picks left before an avoided endpoint is sent to
	guard  bool // refuse, rather than send, a pick still avoided after the re-picks
	free   bool // a fail-over retry: the budget pays if its pick is still avoided after the re-picks
	paid   bool // ...and it did
}

// PickVerdict is what Judge says of a pick.
type PickVerdict uint8

// What a pick may be.
const (
	PickSend    PickVerdict = iota // send the attempt there
	PickAgain                      // the endpoint is avoided: pick again
	PickPay                        // a fail-over with nowhere else to go: the budget pays now (Pay), or it is not sent
	PickRefused                    // refused for good: a guarded pick of an endpoint that served nothing
	PickUnpaid                     // a fail-over with nowhere else to go, which the budget would not pay for
)

// Pick returns the Pick of attempt a, just opened.
func (c *Call) Pick(a *Attempt) Pick {
	p := Pick{r: c.r, avoid: c.avoid, guard: a.guarded != nil, free: a.free}
	switch {
	case len(c.avoid) > 0 && a.free:
		p.repick = maxFreeRepicks
	case len(c.avoid) > 0:
		p.repick = maxRepicks
	}
	return p
}

// Judge judges a pick of the endpoint addr.
func (p *Pick) Judge(addr net.Addr) PickVerdict {
	if p.r == nil || !slices.Contains(p.avoid, addr) {
		return PickSend
	}
	switch {
	case p.repick > 0:
		p.repick--
		return PickAgain
	case p.guard:
		return PickRefused
	case p.free && !p.paid:
		return PickPay
	}
	return PickSend
}

// Pay pays at now for a pick Judge said to (PickPay): PickSend when the
// budget paid, PickUnpaid when it would not.
func (p *Pick) Pay(now time.Time) PickVerdict {
	if p.paid = p.r.payAtPick(now); p.paid {
		return PickSend
	}
	return PickUnpaid
}

// Stands reports whether a pick's refusal v stands: in shadow mode it
// does not (the attempt is sent there, and the refusal said by
// Call.Picked).
func (p *Pick) Stands(v PickVerdict) bool {
	switch v {
	case PickRefused:
		return p.r.stands(ReasonBreaker)
	case PickUnpaid:
		return p.r.stands(ReasonBudget)
	}
	return true
}

// Paid reports whether an enforcing budget paid for the attempt at its
// pick (a fail-over with nowhere else to go): it may say so to the
// server.
func (p *Pick) Paid() bool { return p.paid && p.r.budgetPays() }
