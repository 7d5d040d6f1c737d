package interceptor

import (
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/internal/window"
	"github.com/stormguard/stormguard/semconv"
)

// yield is what a Client knows of one target's load: whether its answers
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
// The zero yield is ready to use; a yield is safe for concurrent use.
type yield struct {
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

// Kinds counted in yield.calls.
const (
	yieldWatched = iota // calls whose first attempt a hedge or per-attempt timer watched
	yieldLate           // ... whose timer fired: the attempt ran past the delay
)

func newYield() *yield { return &yield{calls: window.New(yieldSlots, 2, yieldSlot)} }

// overloaded records, from a failed attempt's status and trailer at now,
// whether the target said it is overloaded: a pushback (any
// grpc-retry-pushback-ms, or a google.rpc.RetryInfo), or
// RESOURCE_EXHAUSTED. A stormguard server's shed, refusal on arrival and
// retry-budget refusal all carry a pushback.
func (y *yield) overloaded(now time.Time, err error, tr metadata.MD) {
	if y == nil {
		return
	}
	if len(tr[semconv.PushbackKey]) > 0 || status.Code(err) == codes.ResourceExhausted || hasRetryInfo(err) {
		y.signal.Store(now.UnixNano())
	}
}

// hasRetryInfo reports whether err's status carries a google.rpc.RetryInfo
// (without decoding it).
func hasRetryInfo(err error) bool {
	st, ok := status.FromError(err)
	if !ok {
		return false
	}
	for _, d := range st.Proto().GetDetails() {
		if d.GetTypeUrl() == retryInfoTypeURL {
			return true
		}
	}
	return false
}

// watched counts, at now, a call whose first attempt a timer watches.
func (y *yield) watched(now time.Time) {
	if y != nil {
		y.calls.Add(now.UnixNano(), yieldWatched, 1)
	}
}

// late counts, at now, a watched call whose first attempt ran past the
// delay.
func (y *yield) late(now time.Time) {
	if y != nil {
		y.calls.Add(now.UnixNano(), yieldLate, 1)
	}
}

// yields reports whether hedges and per-attempt-timeout retries to the
// target yield at now: an overload signal came within yieldHold, or more
// than half of at least yieldMinCalls recent watched calls ran late.
func (y *yield) yields(now time.Time) bool {
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
