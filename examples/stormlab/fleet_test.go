package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// smallFleet is a fleet the tests can afford: a few seconds, every cell
// side by side, a light load (lighter still under the race detector, which
// makes every RPC several times dearer: half the cells, a fifth of the
// calls).
func smallFleet() fleetShape {
	s := fleetShape{clients: 10, rate: 5, warmup: 500 * time.Millisecond, failure: 2500 * time.Millisecond, settle: time.Second, ps: []float64{0.5, 1}}
	if raceEnabled {
		s.rate, s.ps = 2, []float64{1}
	}
	return s
}

// fleetIDs returns, by independent arithmetic on the shape's offsets and
// period, the request ids of the calls due in the failure (first part
// and after).
func fleetIDs(s fleetShape) (first, after []string) {
	for i := range s.clients {
		for k := 0; ; k++ {
			due := s.offset(i) + time.Duration(k)*s.period()
			if due >= s.warmup+s.failure {
				break
			}
			switch {
			case due >= s.warmup+s.settle:
				after = append(after, fmt.Sprintf("a%d.%d", i, k))
			case due >= s.warmup:
				first = append(first, fmt.Sprintf("f%d.%d", i, k))
			}
		}
	}
	return first, after
}

// TestFleet runs a small fleet through the lab (tables, checks, JSON) and
// checks the scenario's mechanics: every row at every p, counts that add
// up, the failure model, and that the bounds are computed. It does not
// judge the bounds.
func TestFleet(t *testing.T) {
	s := smallFleet()
	var out bytes.Buffer
	rep, err := run(t.Context(), config{scenarios: "fleet", fleet: s, tailP99: maxTailP99}, &out)
	if errors.Is(err, errBehind) {
		t.Skipf("this machine could not keep the fleet's schedule, so its counts cannot be judged: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + out.String())
	if len(rep.Results) != 1 || rep.Results[0].Key != "fleet" {
		t.Fatalf("results %+v", rep.Results)
	}
	res := &rep.Results[0]
	if want := len(fleetRows()) * len(s.ps); len(res.Rows) != want {
		t.Fatalf("%d rows, want %d", len(res.Rows), want)
	}
	first, after := fleetIDs(s)
	for _, p := range s.ps {
		v := fmt.Sprintf("p=%g", p)
		// Attempts fail by a seeded hash of request id and attempt: the
		// first attempts that fail are the same in every row, and no
		// retries' successes are exactly the others.
		var okFirst, okAfter int
		for _, id := range first {
			if uniform(labSeed, id, 1) >= p {
				okFirst++
			}
		}
		for _, id := range after {
			if uniform(labSeed, id, 1) >= p {
				okAfter++
			}
		}
		for _, f := range fleetRows() {
			row := res.row(f.p.key, v)
			if row == nil || row.Fleet == nil {
				t.Errorf("%s: no row %s with fleet counts", v, f.p.name)
				continue
			}
			st := row.Fleet
			name := v + ", " + f.p.name
			if st.Clients != s.clients || st.AskedRate != s.askedRate() {
				t.Errorf("%s: %d clients at %g calls/s, want %d at %g", name, st.Clients, st.AskedRate, s.clients, s.askedRate())
			}
			// Every call due was made or counted as missed.
			made := st.Warmup.Calls + st.First.Calls + st.After.Calls
			if made+st.Missed != slots(s) {
				t.Errorf("%s: %d calls made and %d missed, want %d due", name, made, st.Missed, slots(s))
			}
			if row.Calls != st.First.Calls+st.After.Calls || row.OK != st.First.OK+st.After.OK ||
				row.Origin != st.First.Origin+st.After.Origin || st.Sent != st.First.Sent+st.After.Sent {
				t.Errorf("%s: the parts do not add up to the whole: row %+v, fleet %+v", name, row, st)
			}
			// The warm-up is healthy: one attempt per call, every call ok.
			if w := st.Warmup; w.Origin != w.Calls || w.Sent != w.Calls || w.OK != w.Calls {
				t.Errorf("%s: warm-up %+v, want one attempt per call and every call ok", name, w)
			}
			// Only the suite's server stands between the server and the
			// handler.
			if f.suiteServer && st.Sent < row.Origin || !f.suiteServer && st.Sent != row.Origin {
				t.Errorf("%s: %d attempts at the server, %d at the handler", name, st.Sent, row.Origin)
			}
			if st.Missed == 0 && (st.First.Calls != len(first) || st.After.Calls != len(after)) {
				t.Errorf("%s: %d + %d calls in the failure, want %d + %d", name, st.First.Calls, st.After.Calls, len(first), len(after))
			}
			switch f.p.key {
			case noRetries:
				if row.Origin != row.Calls {
					t.Errorf("%s: %d attempts for %d calls", name, row.Origin, row.Calls)
				}
				if st.Missed == 0 && (st.First.OK != okFirst || st.After.OK != okAfter) {
					t.Errorf("%s: %d + %d ok, want %d + %d (first attempts that succeed)", name, st.First.OK, st.After.OK, okFirst, okAfter)
				}
			case naive, grpcRetry:
				// Nothing stops these rows: three attempts per call when
				// every attempt fails.
				if p == 1 && (row.Origin != 3*row.Calls || row.OK != 0) {
					t.Errorf("%s: %d attempts, %d ok for %d calls; want 3 each and none ok", name, row.Origin, row.OK, row.Calls)
				}
			}
		}
	}
	// The bounds are computed for every p (not judged here: they hold only
	// with a budget that bounds a fleet).
	var fleetChecks []Check
	for _, c := range rep.Checks {
		if c.Scenario == 12 {
			fleetChecks = append(fleetChecks, c)
		}
	}
	if want := 10 * len(s.ps); len(fleetChecks) != want {
		t.Errorf("%d fleet checks, want %d", len(fleetChecks), want)
	}
	want := []string{"12. A fleet of quiet clients", "at server", "calls/s sent (asked)", "in 1 batch(es)"}
	for _, p := range s.ps {
		want = append(want, fmt.Sprintf("p=%g ", p))
	}
	for _, s := range want {
		if !strings.Contains(out.String(), s) {
			t.Errorf("output lacks %q", s)
		}
	}
	// The JSON carries the fleet's counts.
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if got := back.Results[0].Rows[0].Fleet; got == nil || *got != *res.Rows[0].Fleet {
		t.Errorf("JSON fleet counts %+v, want %+v", got, res.Rows[0].Fleet)
	}
}

// slots is the number of calls due in s's run: client i's are due at
// offset_i + k/r before the run's end.
func slots(s fleetShape) int {
	n := 0
	for i := range s.clients {
		for k := 0; s.offset(i)+time.Duration(k)*s.period() < s.warmup+s.failure; k++ {
			n++
		}
	}
	return n
}

// syntheticFleet is a fleet result with made-up counts at one p: every row
// sends and serves as the arguments say; the rest of the rows are as no
// retries.
func syntheticFleet(suiteAfterSent, suiteSent, suiteOK, thrSent, thrOK, handlerAfter int) *Result {
	const calls, after = 1000, 500
	st := func(sent, afterSent, afterOrigin int) *fleetStats {
		s := &fleetStats{Clients: 20, SettleS: 5, Sent: sent, SentAmplification: float64(sent) / calls,
			After: fleetWindow{Calls: after, Sent: afterSent, Origin: afterOrigin}}
		s.After.fill()
		return s
	}
	res := &Result{ID: 12, Key: "fleet"}
	for _, f := range fleetRows() {
		row := Row{Policy: f.p.key, Label: f.p.name, Variant: "p=0.5", Calls: calls, OK: 500, Origin: calls, Fleet: st(calls, after, after)}
		switch f.p.key {
		case grpcThrottled:
			row.OK, row.Fleet = thrOK, st(thrSent, after, after)
		case suiteClientOnly:
			row.OK, row.Fleet = suiteOK, st(suiteSent, suiteAfterSent, suiteAfterSent)
		case suiteDefaults, grpcSuiteServer:
			row.OK, row.Fleet = suiteOK, st(suiteSent, suiteAfterSent, handlerAfter)
		}
		res.Rows = append(res.Rows, row)
	}
	return res
}

func TestFleetChecks(t *testing.T) {
	// The whole failure may exceed 1.10× by the burst: 5 × 20 clients ÷
	// 1,000 calls = 0.1, so up to 1.20×.
	for _, c := range []struct {
		name                                        string
		afterSent, sent, ok, thrSent, thrOK, hAfter int
		miss                                        []string // the checks that miss, by row and what
	}{
		{"all met", 550, 1200, 600, 1100, 590, 550, nil},
		{"after 5 s over 1.10×", 551, 1200, 600, 1100, 590, 550, []string{
			"suite-clientonly load after", "suite load after"}},
		{"whole over 1.10× and the burst", 550, 1201, 600, 1100, 590, 550, []string{
			"suite-clientonly load over", "suite load over"}},
		{"less available than no retries", 550, 1200, 499, 1300, 400, 550, []string{
			"suite-clientonly ok ≥ no retries", "suite ok ≥ no retries"}},
		{"throttle sends no more and is more available", 550, 1200, 600, 1200, 606, 550, []string{
			"suite-clientonly ok ≥ retryThrottling", "suite ok ≥ retryThrottling"}},
		{"throttle sends more and is more available", 550, 1200, 600, 1201, 700, 550, nil},
		{"throttle within half a point", 550, 1200, 600, 1000, 605, 550, nil},
		{"handler over 1.10×", 550, 1200, 600, 1100, 590, 551, []string{
			"suite load at the handler", "grpc-suiteserver load at the handler"}},
	} {
		checks := fleetChecks(syntheticFleet(c.afterSent, c.sent, c.ok, c.thrSent, c.thrOK, c.hAfter))
		if len(checks) != 10 {
			t.Fatalf("%s: %d checks, want 10", c.name, len(checks))
		}
		var missed []string
		for _, ch := range checks {
			if !ch.OK {
				missed = append(missed, ch.Row+" "+ch.What)
			}
		}
		if len(missed) != len(c.miss) {
			t.Errorf("%s: missed %q, want %q", c.name, missed, c.miss)
			continue
		}
		for i, m := range c.miss {
			row, what, _ := strings.Cut(m, " ")
			if got := missed[i]; !strings.HasPrefix(got, row+" fleet p=0.5: "+what) {
				t.Errorf("%s: missed %q, want %q", c.name, got, m)
			}
		}
	}
}

func TestFleetOnSchedule(t *testing.T) {
	for _, c := range []struct {
		sent, missed, timeouts int
		behind                 bool
	}{
		{1000, 0, 0, false}, {900, 100, 0, false}, {899, 101, 0, true}, {0, 0, 0, true}, {0, 5, 0, true},
		{1000, 0, 5, false}, {1000, 0, 6, true}, {900, 100, 5, true},
	} {
		err := onSchedule(c.sent, c.missed, c.timeouts, 1000)
		if errors.Is(err, errBehind) != c.behind {
			t.Errorf("onSchedule(%d sent, %d missed, %d timeouts) = %v, want behind %v", c.sent, c.missed, c.timeouts, err, c.behind)
		}
	}
}

func TestFleetShapeAndFlags(t *testing.T) {
	if err := defaultFleet.validate(); err != nil {
		t.Errorf("default fleet: %v", err)
	}
	if got := (fleetShape{}).orDefault(); got.clients != defaultFleet.clients || got.warmup != defaultFleet.warmup {
		t.Errorf("the zero shape is not the default: %+v", got)
	}
	for _, bad := range []func(*fleetShape){
		func(s *fleetShape) { s.clients = 0 },
		func(s *fleetShape) { s.clients = fleetMaxConcurrentClients + 1 },
		func(s *fleetShape) { s.rate = 0 },
		func(s *fleetShape) { s.rate = -1 },
		func(s *fleetShape) { s.warmup = -time.Second },
		func(s *fleetShape) { s.failure = s.settle },
		func(s *fleetShape) { s.failure = time.Hour },
		func(s *fleetShape) { s.ps = []float64{1.5} },
		func(s *fleetShape) { s.ps = nil },
	} {
		s := defaultFleet
		s.ps = []float64{0.5}
		bad(&s)
		if err := s.validate(); err == nil {
			t.Errorf("shape %+v accepted", s)
		}
		if _, err := fleetWith(t.Context(), s); err == nil {
			t.Errorf("fleetWith ran shape %+v", s)
		}
		// The lab refuses it before it runs anything.
		var out bytes.Buffer
		if _, err := run(t.Context(), config{scenarios: "outage,fleet", fleet: s}, &out); err == nil || strings.Contains(out.String(), "Outage") {
			t.Errorf("the lab ran shape %+v: %v\n%s", s, err, out.String())
		}
	}
	if ps, err := parseProbabilities(" 0.3,0.5 ,1"); err != nil || len(ps) != 3 || ps[2] != 1 {
		t.Errorf("parseProbabilities: %v, %v", ps, err)
	}
	for _, bad := range []string{"", "0.5,", "x", "1.1", "-0.1", "NaN"} {
		if _, err := parseProbabilities(bad); err == nil {
			t.Errorf("parseProbabilities(%q) accepted", bad)
		}
	}
	if got := joinFloats(defaultFleet.ps); got != "0.3,0.5,0.9,1" {
		t.Errorf("joinFloats = %q", got)
	}
}

// TestFleetBatches: every cell runs once, no batch is over the attempts or
// the clients it may have unless it is a single cell, and the default
// fleet fits in few batches.
func TestFleetBatches(t *testing.T) {
	for _, c := range []struct {
		s       fleetShape
		most    float64
		batches int // the fewest possible for the default: ⌈28,550 ÷ 5,000⌉ = 6
	}{
		{defaultFleet, fleetMaxConcurrentAttempts, 6},
		{defaultFleet, fleetMaxConcurrentAttempts / 2, 0},
		{fleetShape{clients: 1000, rate: 50, ps: []float64{0.5}}, fleetMaxConcurrentAttempts, 7},
		{fleetShape{clients: 1500, rate: 1, ps: []float64{0.5, 1}}, fleetMaxConcurrentAttempts, 0},
	} {
		var jobs []*fleetJob
		for _, p := range c.s.ps {
			for _, f := range fleetRows() {
				jobs = append(jobs, &fleetJob{f: f, p: p})
			}
		}
		batches := c.s.batches(jobs, c.most)
		seen := map[*fleetJob]bool{}
		for _, b := range batches {
			var a float64
			for _, j := range b {
				if seen[j] {
					t.Errorf("%+v: a cell in two batches", c.s)
				}
				seen[j] = true
				a += c.s.attempts(j.f, j.p)
			}
			if len(b) > 1 && (a > c.most || len(b)*c.s.clients > fleetMaxConcurrentClients) {
				t.Errorf("%+v: a batch of %d cells, %.0f attempts/s, %d clients", c.s, len(b), a, len(b)*c.s.clients)
			}
		}
		if len(seen) != len(jobs) {
			t.Errorf("%+v: %d of %d cells in the batches", c.s, len(seen), len(jobs))
		}
		if c.batches > 0 && len(batches) != c.batches {
			t.Errorf("%+v: %d batches, want %d", c.s, len(batches), c.batches)
		}
	}
}
