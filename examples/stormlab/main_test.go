package main

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// exact is what a deterministic row must count in every run: requests
// at the origin and callers ok.
type exact struct{ origin, ok int }

// TestQuick runs what CI runs (-quick) and checks the bounds, and the
// counts the README says are identical between runs. Under the race
// detector it leaves out scenario 9 (2,000 calls per row, 14 rows: about a
// minute with -race on 2 cores); the outlier package's own tests cover its
// policy under -race.
func TestQuick(t *testing.T) {
	var out bytes.Buffer
	cfg, scenarios, checks := config{quick: true, tailP99: maxTailP99}, 6, 22
	if raceEnabled {
		cfg, scenarios, checks = config{scenarios: "1,2,3,4,7", tailP99: maxTailP99}, 5, 14
	}
	rep, err := run(context.Background(), cfg, &out)
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + out.String())
	for _, c := range rep.Checks {
		if !c.OK {
			t.Errorf("scenario %d, %s (%s): want %s, got %s", c.Scenario, c.What, c.Row, c.Want, c.Got)
		}
	}
	if !rep.OK {
		t.Error("report not OK")
	}
	if got := len(rep.Checks); got != checks {
		t.Errorf("%d checks, want %d (outage ×5, flaky, twice, chain ×4, capacity ×3, backend dead ×8 unless -race)", got, checks)
	}
	// Rows whose counts follow from the model alone (the suite's defaults
	// in the storm scenarios depend on how many failures are in when its
	// first retries are due, within the bounds checked above).
	type key struct {
		scenario, variant string
	}
	want := map[key]map[policyKey]exact{
		{"outage", "wave 1"}: {noRetries: {50, 0}, naive: {150, 0}, grpcRetry: {150, 0}, grpcThrottled: {54, 0}, suiteBudget: {57, 0}, suiteShadow: {150, 0}},
		{"outage", "wave 2"}: {noRetries: {50, 0}, naive: {150, 0}, grpcRetry: {150, 0}, suiteDefaults: {0, 0}, suiteShadow: {150, 0}},
		{"flaky", ""}:        {noRetries: {50, 45}, naive: {55, 50}, grpcRetry: {55, 50}, suiteBudget: {55, 50}, suiteDefaults: {55, 50}, suiteShadow: {55, 50}},
		{"twice", ""}:        {noRetries: {50, 0}, naive: {150, 50}, grpcRetry: {150, 50}, grpcThrottled: {54, 0}, suiteBudget: {57, 0}, suiteShadow: {150, 50}},
		{"chain", "depth 3"}: {noRetries: {10, 0}, naive: {810, 0}, grpcRetry: {810, 0}, grpcThrottled: {26, 0}, suiteBudget: {16, 0}, suiteShadow: {810, 0}},
		{"chain", "depth 4"}: {noRetries: {10, 0}, naive: {2430, 0}, grpcRetry: {2430, 0}, grpcThrottled: {30, 0}, suiteBudget: {16, 0}, suiteShadow: {2430, 0}},
		{"capacity", ""}: {noRetries: {18000, 15900}, naive: {22200, 15900}, grpcRetry: {22200, 15900},
			grpcThrottled: {18009, 15900}, suiteBudget: {18213, 15900}, suiteDefaults: {18213, 15900}},
	}
	for _, r := range rep.Results {
		for k, rows := range want {
			if k.scenario != r.Key {
				continue
			}
			for p, w := range rows {
				row := r.row(p, k.variant)
				if row == nil {
					t.Errorf("%s %s: no row %s", r.Key, k.variant, p)
					continue
				}
				got := exact{row.Origin, row.OK}
				if k.scenario == "twice" && (p == suiteBudget || p == grpcThrottled) {
					// A budget grants the same retries in every run, but
					// which callers get both of theirs (and succeed)
					// depends on the order the answers come back in.
					if got.origin != w.origin || got.ok > (got.origin-50)/2 {
						t.Errorf("%s, %s: origin %d, ok %d; want %d, at most %d", r.Key, row.Label, got.origin, got.ok, w.origin, (w.origin-50)/2)
					}
					continue
				}
				if got != w {
					t.Errorf("%s %s, %s: origin %d, ok %d; want %d, %d", r.Key, k.variant, row.Label, got.origin, got.ok, w.origin, w.ok)
				}
			}
		}
		want := len(withShadow())
		switch r.Key {
		case "outage", "chain":
			want = 2 * len(withShadow())
		case "capacity": // a model: no shadow row
			want = len(policies())
		}
		if r.Key == "backend-dead" {
			want = 2 * len(deadPolicies())
			// The outlier policy keeps the dead backend out: far fewer
			// requests than without it (this is not one of the suite's
			// bounds; those are checked above).
			for _, v := range []string{"1 of 2", "1 of 3"} {
				none, out := r.row(noRetries, v), r.row(suiteOutlier, v)
				if none == nil || out == nil || out.Dead*4 > none.Dead {
					t.Errorf("backend dead, %s: no-retries row %+v, outlier row %+v: want a quarter of the dead backend's requests or fewer", v, none, out)
				}
			}
		}
		if len(r.Rows) != want {
			t.Errorf("%s: %d rows, want %d", r.Key, len(r.Rows), want)
		}
	}
	if len(rep.Results) != scenarios {
		t.Errorf("%d scenarios, want %d", len(rep.Results), scenarios)
	}
	// Headers and the verdict the text prints.
	for _, s := range []string{"1. Outage, one hop", "4. Chain of services", "all bounds met"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("output lacks %q", s)
		}
	}
}

