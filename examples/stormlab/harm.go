package main

import (
	"fmt"
	"math"
)

// The bounds the suite's defaults are held to under overload, in every
// overload scenario (the metastable one, the blip, the priorities, the
// mixed fleet), with and without a per-attempt timeout: they complete at
// least as many calls as no retries, within maxHarm of the calls, and
// recover no later; and, where the origin's handler does not watch its
// context, at most maxWaste of the origin's work is for callers who had
// left.
const (
	maxHarm  = 0.005
	maxWaste = 0.05
)

// noHarmChecks checks row, a suite's row, against none, the no-retries
// row of the same load: calls ok, and (when both measure it) recovery.
func noHarmChecks(r *Result, row, none *Row, what string) []Check {
	if row == nil || none == nil {
		return nil
	}
	slack := int(math.Ceil(maxHarm * float64(row.Calls)))
	out := []Check{{Scenario: r.ID, Row: string(row.Policy), What: what + ": ok ≥ no retries' − 0.5%",
		Want: fmt.Sprintf("≥ %d", none.OK-slack), Got: fmt.Sprint(row.OK), OK: row.OK >= none.OK-slack}}
	if row.Recovery != nil && none.Recovery != nil {
		ok := none.Recovery.never || (!row.Recovery.never && row.Recovery.s <= none.Recovery.s+1e-9)
		out = append(out, Check{Scenario: r.ID, Row: string(row.Policy), What: what + ": recovery ≤ no retries'",
			Want: "≤ " + none.Recovery.String(), Got: row.Recovery.String(), OK: ok})
	}
	return out
}

// wasteCheck checks that at most maxWaste of what row's origin worked was
// for callers who had left.
func wasteCheck(r *Result, row *Row, what string) []Check {
	if row == nil || row.Wasted == nil || row.Worked == 0 {
		return nil
	}
	share := float64(*row.Wasted) / float64(row.Worked)
	return []Check{{Scenario: r.ID, Row: string(row.Policy), What: what + ": worked for callers who had left",
		Want: fmt.Sprintf("≤ %.0f%%", 100*maxWaste), Got: fmt.Sprintf("%d of %d (%.1f%%)", *row.Wasted, row.Worked, 100*share),
		OK: share <= maxWaste+1e-9}}
}

// mixedChecks are the mixed-fleet overload's bounds, for every drop
// length: the control, the mixed fleet without server protection, does
// not recover by itself (else the scenario is not metastable); with the
// suite's server, the mixed fleet and the fleet of grpc-go's clients get
// answers while still waiting for at least minDropGoodput of the reduced
// capacity during the drop, and from maxRecovery99 after it on succeed at
// least min99 of the time every second; and the mixed fleets with the
// suite's server, the suite's clients with and without a per-attempt
// timeout, do no harm.
func mixedChecks(r *Result) []Check {
	var out []Check
	add := func(p policyKey, what, want, got string, ok bool) {
		out = append(out, Check{Scenario: r.ID, Row: string(p), What: what, Want: want, Got: got, OK: ok})
	}
	for _, d := range mixedVariants(r) {
		if c := r.row(mixedControl, d); c != nil && c.Recovery != nil {
			add(mixedControl, fmt.Sprintf("overload-mixed %s: the control stays down (metastable)", d), "never",
				c.Recovery.String(), c.Recovery.never)
		}
		for _, p := range []policyKey{mixedSuite, mixedGRPCSuite} {
			row := r.row(p, d)
			if row == nil {
				continue
			}
			add(p, fmt.Sprintf("overload-mixed %s: goodput in the drop", d), fmt.Sprintf("≥ %.0f%%", 100*minDropGoodput),
				mixedDropStr(row.DropGoodput), row.DropGoodput >= minDropGoodput-1e-9)
			if row.Recovery99 != nil {
				add(p, fmt.Sprintf("overload-mixed %s: back to 99%% after the drop", d), fmt.Sprintf("≤ %.1fs", maxRecovery99),
					row.Recovery99.String(), !row.Recovery99.never && row.Recovery99.s <= maxRecovery99+1e-9)
			}
		}
		none := r.row(noRetries, d)
		out = append(out, noHarmChecks(r, r.row(mixedSuite, d), none, "overload-mixed "+d)...)
		out = append(out, noHarmChecks(r, r.row(mixedSuitePT, d), none, "overload-mixed "+d+", per-try")...)
	}
	return out
}

// mixedVariants returns the variants of r's rows, in order.
func mixedVariants(r *Result) []string {
	var vs []string
	for _, row := range r.Rows {
		if len(vs) == 0 || vs[len(vs)-1] != row.Variant {
			vs = append(vs, row.Variant)
		}
	}
	return vs
}

// metastableChecks are the metastable scenario's bounds on the suite's
// defaults beyond its recovery: in every variant with the trigger (the
// main rows' per-attempt timeout, none, and a short one) they do no harm
// and waste little; with hedging on they recover as fast as without; and
// with the short per-attempt timeout, the suite's client alone recovers
// within maxShortPerTryRecovery.
func metastableChecks(r *Result) []Check {
	var out []Check
	for _, v := range []string{"", noPerTry, shortPerTry} {
		what := "metastable"
		if v != "" {
			what += ", " + v
		}
		row := r.row(suiteDefaults, v)
		out = append(out, noHarmChecks(r, row, r.row(noRetries, v), what)...)
		out = append(out, wasteCheck(r, row, what)...)
		if h := r.row(suiteHedging, v); h != nil && row != nil && h.Recovery != nil && row.Recovery != nil {
			ok := !h.Recovery.never && !row.Recovery.never && math.Abs(h.Recovery.s-row.Recovery.s) <= maxHedgingLag+1e-9
			out = append(out, Check{Scenario: r.ID, Row: string(suiteHedging), What: what + ": recovery with hedging = without",
				Want: fmt.Sprintf("%s ± %.1fs", row.Recovery, maxHedgingLag), Got: h.Recovery.String(), OK: ok})
		}
	}
	if c := r.row(suiteClientOnly, shortPerTry); c != nil && c.Recovery != nil {
		out = append(out, Check{Scenario: r.ID, Row: string(suiteClientOnly), What: "metastable, " + shortPerTry + ": recovery, the suite's client alone",
			Want: fmt.Sprintf("≤ %.1fs", maxShortPerTryRecovery), Got: c.Recovery.String(),
			OK: !c.Recovery.never && c.Recovery.s <= maxShortPerTryRecovery+1e-9})
	}
	return out
}
