package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"time"
)

// labTimeout bounds a whole run.
const labTimeout = 15 * time.Minute

// config is what the flags ask for.
type config struct {
	scenarios string // -scenario
	quick     bool
	svg       string
	goodput   string // -goodput-svg
	json      bool
	// tailP99 is the long-tail bound (loosened by the tests under -race).
	tailP99 time.Duration
	// fleet is the fleet scenario's shape (-fleet-*; the zero shape: its
	// defaults).
	fleet fleetShape
}

func main() {
	var (
		cfg          config
		fleetSeconds float64
		fleetP       string
	)
	flag.StringVar(&cfg.scenarios, "scenario", "", "run only these scenarios, by number or name, comma-separated (e.g. 1,4 or outage,chain)")
	flag.BoolVar(&cfg.quick, "quick", false, "run the quick subset (scenarios 1, 2, 3, 4, 7 and 9) in a few seconds, as CI does")
	flag.StringVar(&cfg.svg, "svg", "", "also write a bar chart of the amplification per policy and scenario to this SVG `file`")
	flag.StringVar(&cfg.goodput, "goodput-svg", "", "also write the goodput over time of the metastable scenario's rows to this SVG `file`")
	flag.BoolVar(&cfg.json, "json", false, "print the results as JSON instead of tables")
	flag.IntVar(&cfg.fleet.clients, "fleet-clients", defaultFleet.clients, "fleet scenario: clients, each with its own ClientConn and Client")
	flag.Float64Var(&cfg.fleet.rate, "fleet-rate", defaultFleet.rate, "fleet scenario: calls per second per client")
	flag.Float64Var(&fleetSeconds, "fleet-seconds", defaultFleet.failure.Seconds(), "fleet scenario: seconds of failure (more than the first 5 s it allows for start-up)")
	flag.DurationVar(&cfg.fleet.warmup, "fleet-warmup", defaultFleet.warmup, "fleet scenario: healthy time before the failure (0: a cold fleet)")
	flag.StringVar(&fleetP, "fleet-p", joinFloats(defaultFleet.ps), "fleet scenario: failure probabilities per attempt, comma-separated")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "Usage: go run ./examples/stormlab [flags]\n\n"+
			"Reruns published retry-storm scenarios with real gRPC servers and clients on\n"+
			"127.0.0.1, one table per scenario, one row per client policy, and checks the suite's bounds\n"+
			"(exit status 1 when one is missed).\n\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() > 0 {
		flag.Usage()
		os.Exit(2)
	}
	cfg.tailP99 = maxTailP99
	cfg.fleet.failure = time.Duration(fleetSeconds * float64(time.Second))
	cfg.fleet.settle = defaultFleet.settle
	var err error
	if cfg.fleet.ps, err = parseProbabilities(fleetP); err != nil {
		fmt.Fprintln(os.Stderr, "stormlab:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	rep, err := run(ctx, cfg, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "stormlab:", err)
		os.Exit(2)
	}
	if !rep.OK {
		os.Exit(1)
	}
}