// TestLongTail checks scenario 8's bounds on the article's shape: p99 ≤
// 50 ms at ≤ 1.10× load. It judges wall-clock latencies, so it runs only
// where the machine is not shared with the rest of the suite: not under
// the race detector or -short, and only with STORMLAB_LONGTAIL=1, which
// CI's step for the tests that judge wall-clock time sets. The 1% × 100
// variant's bounds (a p99.9 cut at least tenfold for at most 1.02× the
// attempts) are logged, not judged, here: on a shared 2-core VM the fast
// attempts' own p99.9 (7 to 11 ms at load average 2.5) is the floor of the
// hedged p99.9, and the figure measures the machine. The full lab checks
// them on every run, and TestAdaptiveHedgingCutsALongTailCheaply checks
// the rule on the bubble's clock.
func TestLongTail(t *testing.T) {
	if raceEnabled || testing.Short() {
		t.Skip("judges latency: not under -race or -short")
	}
	if os.Getenv("STORMLAB_LONGTAIL") != "1" {
		t.Skip("set STORMLAB_LONGTAIL=1: it judges a wall-clock p99 (CI runs it without -race)")
	}
	var out bytes.Buffer
	rep, err := run(context.Background(), config{scenarios: "tail", tailP99: maxTailP99}, &out)
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + out.String())
	if len(rep.Checks) != 4 {
		t.Fatalf("%d checks, want 4", len(rep.Checks))
	}
	for _, c := range rep.Checks {
		switch {
		case strings.Contains(c.What, tailScaleVariant):
			t.Logf("%s: want %s, got %s (not judged here)", c.What, c.Want, c.Got)
		case !c.OK:
			t.Errorf("%s: want %s, got %s", c.What, c.Want, c.Got)
		}
	}
	// Without hedging, the slow 5% show in the p99.
	if row := rep.Results[0].row("suite-nohedging", ""); row == nil || row.P99ms < millis(tailSlow) {
		t.Errorf("no-hedging row %+v: want a p99 ≥ %v", row, tailSlow)
	}
}

func TestJSONAndSVG(t *testing.T) {
	var out bytes.Buffer
	rep, err := run(context.Background(), config{scenarios: "capacity,chain", json: true, tailP99: maxTailP99}, &out)
	if err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(out.Bytes(), &back); err != nil {
		t.Fatalf("-json output is not JSON: %v\n%s", err, out.String())
	}
	if len(back.Results) != 2 || back.Results[0].Key != "capacity" || back.Results[1].Key != "chain" || !back.OK {
		t.Errorf("JSON report: %d results, ok %v", len(back.Results), back.OK)
	}
	if r := back.Results[0].Rows[len(back.Results[0].Rows)-1]; r.Peak != 971 || r.Served != 15900 {
		t.Errorf("JSON capacity row %+v", r)
	}

	var svg bytes.Buffer
	writeSVG(&svg, rep)
	all := svgTexts(t, svg.Bytes())
	for _, p := range policies() {
		if !strings.Contains(all, p.name) {
			t.Errorf("legend lacks %q", p.name)
		}
	}
	for _, s := range []string{"4 chain depth 3", "4 chain depth 4", "7 capacity drop", "81.00×", "243.00×", "2.56"} {
		if !strings.Contains(all, s) {
			t.Errorf("chart lacks %q: %s", s, all)
		}
	}
}

