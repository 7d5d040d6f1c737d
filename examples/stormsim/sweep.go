package main

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/examples/internal/fleetsim"
)

// The settings -sweep tries: the client budget's ratio and burst (its
// least loan), and the attempts per call.
var (
	sweepRatios   = []float64{0.05, 0.1, 0.2}
	sweepBursts   = []int{1, 5, 20}
	sweepAttempts = []int{2, 3, 5}
)

// runSweep runs the scenario with the suite (client and server) at every
// combination of the swept settings, and prints the table an operator
// chooses from: what each costs the dependency (load) and buys the
// callers (ok %), and the start-up burst it allows.
func runSweep(w io.Writer, cfg fleetsim.Config) error {
	type setting struct {
		ratio    float64
		burst    int
		attempts int
	}
	var settings []setting
	var cfgs []fleetsim.Config
	for _, r := range sweepRatios {
		for _, b := range sweepBursts {
			for _, a := range sweepAttempts {
				settings = append(settings, setting{r, b, a})
				c := cfg
				c.Client = fleetsim.PolicySuiteWith(fleetsim.SuiteOptions{Budget: budget.Config{Ratio: r, Burst: b}, MaxAttempts: a})
				c.Server = fleetsim.PolicySuiteServer()
				cfgs = append(cfgs, c)
			}
		}
	}
	base := cfg
	base.Client = fleetsim.PolicyNone()
	cfgs = append(cfgs, base)
	start := time.Now()
	res, err := fleetsim.RunAll(cfgs)
	if err != nil {
		return err
	}
	none := res[len(res)-1]
	fmt.Fprintf(w, "stormsim -sweep — %s\n%s\n", machine(), describe(cfg))
	fmt.Fprintf(w, "The suite's client (and server) at each budget ratio, burst and attempt limit; the defaults are ratio 0.1, burst 5, 3 attempts. No retries: ok %.1f%%.\n\n", none.Window.OKPercent())
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "ratio\tburst\tattempts\tload\tok %\tload after\tburst/client\tmax retries\trecovery\t")
	for i, s := range settings {
		r := res[i]
		mark := ""
		if s.ratio == budget.DefaultRatio && s.burst == budget.DefaultBurst && s.attempts == 3 {
			mark = " (defaults)"
		}
		fmt.Fprintf(tw, "%g\t%d\t%d%s\t%.3f×\t%.1f\t%.3f×\t%+.2f\t%d\t%s\t\n", s.ratio, s.burst, s.attempts, mark,
			r.Window.Load(), r.Window.OKPercent(), r.After.Load(), r.BurstPerClient, r.MaxRetries, recovery(r))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\n%d runs in %.2fs of wall time.\n", len(cfgs), time.Since(start).Seconds())
	return nil
}
