package main

import (
	"fmt"
	"time"
)

// Check is one bound a row must meet, and whether the run met it.
type Check struct {
	Scenario int    `json:"scenario"`
	Row      string `json:"row"`
	What     string `json:"what"`
	Want     string `json:"want"`
	Got      string `json:"got"`
	OK       bool   `json:"ok"`
}

// The bounds of the suite's default row, and the articles' numbers the
// naive row must reproduce (a check that the lab's model still works).
const (
	maxOutageAmpl   = 1.05
	maxChainOrigin  = 12
	naiveOutage     = 150  // 3.00× of 50
	naiveChain      = 810  // 81.00× of 10
	naiveChain4     = 2430 // 243.00× of 10
	maxCapacityPeak = 1000
	capacityServed  = 15900
	naiveCapPeak    = 2300
	maxTailP99      = 50 * time.Millisecond
	maxTailLoad     = 1.10
	// Partial failures: independent failures, and one backend of N dead.
	maxIndependentLoad = 1.10
	// At p = 0.5 the suite's ratio of 10% must rescue what it pays for:
	// at least 54% of the calls succeed (no retries: 50%).
	minIndependentOKAt05 = 54.0
	minDeadOKPct         = 97.0 // the suite's defaults
	maxDeadRatio         = 1.10 // requests at the dead backend ÷ no retries'
	minOutlierOKPct      = 99.0 // the suite with the outlier policy
	maxOutlierLoad       = 1.10
	// The metastable scenario: the suite's defaults are back to
	// full goodput within 2 s of the trigger's end, the naive row takes
	// at least five times as long (at least 5 steps when the suite takes
	// none) or never recovers, and the suite's server refuses nothing
	// when there is no trigger.
	maxRecovery      = 2.0
	naiveRecoveryX   = 5.0
	maxFalseRefusals = 0
	// With hedging on, the suite's defaults recover as fast as without
	// it, within maxHedgingLag; with a short per-attempt timeout the
	// suite's client alone (a plain server) within maxShortPerTryRecovery.
	maxHedgingLag          = 0.1
	maxShortPerTryRecovery = 0.5
	// A fleet of quiet clients, each with its own Client: the fleet's
	// attempts at most 1.10× its calls once the failure's first seconds
	// are past, and over the whole failure at most that plus a start-up
	// burst of fleetBurst retries per client; where grpc-go's
	// retryThrottling sends no more than the suite, the suite's ok% is at
	// least its ok% less fleetThrottleSlack points.
	maxFleetLoad       = 1.10
	fleetBurst         = 5
	fleetThrottleSlack = 0.5
)