func TestSelectScenarios(t *testing.T) {
	got, err := selectScenarios("1, chain,TAIL,backend-dead", false)
	if err != nil || len(got) != 4 || got[0].id != 1 || got[1].id != 4 || got[2].id != 8 || got[3].id != 9 {
		t.Errorf("selectScenarios: %v, %v", got, err)
	}
	if _, err := selectScenarios("15", false); err == nil {
		t.Error("scenario 15 accepted")
	}
	if got, err := selectScenarios("metastable", false); err != nil || len(got) != 1 || got[0].id != 10 {
		t.Errorf("selectScenarios(metastable): %v, %v", got, err)
	}
	quick, _ := selectScenarios("", true)
	all, _ := selectScenarios("", false)
	if len(quick) != 6 || len(all) != 14 {
		t.Errorf("quick %d, all %d", len(quick), len(all))
	}
}

func TestGRPCServiceConfigParses(t *testing.T) {
	for _, throttled := range []bool{false, true} {
		var v map[string]any
		if err := json.Unmarshal([]byte(grpcServiceConfig(throttled)), &v); err != nil {
			t.Fatalf("throttled=%v: %v", throttled, err)
		}
		if _, ok := v["retryThrottling"]; ok != throttled {
			t.Errorf("throttled=%v: retryThrottling present %v", throttled, ok)
		}
	}
}

// issueShape is the fast shape of the metastable trial: 4 workers ×
// 5 ms, a queue of 2,000, 560 calls/s, 1 s deadlines, 100 ms per attempt,
// 2 s at 16 ms. Scenario 10 is the same system four times slower.
var issueShape = shape{
	workers: 4, service: 5 * time.Millisecond, queue: 2000, rate: 560, clients: 4,
	deadline: time.Second, perTry: 100 * time.Millisecond, slow: 16 * time.Millisecond,
	before: 2 * time.Second, trigger: 2 * time.Second, after: 6 * time.Second,
}

// TestMetastableIssueShape runs scenario 10's rows on issueShape and checks
// scenario 10's bounds. It takes 50 s and judges recovery on a real clock
// at 560 calls/s, which a busy machine disturbs: it runs only with
// STORMLAB_ISSUESHAPE=1, not under -race or -short.
func TestMetastableIssueShape(t *testing.T) {
	if raceEnabled || testing.Short() || os.Getenv("STORMLAB_ISSUESHAPE") != "1" {
		t.Skip("set STORMLAB_ISSUESHAPE=1 (not under -race or -short): 50 s, judges recovery on a real clock")
	}
	res, err := metastableWith(t.Context(), issueShape)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	printTable(&out, res)
	rep := &Report{Results: []Result{*res}, Checks: checkBounds([]*Result{res}, maxTailP99), OK: true}
	for _, c := range rep.Checks {
		rep.OK = rep.OK && c.OK
	}
	printChecks(&out, rep)
	t.Log("\n" + out.String())
	for _, c := range rep.Checks {
		if !c.OK {
			t.Errorf("%s (%s): want %s, got %s", c.What, c.Row, c.Want, c.Got)
		}
	}
}

// syntheticMetastable is a metastable result with made-up goodput, for
// the tests of what the lab draws and checks.
func syntheticMetastable(suiteRec, naiveRec recoveryS, quietRefused int) *Result {
	s := metastableShape
	steps := s.steps()
	curve := func(rec recoveryS) []float64 {
		g := make([]float64, steps)
		for i := range g {
			switch {
			case i < s.triggerStep():
				g[i] = 1
			case rec.never || i < s.endStep()+int(rec.s/msStep.Seconds()):
				g[i] = 0.05
			default:
				g[i] = 1
			}
		}
		return g
	}
	row := func(p policy, rec recoveryS, variant string) Row {
		r := rec
		return Row{Policy: p.key, Label: p.name, Variant: variant, Calls: 1400, OK: 1000, Goodput: curve(rec), Recovery: &r,
			marks: []int{s.triggerStep(), s.endStep()}}
	}
	res := &Result{ID: 10, Key: "metastable", Title: "Metastable failure", Setup: s.setup(), StepS: msStep.Seconds(),
		Trigger: &window{From: s.before.Seconds(), To: (s.before + s.trigger).Seconds()},
		cols:    []col{colVariant, colPolicy, colServerRefused, colRecovery, colGoodput}}
	res.Rows = []Row{
		row(policy{noRetries, "no retries"}, recoveryS{}, ""),
		row(policy{naive, "3 attempts, no budget"}, naiveRec, ""),
		row(policy{suiteDefaults, "stormguard defaults"}, suiteRec, ""),
		row(policy{suiteDefaults, "stormguard defaults"}, recoveryS{}, noTrigger),
	}
	if quietRefused > 0 {
		res.Rows[3].ServerRefused = map[string]int{"shed_first": quietRefused}
	}
	return res
}

