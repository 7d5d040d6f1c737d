package main

import (
	"errors"
	"testing"
	"time"

	"github.com/stormguard/stormguard/priority"
)

// TestPriority runs the priority scenario, 3 s long, and checks its
// bounds: with priorities the critical callers' calls succeed, without a
// difference between the callers they are served alike, and the suite's
// defaults, with and without a per-attempt timeout, do no harm and waste
// little. A machine that
// cannot keep its schedule skips it (its counts cannot be judged).
func TestPriority(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("a real-time scenario: not with -short or -race")
	}
	s := priorityShape
	s.after = 3 * time.Second
	res, err := prioritiesWith(t.Context(), s)
	if errors.Is(err, errPriorityBehind) {
		t.Skipf("this machine could not keep the scenario's schedule: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rows) != len(priorityRuns()) {
		t.Fatalf("%d rows", len(res.Rows))
	}
	for _, row := range res.Rows {
		t.Logf("%-34s ok %4d/%d  critical %v  sheddable %v  server refused %v", row.Label, row.OK, row.Calls,
			row.Classes[classCritical], row.Classes[classSheddable], row.ServerRefused)
		if n := row.Classes[classCritical].Calls + row.Classes[classSheddable].Calls; n != row.Calls || row.Calls != 600 {
			t.Errorf("%s: %d calls in the classes, %d in all, want 600", row.Label, n, row.Calls)
		}
	}
	checks := priorityChecks(res)
	if len(checks) != 8 {
		t.Fatalf("%d checks, want 8", len(checks))
	}
	for _, c := range checks {
		if !c.OK {
			t.Errorf("%s (%s): want %s, got %s", c.What, c.Row, c.Want, c.Got)
		}
	}
}

// syntheticPriority is a priority result with the given (ok, calls) per
// class for the defaults, priorities and every-call-critical rows.
func syntheticPriority(def, prio, all [2]classCount) *Result {
	row := func(p policyKey, c [2]classCount) Row {
		return Row{Policy: p, Calls: c[0].Calls + c[1].Calls, OK: c[0].OK + c[1].OK,
			Classes: map[string]classCount{classCritical: c[0], classSheddable: c[1]}}
	}
	return &Result{ID: 13, Key: "priority", Rows: []Row{
		row(noRetries, [2]classCount{{240, 40}, {960, 150}}),
		row(suiteDefaults, def), row(suitePriority, prio), row(suiteAllCritical, all),
	}}
}

func TestPriorityChecks(t *testing.T) {
	good := [2]classCount{{240, 70}, {960, 280}}
	for _, c := range []struct {
		name           string
		def, prio, all [2]classCount
		want           []bool // defaults ok ≥ no retries'; critical ok; defaults alike; all-critical alike; all-critical = defaults
	}{
		{"as measured", good, [2]classCount{{240, 240}, {960, 420}}, [2]classCount{{240, 72}, {960, 270}}, []bool{true, true, true, true, true}},
		{"critical at 99%", good, [2]classCount{{240, 238}, {960, 420}}, good, []bool{true, true, true, true, true}},
		{"critical below 99%", good, [2]classCount{{240, 237}, {960, 420}}, good, []bool{true, false, true, true, true}},
		{"defaults favour a class", [2]classCount{{240, 100}, {960, 280}}, [2]classCount{{240, 240}, {960, 420}}, good, []bool{true, true, false, true, true}},
		{"claiming critical all round buys something", good, [2]classCount{{240, 240}, {960, 420}}, [2]classCount{{240, 100}, {960, 400}}, []bool{true, true, true, true, false}},
		{"every call critical favours a class", good, [2]classCount{{240, 240}, {960, 420}}, [2]classCount{{240, 120}, {960, 230}}, []bool{true, true, true, false, true}},
		{"defaults serve fewer than no retries", [2]classCount{{240, 40}, {960, 140}}, [2]classCount{{240, 240}, {960, 420}}, [2]classCount{{240, 40}, {960, 140}}, []bool{false, true, true, true, true}},
	} {
		checks := checkBounds([]*Result{syntheticPriority(c.def, c.prio, c.all)}, maxTailP99)
		if len(checks) != len(c.want) {
			t.Fatalf("%s: %d checks", c.name, len(checks))
		}
		for i, ch := range checks {
			if ch.OK != c.want[i] {
				t.Errorf("%s: %s (%s): ok %v, want %v (want %s, got %s)", c.name, ch.What, ch.Row, ch.OK, c.want[i], ch.Want, ch.Got)
			}
		}
	}
}

func TestPriorityMarks(t *testing.T) {
	for _, c := range []struct {
		p      policyKey
		class  string
		want   priority.Priority
		marked bool
	}{
		{noRetries, classCritical, priority.Default, false},
		{suiteDefaults, classCritical, priority.Default, false},
		{suitePriority, classCritical, priority.Critical, true},
		{suitePriority, classSheddable, priority.Sheddable, true},
		{suiteAllCritical, classCritical, priority.Critical, true},
		{suiteAllCritical, classSheddable, priority.Critical, true},
	} {
		got, marked := policy{key: c.p}.mark(c.class)
		if got != c.want || marked != c.marked {
			t.Errorf("%s, %s: %v, %v; want %v, %v", c.p, c.class, got, marked, c.want, c.marked)
		}
	}
}

func TestPriorityOnSchedule(t *testing.T) {
	for _, c := range []struct {
		onTime, asked int
		behind        bool
	}{{1200, 1200, false}, {1140, 1200, false}, {1139, 1200, true}, {0, 0, true}} {
		if err := prioOnSchedule(c.onTime, c.asked); errors.Is(err, errPriorityBehind) != c.behind {
			t.Errorf("prioOnSchedule(%d, %d) = %v, want behind %v", c.onTime, c.asked, err, c.behind)
		}
	}
}