// checkBounds returns the checks that apply to the scenarios in results.
func checkBounds(results []*Result, tailP99 time.Duration) []Check {
	var out []Check
	add := func(r *Result, p policyKey, what, want string, got string, ok bool) {
		out = append(out, Check{Scenario: r.ID, Row: string(p), What: what, Want: want, Got: got, OK: ok})
	}
	for _, r := range results {
		suite, naiveRow := r.row(suiteDefaults, ""), r.row(naive, "")
		switch r.Key {
		case "outage":
			if suite := r.row(suiteDefaults, "wave 1"); suite != nil {
				add(r, suiteDefaults, "outage amplification", fmt.Sprintf("≤ %.2f×", maxOutageAmpl),
					fmt.Sprintf("%.2f×", suite.Amplification), suite.Amplification <= maxOutageAmpl+1e-9)
			}
			if suite := r.row(suiteDefaults, "wave 2"); suite != nil {
				add(r, suiteDefaults, "outage: second wave's origin requests", "0",
					fmt.Sprint(suite.Origin), suite.Origin == 0)
			}
			if naiveRow := r.row(naive, "wave 1"); naiveRow != nil {
				add(r, naive, "outage origin requests (3.00×)", fmt.Sprint(naiveOutage),
					fmt.Sprint(naiveRow.Origin), naiveRow.Origin == naiveOutage)
			}
			// Shadow mode refuses nothing (it sends what the naive row
			// sends) and records every attempt of the second wave, which
			// the defaults do not send, as one it would have refused.
			if shadow := r.row(suiteShadow, "wave 1"); shadow != nil {
				add(r, suiteShadow, "outage, shadow mode: origin requests (nothing refused)", fmt.Sprint(naiveOutage),
					fmt.Sprint(shadow.Origin), shadow.Origin == naiveOutage)
			}
			if shadow := r.row(suiteShadow, "wave 2"); shadow != nil {
				would := 0
				for _, n := range shadow.WouldRefuse {
					would += n
				}
				add(r, suiteShadow, "outage, shadow mode: second wave's attempts it would refuse", fmt.Sprint(shadow.Origin),
					fmt.Sprint(would), would == shadow.Origin && would > 0)
			}
		case "twice":
			// Only third attempts succeed: in its first instants this is
			// an outage, and the suite's defaults are bound as in one.
			if suite != nil {
				add(r, suiteDefaults, "fails twice amplification", fmt.Sprintf("≤ %.2f×", maxOutageAmpl),
					fmt.Sprintf("%.2f×", suite.Amplification), suite.Amplification <= maxOutageAmpl+1e-9)
			}
		case "flaky":
			if suite != nil {
				add(r, suiteDefaults, "flaky callers ok", fmt.Sprintf("%d/%d", suite.Calls, suite.Calls),
					fmt.Sprintf("%d/%d", suite.OK, suite.Calls), suite.OK == suite.Calls)
			}
		case "chain":
			for _, depth := range []string{"depth 3", "depth 4"} {
				if suite := r.row(suiteDefaults, depth); suite != nil {
					add(r, suiteDefaults, "chain origin requests for 10 callers, "+depth, fmt.Sprintf("≤ %d", maxChainOrigin),
						fmt.Sprint(suite.Origin), suite.Origin <= maxChainOrigin)
				}
			}
			if naiveRow := r.row(naive, "depth 3"); naiveRow != nil {
				add(r, naive, "chain origin requests (81.00×), depth 3", fmt.Sprint(naiveChain),
					fmt.Sprint(naiveRow.Origin), naiveRow.Origin == naiveChain)
			}
			if naiveRow := r.row(naive, "depth 4"); naiveRow != nil {
				add(r, naive, "chain origin requests (243.00×), depth 4", fmt.Sprint(naiveChain4),
					fmt.Sprint(naiveRow.Origin), naiveRow.Origin == naiveChain4)
			}
		case "capacity":
			if suite != nil {
				add(r, suiteDefaults, "capacity-drop peak attempts per tick", fmt.Sprintf("≤ %d", maxCapacityPeak),
					fmt.Sprint(suite.Peak), suite.Peak <= maxCapacityPeak)
				add(r, suiteDefaults, "capacity-drop requests served", fmt.Sprint(capacityServed),
					fmt.Sprint(suite.Served), suite.Served == capacityServed)
			}
			if naiveRow != nil {
				add(r, naive, "capacity-drop peak without budget (article: 2,300)", fmt.Sprint(naiveCapPeak),
					fmt.Sprint(naiveRow.Peak), naiveRow.Peak == naiveCapPeak)
			}
		case "independent":
			for _, row := range r.Rows {
				if row.Policy != suiteDefaults {
					continue
				}
				// Every rate the lab runs is held to the same rule:
				// no fewer successes than no retries.
				if none := r.row(noRetries, row.Variant); none != nil {
					add(r, suiteDefaults, fmt.Sprintf("independent %s: success ≥ no retries", row.Variant), fmt.Sprintf("≥ %d", none.OK),
						fmt.Sprint(row.OK), row.OK >= none.OK)
				}
				add(r, suiteDefaults, fmt.Sprintf("independent %s: load", row.Variant), fmt.Sprintf("≤ %.2f×", maxIndependentLoad),
					fmt.Sprintf("%.2f×", row.Amplification), row.Amplification <= maxIndependentLoad+1e-9)
				if row.Variant == "p=0.5" {
					add(r, suiteDefaults, "independent p=0.5: ok", fmt.Sprintf("≥ %.0f%%", minIndependentOKAt05),
						fmt.Sprintf("%.1f%%", row.okPercent()), row.okPercent() >= minIndependentOKAt05)
				}
			}
		case "backend-dead":
			for _, row := range r.Rows {
				switch row.Policy {
				case suiteDefaults:
					add(r, suiteDefaults, fmt.Sprintf("backend dead, %s: ok", row.Variant), fmt.Sprintf("≥ %.0f%%", minDeadOKPct),
						fmt.Sprintf("%.1f%%", row.okPercent()), row.okPercent() >= minDeadOKPct)
					got := fmt.Sprintf("%.2f×", row.DeadRatio)
					if none := r.row(noRetries, row.Variant); none != nil {
						got = fmt.Sprintf("%d ÷ %d = %.3f×", row.Dead, none.Dead, row.DeadRatio)
					}
					add(r, suiteDefaults, fmt.Sprintf("backend dead, %s: dead backend ÷ no retries", row.Variant), fmt.Sprintf("≤ %.2f×", maxDeadRatio),
						got, row.DeadRatio <= maxDeadRatio+1e-9)
				case suiteOutlier:
					add(r, suiteOutlier, fmt.Sprintf("backend dead, %s: ok", row.Variant), fmt.Sprintf("≥ %.0f%%", minOutlierOKPct),
						fmt.Sprintf("%.1f%%", row.okPercent()), row.okPercent() >= minOutlierOKPct)
					add(r, suiteOutlier, fmt.Sprintf("backend dead, %s: load", row.Variant), fmt.Sprintf("≤ %.2f×", maxOutlierLoad),
						fmt.Sprintf("%.2f×", row.Amplification), row.Amplification <= maxOutlierLoad+1e-9)
				}
			}
		case "blip":
			for _, p := range []policyKey{suiteDefaults, suiteClientOnly} {
				if row := r.row(p, ""); row != nil && row.Recovery != nil {
					add(r, p, "blip: recovery after the overload", fmt.Sprintf("≤ %.1fs", maxBlipRecovery),
						row.Recovery.String(), !row.Recovery.never && row.Recovery.s <= maxBlipRecovery+1e-9)
				}
			}
			none := r.row(noRetries, "")
			out = append(out, noHarmChecks(r, suite, none, "blip")...)
			out = append(out, noHarmChecks(r, r.row(suiteDefaults, blipPerTryVariant), none, "blip, "+blipPerTryVariant)...)
		case "overload-mixed":
			out = append(out, mixedChecks(r)...)
		case "metastable":
			if suite != nil && suite.Recovery != nil {
				add(r, suiteDefaults, "metastable: recovery after the trigger", fmt.Sprintf("≤ %.1fs", maxRecovery),
					suite.Recovery.String(), !suite.Recovery.never && suite.Recovery.s <= maxRecovery+1e-9)
				if naiveRow != nil && naiveRow.Recovery != nil {
					floor := naiveRecoveryX * max(suite.Recovery.s, msStep.Seconds())
					add(r, naive, "metastable: recovery, ≥ 5× the suite's or never", fmt.Sprintf("≥ %.2fs", floor),
						naiveRow.Recovery.String(), naiveRow.Recovery.never || naiveRow.Recovery.s >= floor-1e-9)
				}
			}
			out = append(out, metastableChecks(r)...)
			// Without the trigger every refusal is a false one, in
			// every row whose servers protect themselves.
			for _, quiet := range r.Rows {
				if quiet.Variant != noTrigger || quiet.Policy == noRetries {
					continue
				}
				n := 0
				for _, v := range quiet.ServerRefused {
					n += v
				}
				add(r, quiet.Policy, "metastable: refusals without the trigger", fmt.Sprint(maxFalseRefusals),
					fmt.Sprint(n), n <= maxFalseRefusals)
			}
		case "fleet":
			out = append(out, fleetChecks(r)...)
		case "priority":
			out = append(out, priorityChecks(r)...)
		case "tail":
			if suite != nil {
				got := time.Duration(suite.P99ms * float64(time.Millisecond))
				add(r, suiteDefaults, "long-tail p99", fmt.Sprintf("≤ %v", tailP99), ms(suite.P99ms), got <= tailP99)
				add(r, suiteDefaults, "long-tail load", fmt.Sprintf("≤ %.2f×", maxTailLoad),
					fmt.Sprintf("%.2f×", suite.Amplification), suite.Amplification <= maxTailLoad+1e-9)
			}
			if hedged, none := r.row(suiteDefaults, tailScaleVariant), r.row(suiteNoHedging, tailScaleVariant); hedged != nil && none != nil && hedged.P999ms > 0 {
				cut := none.P999ms / hedged.P999ms
				add(r, suiteDefaults, "long tail "+tailScaleVariant+": p99.9 cut by hedging", fmt.Sprintf("≥ %.0f×", minTailCut),
					fmt.Sprintf("%s ÷ %s = %.1f×", ms(none.P999ms), ms(hedged.P999ms), cut), cut >= minTailCut)
				add(r, suiteDefaults, "long tail "+tailScaleVariant+": load", fmt.Sprintf("≤ %.2f×", maxTailScaleLoad),
					fmt.Sprintf("%.3f×", hedged.Amplification), hedged.Amplification <= maxTailScaleLoad+1e-9)
			}
		}
	}
	return out
}