func TestMetastableChecks(t *testing.T) {
	for _, c := range []struct {
		suite, naive recoveryS
		quiet        int
		want         []bool
	}{
		{recoveryS{s: 0}, recoveryS{never: true}, 0, []bool{true, true, true}},
		{recoveryS{s: 0.5}, recoveryS{s: 2.5}, 0, []bool{true, true, true}},
		{recoveryS{s: 0.5}, recoveryS{s: 2.25}, 0, []bool{true, false, true}},
		{recoveryS{s: 0}, recoveryS{s: 1.0}, 0, []bool{true, false, true}}, // 5 steps at least
		{recoveryS{s: 2.25}, recoveryS{never: true}, 0, []bool{false, true, true}},
		{recoveryS{never: true}, recoveryS{never: true}, 0, []bool{false, true, true}},
		{recoveryS{s: 0}, recoveryS{never: true}, 3, []bool{true, true, false}},
	} {
		var checks []Check // the suite's recovery, the naive row's, false refusals; TestNoHarmChecks has the others
		for _, ch := range checkBounds([]*Result{syntheticMetastable(c.suite, c.naive, c.quiet)}, maxTailP99) {
			if !strings.Contains(ch.What, "no retries'") {
				checks = append(checks, ch)
			}
		}
		if len(checks) != 3 {
			t.Fatalf("%d checks", len(checks))
		}
		for i, ch := range checks {
			if ch.OK != c.want[i] {
				t.Errorf("suite %v, naive %v, quiet %d: %s: ok %v, want %v (want %s, got %s)",
					&c.suite, &c.naive, c.quiet, ch.What, ch.OK, c.want[i], ch.Want, ch.Got)
			}
		}
	}
}

func TestRecovery(t *testing.T) {
	for _, c := range []struct {
		good []float64
		from int
		want recoveryS
	}{
		{[]float64{1, 0, 1, 1}, 1, recoveryS{s: 0.25}},
		{[]float64{1, 0, 0.95, 0.9}, 1, recoveryS{s: 0.25}},
		{[]float64{1, 1, 1, 1}, 1, recoveryS{s: 0}},
		{[]float64{1, 1, 0.2, 1}, 1, recoveryS{s: 0.5}},
		{[]float64{1, 1, 1, 0.89}, 1, recoveryS{never: true}},
	} {
		if got := recovery(c.good, c.from); got != c.want {
			t.Errorf("recovery(%v, %d) = %v, want %v", c.good, c.from, &got, &c.want)
		}
	}
	for _, r := range []recoveryS{{s: 1.25}, {never: true}, {s: 0}} {
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		var back recoveryS
		if err := json.Unmarshal(b, &back); err != nil || back != r {
			t.Errorf("%v → %s → %v, %v", &r, b, &back, err)
		}
	}
	if b, _ := json.Marshal(Row{Recovery: &recoveryS{never: true}}); !strings.Contains(string(b), `"recovery_s":null`) {
		t.Errorf("never is not null: %s", b)
	}
	if b, _ := json.Marshal(Row{}); strings.Contains(string(b), "recovery_s") {
		t.Errorf("rows of other scenarios carry recovery_s: %s", b)
	}
	if got := sparkline([]float64{1, 0, 0.5, 0.92}, 1, 3); got != "█|·▅|█" {
		t.Errorf("sparkline = %q", got)
	}
}

