package breaker

import (
	"fmt"
	"math"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/stormguard/stormguard/internal/satmath"
)

// snap is the breaker's internal state, read under its lock without
// advancing anything.
type snap struct {
	gen       uint64
	state     State
	head      int64
	attempts  int64
	failures  int64
	consec    int64
	inflight  int
	probeOK   int
	rounds    int
	openUntil time.Duration
}

func snapshot(b *Breaker) snap {
	b.mu.Lock()
	defer b.mu.Unlock()
	w := b.word.Load()
	var a, f, head int64
	if win := b.win.Load(); win != nil {
		a, f = win.Counts(math.MinInt64) // the window ending at its newest bucket
		head, _ = win.Latest()
	} else if ok := b.lastOK.Load(); ok != 0 {
		a, head = 1, ok-1 // no failure yet: the latest success is all it keeps
	}
	return snap{w >> 2, State(w & stateMask), head, a, f, b.consec.Load(), b.inflight, b.probeOK, b.rounds, b.openUntilD()}
}

type propTicket struct {
	t        *Ticket
	gen      uint64
	reported bool
}

type logged struct {
	bucket int64
	failed bool
}

// TestPropertyStateMachine runs random sequences of admissions, outcome
// reports (in any order, repeated, stale), clock steps and state reads
// against a breaker with a random configuration, and checks after every
// step that:
//   - while half-open, never more than HalfOpenProbes admitted probes of the
//     current generation are unreported, and a refusal means all are taken;
//   - closed → open happens exactly when an accepted failure completes the
//     configured evidence (ratio over the window with MinAttempts, or
//     ConsecutiveFailures in a row), and never otherwise;
//   - open → half-open happens exactly when the (grown, capped, jittered)
//     open period has passed, and the period is the configured one;
//   - half-open closes as soon as HalfOpenProbes probes have succeeded, and
//     reopens on a failed probe or one silent for a whole Window;
//   - stale or repeated reports change nothing;
//   - and, at the end, the breaker always closes again once probes succeed.
func TestPropertyStateMachine(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		ms := time.Millisecond
		cfg := Config{
			FailureRatio:        float64(rapid.IntRange(1, 10).Draw(rt, "ratio10")) / 10,
			MinAttempts:         rapid.IntRange(1, 8).Draw(rt, "minAttempts"),
			Window:              time.Duration(rapid.IntRange(1, 20).Draw(rt, "window100ms")) * 100 * ms,
			ConsecutiveFailures: rapid.IntRange(0, 4).Draw(rt, "consecutive"),
			OpenTimeout:         time.Duration(rapid.IntRange(1, 50).Draw(rt, "open10ms")) * 10 * ms,
			HalfOpenProbes:      rapid.IntRange(1, 3).Draw(rt, "probes"),
			MaxOpenTimeout:      time.Duration(rapid.IntRange(0, 200).Draw(rt, "maxOpen10ms")) * 10 * ms,
			Jitter:              float64(rapid.IntRange(-1, 10).Draw(rt, "jitter10")) / 10,
		}
		u := float64(rapid.IntRange(0, 99).Draw(rt, "rand100")) / 100
		cfg.rand = func() float64 { return u }
		s := cfg.settings()

		clk := newClock()
		var changes []transition
		cfg.OnStateChange = func(_ string, from, to State) { changes = append(changes, transition{from, to}) }
		b := New(cfg)
		start := clk.Now()

		var (
			tickets   []*propTicket
			closedLog []logged      // accepted outcomes of the current closed generation
			rounds    int           // model of consecutive failed probe rounds
			openUntil time.Duration // model of the end of the open period
			lastProbe time.Duration // model: newest probe admission
			probeOK   int           // model: successful probes this round
		)
		now := func() time.Duration { return clk.Now().Sub(start) }
		// The buckets start at the first time the breaker was given
		// (the model reads it once, and checks that it never moves).
		var first int64
		var based bool
		bucket := func() int64 {
			f, ok := b.origin.First()
			if !ok {
				rt.Fatal("an outcome was counted before the breaker saw a time")
			}
			if !based {
				first, based = f, true
			} else if f != first {
				rt.Fatalf("the breaker's time line moved from %d to %d", first, f)
			}
			return int64((clk.Now().Sub(procEpoch) - time.Duration(first)) / s.width)
		}
		outstanding := func(gen uint64) int {
			n := 0
			for _, tk := range tickets {
				if !tk.reported && tk.gen == gen {
					n++
				}
			}
			return n
		}
		evidence := func() bool {
			if s.consecutive > 0 {
				run := int64(0)
				for i := len(closedLog) - 1; i >= 0 && closedLog[i].failed; i-- {
					run++
				}
				if run >= s.consecutive {
					return true
				}
			}
			var a, f int64
			for _, e := range closedLog {
				if e.bucket > bucket()-windowBuckets {
					a++
					if e.failed {
						f++
					}
				}
			}
			return a >= s.minAttempts && float64(f)/float64(a) >= s.ratio
		}
		// expectOpened checks a transition to open just now and updates
		// the model of the open period.
		expectOpened := func(probeFailed bool) {
			if probeFailed {
				rounds++
			} else {
				rounds = 0
			}
			d := s.openTimeout
			for range rounds {
				d = min(2*d, s.maxOpen)
			}
			d += time.Duration(float64(d) * s.jitter * u)
			if got := b.RetryAfterAt(clk.Now()); got != d {
				rt.Fatalf("open period %v, want %v (rounds %d)", got, d, rounds)
			}
			openUntil = now() + d
		}
		// after checks the transitions one action caused.
		after := func(before snap, allowed ...transition) []transition {
			got := changes
			changes = nil
			if len(got) > 1 {
				rt.Fatalf("one action made %d transitions: %v", len(got), got)
			}
			for _, tr := range got {
				if tr.from != before.state {
					rt.Fatalf("transition %v>%v from state %v", tr.from, tr.to, before.state)
				}
				ok := false
				for _, a := range allowed {
					ok = ok || a == tr
				}
				if !ok {
					rt.Fatalf("unexpected transition %v>%v, allowed %v", tr.from, tr.to, allowed)
				}
			}
			a := snapshot(b)
			if (len(got) == 0) != (a.gen == before.gen) {
				rt.Fatalf("generation %d → %d with transitions %v", before.gen, a.gen, got)
			}
			if a.state == StateHalfOpen && outstanding(a.gen) > s.probes {
				rt.Fatalf("%d probes in flight, HalfOpenProbes %d", outstanding(a.gen), s.probes)
			}
			if a.state == StateHalfOpen && a.inflight != outstanding(a.gen) {
				rt.Fatalf("breaker counts %d probes in flight, there are %d", a.inflight, outstanding(a.gen))
			}
			return got
		}
		// timeDue checks the transitions that are due by the clock alone.
		timeDue := func(before snap, outBefore int, got []transition) {
			switch before.state {
			case StateOpen:
				due := now() >= openUntil
				if due != (len(got) == 1) {
					rt.Fatalf("open → half-open at %v (transitions %v), open until %v", now(), got, openUntil)
				}
				if due {
					probeOK = 0
				}
			case StateHalfOpen:
				lost := outBefore > 0 && now()-lastProbe >= s.window
				if lost != (len(got) == 1) {
					rt.Fatalf("lost probe: due %v, transitions %v", lost, got)
				}
				if lost {
					expectOpened(true)
				}
			}
		}

		// admit asks for one attempt; nil if refused.
		admit := func() *propTicket {
			before := snapshot(b)
			outBefore := outstanding(before.gen)
			tk := new(Ticket)
			var err error
			*tk, err = b.AdmitAt(clk.Now())
			var pt *propTicket
			if err == nil {
				pt = &propTicket{t: tk, gen: tk.gen}
				tickets = append(tickets, pt)
			}
			got := after(before, transition{StateOpen, StateHalfOpen}, transition{StateHalfOpen, StateOpen})
			timeDue(before, outBefore, got)
			a := snapshot(b)
			if err != nil {
				if a.state == StateClosed || (a.state == StateHalfOpen && outstanding(a.gen) < s.probes) {
					rt.Fatalf("refused while %v with %d/%d probes", a.state, outstanding(a.gen), s.probes)
				}
				return nil
			}
			if a.state == StateOpen || tk.gen != a.gen {
				rt.Fatalf("admitted while %v (ticket gen %d, gen %d)", a.state, tk.gen, a.gen)
			}
			if a.state == StateHalfOpen {
				lastProbe = now()
				if n := outstanding(a.gen); n > s.probes {
					rt.Fatalf("admitted probe %d of %d", n, s.probes)
				}
			}
			return pt
		}

		// report reports o on tk, and checks what it did.
		report := func(tk *propTicket, o outcome) {
			before := snapshot(b)
			accepted := !tk.reported && tk.gen == before.gen
			switch o {
			case success:
				tk.t.DoneAt(false, clk.Now())
			case failure:
				tk.t.DoneAt(true, clk.Now())
			case ignore:
				tk.t.Ignore()
			}
			tk.reported = true
			if !accepted {
				after(before)
				if a := snapshot(b); a != before {
					rt.Fatalf("stale or repeated report changed the breaker:\n%+v\n%+v", before, a)
				}
				return
			}
			switch before.state {
			case StateClosed:
				if o != ignore {
					closedLog = append(closedLog, logged{bucket(), o == failure})
				}
				if o == failure && evidence() {
					if got := after(before, transition{StateClosed, StateOpen}); len(got) != 1 {
						rt.Fatalf("evidence complete but still closed: log %v", closedLog)
					}
					expectOpened(false)
					closedLog = nil
				} else {
					after(before)
				}
			case StateHalfOpen:
				switch o {
				case failure:
					if got := after(before, transition{StateHalfOpen, StateOpen}); len(got) != 1 {
						rt.Fatal("failed probe did not reopen")
					}
					expectOpened(true)
				case success:
					probeOK++
					if probeOK >= s.probes {
						if got := after(before, transition{StateHalfOpen, StateClosed}); len(got) != 1 {
							rt.Fatalf("%d successful probes did not close", probeOK)
						}
						rounds, closedLog = 0, nil
					} else {
						after(before)
					}
				case ignore:
					after(before)
				}
			default:
				rt.Fatalf("accepted a report while %v", before.state)
			}
		}

		// Sequences of up to 400 steps: long enough for the window to
		// slide and for several open/half-open/closed cycles.
		steps := rapid.IntRange(1, 400).Draw(rt, "steps")
		for range steps {
			switch rapid.SampledFrom([]string{"admit", "report", "attempt", "attempt", "tick", "state"}).Draw(rt, "action") {
			case "admit":
				admit()
			case "report":
				if len(tickets) > 0 {
					tk := tickets[rapid.IntRange(0, len(tickets)-1).Draw(rt, "ticket")]
					report(tk, rapid.SampledFrom([]outcome{success, failure, ignore}).Draw(rt, "outcome"))
				}
			case "attempt": // admit and report at once: the common case
				if tk := admit(); tk != nil {
					report(tk, rapid.SampledFrom([]outcome{success, failure, failure, ignore}).Draw(rt, "outcome"))
				}
			case "tick":
				// Mostly whole window buckets, so that outcomes slide out
				// one tenth at a time; sometimes any number of ms.
				d := rapid.OneOf(
					rapid.Map(rapid.IntRange(0, 3), func(n int) time.Duration { return time.Duration(n) * s.width }),
					rapid.Map(rapid.IntRange(0, 25), func(n int) time.Duration { return time.Duration(n) * s.width }),
					rapid.Map(rapid.IntRange(0, 3000), func(n int) time.Duration { return time.Duration(n) * ms }),
				).Draw(rt, "tick")
				before := snapshot(b)
				clk.Advance(d)
				after(before)
			case "state":
				before := snapshot(b)
				outBefore := outstanding(before.gen)
				st := b.StateAt(clk.Now())
				got := after(before, transition{StateOpen, StateHalfOpen}, transition{StateHalfOpen, StateOpen})
				timeDue(before, outBefore, got)
				if a := snapshot(b); st != a.state {
					rt.Fatalf("State() = %v, internal %v", st, a.state)
				}
			}
		}

		// Liveness: whatever happened, once the dependency answers, the
		// breaker closes again within one open period and one probe round.
		for _, tk := range tickets {
			tk.t.Ignore()
		}
		clk.Advance(satmath.Add(s.maxOpen, s.maxOpen)) // past any jittered open period
		for i := range s.probes {
			tk, err := b.AdmitAt(clk.Now())
			if err != nil {
				rt.Fatalf("recovery probe %d refused in state %v", i, b.StateAt(clk.Now()))
			}
			tk.DoneAt(false, clk.Now())
		}
		if st := b.StateAt(clk.Now()); st != StateClosed {
			rt.Fatalf("after %d successful probes the breaker is %v", s.probes, st)
		}
	})
}

func (tr transition) String() string { return fmt.Sprintf("%v>%v", tr.from, tr.to) }
