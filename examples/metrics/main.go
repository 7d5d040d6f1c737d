package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/stormguard/stormguard/interceptor"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := realMain(ctx, os.Stdout, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "metrics:", err)
		os.Exit(1)
	}
}

// realMain runs the example with the command-line arguments args: the
// traffic, its report on out, then /metrics until ctx is done (unless
// -exit).
func realMain(ctx context.Context, out io.Writer, args []string) error {
	fs := flag.NewFlagSet("metrics", flag.ContinueOnError)
	fs.SetOutput(out)
	listen := fs.String("listen", DefaultListen, "where to serve /metrics (host:port; port 0 picks a free one)")
	realtime := fs.Bool("realtime", false, "run the client on the wall clock, one tick every 10ms (about 24 s), instead of the simulated clock")
	exit := fs.Bool("exit", false, "exit when the traffic is done instead of serving /metrics until interrupted")
	seed := fs.Uint64("seed", 1, "seed of the breakers' jitter on the simulated clock")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listening for /metrics: %w", err)
	}
	d, err := Start(Config{Listener: ln, Realtime: *realtime, Seed: *seed})
	if err != nil {
		_ = ln.Close()
		return err
	}
	defer d.Close()
	orders, search := d.Targets()
	clock := "a simulated clock, 10ms per tick"
	if *realtime {
		clock = "the wall clock, one tick every 10ms"
	}
	fmt.Fprintf(out, "metrics: serving http://%s/metrics\n", d.MetricsAddr())
	fmt.Fprintf(out, "metrics: %d ticks on %s; orders at %s, search at %s\n", Ticks, clock, orders, search)

	start := time.Now()
	reports, err := d.Run(ctx)
	PrintReports(out, reports)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "metrics: traffic done in %v\n", time.Since(start).Round(time.Millisecond))
	start = time.Now()
	inc, err := d.RunIncidents(ctx)
	PrintIncidents(out, inc)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "metrics: incidents done in %v\n", time.Since(start).Round(time.Millisecond))
	if *exit {
		return nil
	}
	fmt.Fprintf(out, "metrics: serving http://%s/metrics until interrupted\n", d.MetricsAddr())
	<-ctx.Done()
	return nil
}

// PrintReports prints one line per phase and service: calls, how many
// succeeded and failed, the attempts that reached the service, attempts per
// call, and the refusals by reason (interceptor.Hooks.OnRefusal) with the
// ticks of the first and the last; then the changes of the breakers' states,
// one line per method whose breaker changed.
func PrintReports(out io.Writer, reports []PhaseReport) {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "phase\tticks\tservice\tcalls\tok\tfailed\tattempts\tper call\trefusals by reason (ticks)")
	for _, r := range reports {
		for i, s := range []struct {
			name string
			t    Tally
		}{{"orders", r.Orders}, {"search", r.Search}} {
			phase, ticks := "", ""
			if i == 0 {
				phase, ticks = r.Phase.Name, fmt.Sprintf("%d-%d", r.Phase.From, r.Phase.To-1)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%.2f\t%s\n", phase, ticks, s.name,
				s.t.Calls, s.t.OK, s.t.Failed, s.t.Attempts, float64(s.t.Attempts)/float64(max(s.t.Calls, 1)), refusalsString(s.t.Refusals))
		}
	}
	_ = tw.Flush()
	for _, service := range []string{"orders", "search"} {
		var methods []string // in the order their breakers first changed
		parts := map[string][]string{}
		for _, r := range reports {
			for _, c := range r.Breakers {
				if c.Service != service {
					continue
				}
				if _, ok := parts[c.Method]; !ok {
					methods = append(methods, c.Method)
				}
				parts[c.Method] = append(parts[c.Method], fmt.Sprintf("%d %s", c.Tick, c.To))
			}
		}
		if len(methods) == 0 {
			fmt.Fprintf(out, "%s breakers: closed throughout\n", service)
		}
		for _, m := range methods {
			fmt.Fprintf(out, "%s %s breaker (tick state): %s\n", service, m, strings.Join(parts[m], ", "))
		}
	}
}

// refusalsString lists refusals by reason, in the order they began.
func refusalsString(m map[interceptor.Reason]Seen) string {
	reasons := slices.Collect(maps.Keys(m))
	slices.SortFunc(reasons, func(a, b interceptor.Reason) int {
		return cmp.Or(cmp.Compare(m[a].First, m[b].First), cmp.Compare(a, b))
	})
	var parts []string
	for _, r := range reasons {
		s := m[r]
		parts = append(parts, fmt.Sprintf("%s %d (%d-%d)", r, s.N, s.First, s.Last))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}