func TestGoodputSVG(t *testing.T) {
	rep := &Report{Machine: thisMachine(), Results: []Result{*syntheticMetastable(recoveryS{s: 0.25}, recoveryS{never: true}, 2)}}
	var svg bytes.Buffer
	if err := writeGoodputSVG(&svg, rep); err != nil {
		t.Fatal(err)
	}
	if path := os.Getenv("STORMLAB_SVG_OUT"); path != "" {
		_ = os.WriteFile(path, svg.Bytes(), 0o644)
	}
	texts := svgTexts(t, svg.Bytes())
	for _, s := range []string{"no retries — recovery 0.00s", "3 attempts, no budget — recovery never",
		"stormguard defaults — recovery 0.25s", "stormguard defaults 2", "10s"} {
		if !strings.Contains(texts, s) {
			t.Errorf("chart lacks %q: %s", s, texts)
		}
	}
	if strings.Count(svg.String(), "<path d=\"M") < 3 {
		t.Error("fewer than three goodput curves")
	}
	if err := writeGoodputSVG(io.Discard, &Report{}); err == nil {
		t.Error("a chart without the metastable scenario")
	}
	if _, err := run(t.Context(), config{scenarios: "chain", goodput: "x.svg"}, io.Discard); err == nil {
		t.Error("-goodput-svg accepted without the metastable scenario")
	}
}

// svgTexts returns the text elements of an SVG, joined by "|", failing t
// if it is not well-formed XML.
func svgTexts(t *testing.T, b []byte) string {
	t.Helper()
	d := xml.NewDecoder(bytes.NewReader(b))
	var texts []string
	inText := false
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("SVG is not well-formed XML: %v", err)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			inText = tok.Name.Local == "text"
		case xml.CharData:
			if inText {
				texts = append(texts, string(tok))
			}
		case xml.EndElement:
			inText = false
		}
	}
	return strings.Join(texts, "|")
}

// TestQueueOrigin: a full queue answers UNAVAILABLE at once, and close
// releases every handler still waiting (goleak checks that none is left).
func TestQueueOrigin(t *testing.T) {
	o := newQueueOrigin(1, 1, time.Hour)
	l := origin.Bufconn()
	srv := origin.Serve(l, o)
	defer srv.Stop()
	cc, err := l.Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	echo := echov1.NewEchoServiceClient(cc)
	errs := make(chan error, 3)
	for i := range 3 {
		go func() {
			_, err := echo.Put(t.Context(), &echov1.PutRequest{RequestId: strconv.Itoa(i)})
			errs <- err
		}()
	}
	// One worker and one place in the queue: of three, at least one finds
	// the queue full and is answered at once.
	if err := <-errs; status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "queue full") {
		t.Fatalf("first answer: %v, want queue full", err)
	}
	for o.arrived.Load() < 3 {
		runtime.Gosched()
	}
	o.close()
	for range 2 {
		if err := <-errs; status.Code(err) != codes.Unavailable {
			t.Errorf("after close: %v", err)
		}
	}
	if full := o.full.Load(); full < 1 || full > 2 {
		t.Errorf("%d answered queue full", full)
	}
}

// TestNoHarmChecks: the suite's defaults must complete at least as many
// calls as no retries, within 0.5% of the calls, and recover no later; and
// waste at most 5% of the origin's work.
func TestNoHarmChecks(t *testing.T) {
	rec := func(s float64, never bool) *recoveryS { return &recoveryS{s: s, never: never} }
	none := &Row{Policy: noRetries, Calls: 1400, OK: 1000, Recovery: rec(0.25, false)}
	for _, c := range []struct {
		ok        int
		recovery  *recoveryS
		noneNever bool
		okWant    bool
		recWant   bool
	}{
		{1000, rec(0, false), false, true, true},
		{993, rec(0.25, false), false, true, true}, // 7 = ⌈0.5% of 1,400⌉ fewer
		{992, rec(0.25, false), false, false, true},
		{1100, rec(0.5, false), false, true, false},
		{1100, rec(0, true), false, true, false},
		{1100, rec(0, true), true, true, true},
	} {
		n := *none
		if c.noneNever {
			n.Recovery = rec(0, true)
		}
		row := &Row{Policy: suiteDefaults, Calls: 1400, OK: c.ok, Recovery: c.recovery}
		checks := noHarmChecks(&Result{ID: 10}, row, &n, "metastable")
		if len(checks) != 2 || checks[0].OK != c.okWant || checks[1].OK != c.recWant {
			t.Errorf("ok %d, recovery %v against %d, %v: %+v; want %v, %v", c.ok, c.recovery, n.OK, n.Recovery, checks, c.okWant, c.recWant)
		}
	}
	for _, c := range []struct {
		wasted, worked int
		want           bool
	}{{0, 1000, true}, {50, 1000, true}, {51, 1000, false}} {
		w := c.wasted
		checks := wasteCheck(&Result{ID: 13}, &Row{Policy: suiteDefaults, Wasted: &w, Worked: c.worked}, "priority")
		if len(checks) != 1 || checks[0].OK != c.want {
			t.Errorf("%d wasted of %d: %+v, want ok %v", c.wasted, c.worked, checks, c.want)
		}
	}
}

