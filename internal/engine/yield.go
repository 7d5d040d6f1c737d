package engine

import (
	"sync/atomic"
	"time"

	"github.com/stormguard/stormguard/internal/window"
)

// Yield is what a client knows of one target's load: whether its answers
// lately said it is overloaded, and how many of the calls whose attempts
// a hedge or a per-attempt timeout watches ran past that delay. Hedges,
// and the retries a per-attempt timeout sends beside a slow attempt,
// yield to an overloaded target (ReasonOverload): they are extra work a
// server that sheds, pushes back or refuses on budget asked not to get,
// and when most calls run past the delay the slowness is the target's,
// not the attempt's, so that another attempt would only queue behind the
// first. They come back as the signals clear: yieldHold after the last
// overload signal, once fewer than half of the recent calls run late.
//
// Make one with NewYield; a nil *Yield yields to nothing. A Yield is safe
// for concurrent use.
type Yield struct {
	signal atomic.Int64 // UnixNano of the last overload signal; 0: none
	calls  *window.Counter
}

// The yield's rules.
const (
	// yieldHold is how long an overload signal makes hedges yield.
	yieldHold = time.Second
	// yieldSlots × yieldSlot is the window of recent calls.
	yieldSlots = 4
	yieldSlot  = 250 * time.Millisecond
	// yieldMinCalls is the least number of recent calls whose share that
	// ran late is judged: few, so that a quiet client (a fleet's, a few
	// calls a second) yields as a busy one does.
	yieldMinCalls = 4
)

// Kinds counted in Yield.calls.
const (
	yieldWatched = iota // calls whose first attempt a hedge or per-attempt timer watched
	yieldLate           // ... whose timer fired: the attempt ran past the delay
)

// NewYield returns the Yield of a target that has said nothing yet.
func NewYield() *Yield { return &Yield{calls: window.New(yieldSlots, 2, yieldSlot)} }

// overloaded records, from a failed attempt's outcome, whether the target
// said it is overloaded: a pushback (any), a RetryInfo (any), or
// RESOURCE_EXHAUSTED. A stormguard server's shed, refusal on arrival and
// retry-budget refusal all carry a pushback.
func (y *Yield) overloaded(o *Outcome) {
	if y == nil {
		return
	}
	if o.Pushback.Sent || o.RetryInfo.Sent || o.Code == ResourceExhausted {
		y.signal.Store(o.At.UnixNano())
	}
}

// watched counts, at now, a call whose first attempt a timer watches.
func (y *Yield) watched(now time.Time) {
	if y != nil {
		y.calls.Add(now.UnixNano(), yieldWatched, 1)
	}
}

// late counts, at now, a watched call whose first attempt ran past the
// delay.
func (y *Yield) late(now time.Time) {
	if y != nil {
		y.calls.Add(now.UnixNano(), yieldLate, 1)
	}
}

// yields reports whether hedges and per-attempt-timeout retries to the
// target yield at now: an overload signal came within yieldHold, or more
// than half of at least yieldMinCalls recent watched calls ran late.
func (y *Yield) yields(now time.Time) bool {
	if y == nil {
		return false
	}
	t := now.UnixNano()
	if s := y.signal.Load(); s != 0 && t-s < int64(yieldHold) {
		return true
	}
	watched, late := y.calls.Counts(t)
	return watched >= yieldMinCalls && 2*late > watched
}