// run runs the scenarios cfg selects, prints them to w (tables, or JSON),
// writes the chart, and returns the report. An error means the lab could
// not run; missed bounds are in the report.
func run(ctx context.Context, cfg config, w io.Writer) (*Report, error) {
	selected, err := selectScenarios(cfg.scenarios, cfg.quick)
	if err != nil {
		return nil, err
	}
	if cfg.goodput != "" && !slices.ContainsFunc(selected, func(s scenario) bool { return s.key == "metastable" }) {
		return nil, fmt.Errorf("-goodput-svg draws the metastable scenario, which is not selected")
	}
	if slices.ContainsFunc(selected, func(s scenario) bool { return s.key == "fleet" }) {
		if err := cfg.fleet.orDefault().validate(); err != nil { // before the other scenarios run
			return nil, err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, labTimeout)
	defer cancel()
	start := time.Now()
	rep := &Report{Machine: thisMachine(), Settings: settings()}
	text := io.Discard
	if !cfg.json {
		text = w
	}
	fmt.Fprintf(text, "stormlab — %s\n%s\n", rep.Machine, rep.Settings)
	var results []*Result
	for _, s := range selected {
		if s.key == "fleet" {
			s.run = func(ctx context.Context) (*Result, error) { return fleetWith(ctx, cfg.fleet) }
		}
		t := time.Now()
		res, err := s.run(ctx)
		if err != nil {
			return nil, err
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("scenario %d: %w", s.id, ctx.Err())
		}
		res.Seconds = time.Since(t).Seconds()
		printTable(text, res)
		results = append(results, res)
	}
	rep.Checks = checkBounds(results, cfg.tailP99)
	rep.OK = true
	for _, c := range rep.Checks {
		rep.OK = rep.OK && c.OK
	}
	for _, r := range results {
		rep.Results = append(rep.Results, *r)
	}
	rep.Seconds = time.Since(start).Seconds()
	printChecks(text, rep)
	if cfg.svg != "" {
		if err := writeSVGFile(cfg.svg, rep); err != nil {
			return nil, err
		}
		fmt.Fprintf(text, "chart written to %s\n", cfg.svg)
	}
	if cfg.goodput != "" {
		if err := writeGoodputSVGFile(cfg.goodput, rep); err != nil {
			return nil, err
		}
		fmt.Fprintf(text, "goodput chart written to %s\n", cfg.goodput)
	}
	if cfg.json {
		if err := writeJSON(w, rep); err != nil {
			return nil, err
		}
	}
	return rep, nil
}

func printChecks(w io.Writer, rep *Report) {
	if len(rep.Checks) > 0 {
		fmt.Fprintln(w, "\nbounds")
	}
	for _, c := range rep.Checks {
		mark := "ok  "
		if !c.OK {
			mark = "MISS"
		}
		fmt.Fprintf(w, "  %s  %d. %-50s %-7s want %-8s got %s\n", mark, c.Scenario, c.What, "("+c.Row+")", c.Want, c.Got)
	}
	verdict := "all bounds met"
	if !rep.OK {
		verdict = "BOUNDS MISSED"
	}
	if len(rep.Checks) == 0 {
		verdict = "no bounds apply to these scenarios"
	}
	fmt.Fprintf(w, "\n%s; %d scenario(s) in %.1fs\n", verdict, len(rep.Results), rep.Seconds)
}

// Machine says where the lab ran.
type Machine struct {
	Go         string `json:"go"`
	OS         string `json:"os"`
	Arch       string `json:"arch"`
	CPUs       int    `json:"cpus"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	Load       string `json:"load,omitempty"` // 1, 5, 15 min load averages at start (Linux)
}

func thisMachine() Machine {
	m := Machine{Go: runtime.Version(), OS: runtime.GOOS, Arch: runtime.GOARCH, CPUs: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0)}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) >= 3 {
			m.Load = strings.Join(f[:3], " ")
		}
	}
	return m
}

// String describes the machine in one line: Go version, OS and
// architecture, CPUs and, where known, the load average.
func (m Machine) String() string {
	s := fmt.Sprintf("%s %s/%s, %d CPUs (GOMAXPROCS %d)", m.Go, m.OS, m.Arch, m.CPUs, m.GOMAXPROCS)
	if m.Load != "" {
		s += ", load average " + m.Load
	}
	return s
}

// settings describes what every row shares.
func settings() string {
	return fmt.Sprintf("Real gRPC servers and clients on 127.0.0.1 in this process; every row gets a fresh origin and fresh clients.\n"+
		"Retrying rows: at most %d attempts, retry on UNAVAILABLE, backoff %v doubling to %v "+
		"(stormguard: jitter in [d/2, d]; grpc-go: d×[0.8, 1.2]);\n"+
		"grpc-go rows use its service-config retryPolicy (+ retryThrottling maxTokens 10, tokenRatio 0.1); "+
		"the suite's rows use its client and server interceptors.",
		maxAttempts, backoffBase, backoffMax)
}