// TestMixedChecks: the mixed-fleet overload's bounds on a synthetic run of
// one drop length.
func TestMixedChecks(t *testing.T) {
	rec := func(s float64, never bool) *recoveryS { return &recoveryS{s: s, never: never} }
	row := func(p policyKey, ok int, drop float64, r, r99 *recoveryS) Row {
		return Row{Policy: p, Variant: "T=10s", Calls: 2880, OK: ok, DropGoodput: drop, Recovery: r, Recovery99: r99}
	}
	for _, c := range []struct {
		name    string
		control *recoveryS
		drop    float64
		r99     *recoveryS
		ok      int
		failing []string // the checks that must fail
	}{
		{"as wanted", rec(0, true), 0.95, rec(0.25, false), 2000, nil},
		{"the control recovers", rec(2, false), 0.95, rec(0.25, false), 2000, []string{"the control stays down"}},
		{"too little goodput in the drop", rec(0, true), 0.89, rec(0.25, false), 2000, []string{"goodput in the drop"}},
		{"back to 99% too late", rec(0, true), 0.95, rec(1.25, false), 2000, []string{"back to 99%"}},
		{"never back to 99%", rec(0, true), 0.95, rec(0, true), 2000, []string{"back to 99%"}},
		{"fewer ok than no retries", rec(0, true), 0.95, rec(0.25, false), 1000, []string{"ok ≥ no retries'"}},
	} {
		res := &Result{ID: 14, Key: "overload-mixed", Rows: []Row{
			row(noRetries, 1100, 0.05, rec(0, true), rec(0, true)),
			row(mixedControl, 300, 0.05, c.control, rec(0, true)),
			row(mixedSuite, c.ok, c.drop, rec(0, false), c.r99),
			row(mixedSuitePT, 2000, 0.95, rec(0, false), rec(0.25, false)),
			row(mixedGRPCSuite, 2000, 0.95, rec(0, false), rec(0.25, false)),
		}}
		checks := checkBounds([]*Result{res}, maxTailP99)
		if len(checks) != 1+2*2+2*2 {
			t.Fatalf("%s: %d checks", c.name, len(checks))
		}
		for _, ch := range checks {
			want := true
			for _, f := range c.failing {
				if strings.Contains(ch.What, f) && (ch.Row == string(mixedSuite) || ch.Row == string(mixedControl)) {
					want = false
				}
			}
			if ch.OK != want {
				t.Errorf("%s: %s (%s): ok %v, want %v (want %s, got %s)", c.name, ch.What, ch.Row, ch.OK, want, ch.Want, ch.Got)
			}
		}
	}
}

// TestMetastableHedgingAndPerTryChecks: with hedging on, the defaults
// recover within 0.1 s of how they do without it; with a 100 ms
// per-attempt timeout the suite's client alone recovers within 0.5 s.
func TestMetastableHedgingAndPerTryChecks(t *testing.T) {
	for _, c := range []struct {
		hedged, clientOnly recoveryS
		want               [2]bool
	}{
		{recoveryS{s: 0.25}, recoveryS{s: 0.5}, [2]bool{true, true}},
		{recoveryS{s: 0.5}, recoveryS{s: 0.75}, [2]bool{false, false}},
		{recoveryS{never: true}, recoveryS{never: true}, [2]bool{false, false}},
	} {
		res := syntheticMetastable(recoveryS{s: 0.25}, recoveryS{never: true}, 0)
		h, co := c.hedged, c.clientOnly
		res.Rows = append(res.Rows,
			Row{Policy: suiteHedging, Calls: 1400, OK: 1000, Recovery: &h},
			Row{Policy: suiteClientOnly, Variant: shortPerTry, Calls: 1400, OK: 1000, Recovery: &co})
		var got []Check
		for _, ch := range metastableChecks(res) {
			if strings.Contains(ch.What, "hedging") || strings.Contains(ch.What, "alone") {
				got = append(got, ch)
			}
		}
		if len(got) != 2 || got[0].OK != c.want[0] || got[1].OK != c.want[1] {
			t.Errorf("hedged %v, client alone %v: %+v, want %v", &c.hedged, &c.clientOnly, got, c.want)
		}
	}
}
