package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/stormguard/stormguard/examples/internal/fleetsim"
)

// options is what the flags ask for.
type options struct {
	clients  int
	rate     float64
	mix      string
	jitter   float64
	backends int
	workers  int
	queue    int
	capacity float64
	service  time.Duration
	rtt      time.Duration
	failure  string
	p        float64
	factor   float64
	limit    float64
	pushback time.Duration
	from     time.Duration
	length   time.Duration
	seconds  float64
	deadline time.Duration
	settle   time.Duration
	rows     string
	seed     uint64
	json     bool
	csv      string
	svg      string
	sweep    bool
	grid     bool
	memory   bool
	lab      bool
	cpuprof  string
}

func main() {
	// The clients' state is most of the heap and lives for the whole run:
	// collect less often than the default while it is built.
	debug.SetGCPercent(400)
	o, err := parseFlags(os.Args[1:], os.Stderr)
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "stormsim:", err)
		}
		os.Exit(2)
	}
	if o.cpuprof != "" {
		f, err := os.Create(o.cpuprof)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "stormsim:", err)
			os.Exit(2)
		}
		defer pprof.StopCPUProfile()
	}
	if err := run(o, os.Stdout); err != nil {
		pprof.StopCPUProfile()
		fmt.Fprintln(os.Stderr, "stormsim:", err)
		os.Exit(2)
	}
}

func parseFlags(args []string, errOut io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("stormsim", flag.ContinueOnError)
	fs.SetOutput(errOut)
	fs.IntVar(&o.clients, "clients", 1000, "clients in the fleet (1 to 1,000,000), each with its own policy state")
	fs.Float64Var(&o.rate, "rate", 1, "calls per second per client (0.01 to 1,000), open loop")
	fs.StringVar(&o.mix, "mix", "", "a fleet of groups instead of -clients and -rate: NxR,NxR,... (e.g. 10x50,5000x0.1)")
	fs.Float64Var(&o.jitter, "jitter", 1, "each call is due at a random share in [0, jitter) of its client's period after its slot (0: strictly periodic, as the storm lab's fleet)")
	fs.IntVar(&o.backends, "backends", 3, "backends behind the target (M)")
	fs.IntVar(&o.workers, "workers", 0, "workers per backend (0: enough for -capacity)")
	fs.IntVar(&o.queue, "queue", 0, "queue per backend, full: UNAVAILABLE at once (0: 32 per worker)")
	fs.Float64Var(&o.capacity, "capacity", 2.4, "with -workers 0: the target serves this many times the fleet's calls a second")
	fs.DurationVar(&o.service, "service", 10*time.Millisecond, "service time of a request (±25%)")
	fs.DurationVar(&o.rtt, "rtt", time.Millisecond, "network round trip (±50%)")
	fs.StringVar(&o.failure, "failure", "independent", "failure mode: healthy, independent, backend-dead, outage, capacity-drop, latency-tail, throttling")
	fs.Float64Var(&o.p, "p", 0.5, "independent: the probability an attempt fails; latency-tail: the share of slow requests")
	fs.Float64Var(&o.factor, "factor", 0, "capacity-drop: service time multiplier (default 5); latency-tail: slow requests' multiplier (default 20)")
	fs.Float64Var(&o.limit, "limit", 200, "throttling: requests per second each backend serves")
	fs.DurationVar(&o.pushback, "pushback", 500*time.Millisecond, "throttling: the grpc-retry-pushback-ms of a throttled attempt")
	fs.DurationVar(&o.from, "from", 10*time.Second, "when the failure starts")
	fs.DurationVar(&o.length, "for", 30*time.Second, "how long the failure lasts")
	fs.Float64Var(&o.seconds, "seconds", 60, "simulated seconds of calls")
	fs.DurationVar(&o.deadline, "deadline", 2*time.Second, "every call's deadline")
	fs.DurationVar(&o.settle, "settle", fleetsim.DefaultSettle, "the failure's first part, left out of the 'after' figures")
	fs.StringVar(&o.rows, "rows", "default", "rows, comma-separated: none, grpc, grpc-throttle, aws, aws-2026, envoy, finagle, sre, suite, suite-client, grpc-suiteserver; grid (the rivals and suite); default (grid and grpc-suiteserver); all")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of the run's random choices")
	fs.BoolVar(&o.json, "json", false, "print the results as JSON (series included) instead of tables")
	fs.StringVar(&o.csv, "csv", "", "also write the table as CSV to this `file`")
	fs.StringVar(&o.svg, "svg", "", "also draw the load and goodput over time per row to this SVG `file`")
	fs.BoolVar(&o.sweep, "sweep", false, "sweep the suite's settings (budget ratio, burst, attempts) on this scenario")
	fs.BoolVar(&o.grid, "grid", false, "run the README's grid (failure modes × fleet shapes, every rival against the suite) and print it with its verdicts")
	fs.BoolVar(&o.memory, "memory", false, "measure each policy's state memory per client")
	fs.BoolVar(&o.lab, "lab", false, "run the cells the model shares with the storm lab and print the model's figures beside the lab's")
	fs.StringVar(&o.cpuprof, "cpuprofile", "", "write a CPU profile of the run to this `file`")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: go run ./examples/stormsim [flags]\n\n"+
			"Simulates a fleet of clients calling one target on a virtual clock, with every\n"+
			"retry policy side by side; the suite's budget, breaker and server (admission,\n"+
			"queue, retry budget) are the library's code.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	return o, nil
}

// config builds the run's configuration (no policy yet) from the flags.
func (o options) config() (fleetsim.Config, error) {
	mode, err := fleetsim.ParseMode(o.failure)
	if err != nil {
		return fleetsim.Config{}, err
	}
	groups := []fleetsim.Group{{Clients: o.clients, Rate: o.rate, Jitter: o.jitter}}
	if o.mix != "" {
		if groups, err = parseMix(o.mix, o.jitter); err != nil {
			return fleetsim.Config{}, err
		}
	}
	factor := o.factor
	if factor == 0 {
		factor = map[fleetsim.Mode]float64{fleetsim.CapacityDrop: 5, fleetsim.LatencyTail: 20}[mode]
	}
	cfg := fleetsim.Config{
		Groups:   groups,
		Backends: fleetsim.Backends{M: o.backends, Workers: o.workers, Queue: o.queue, Service: o.service, RTT: o.rtt},
		Failure: fleetsim.Failure{Mode: mode, P: o.p, Factor: factor, Limit: o.limit, Pushback: o.pushback,
			Start: o.from, End: o.from + o.length},
		Duration: time.Duration(o.seconds * float64(time.Second)),
		Deadline: o.deadline, Settle: o.settle, Seed: o.seed,
	}
	if cfg.Backends.Workers == 0 {
		// Enough workers for capacity × the fleet's calls a second.
		perBackend := o.capacity * cfg.Rate() * o.service.Seconds() / float64(max(o.backends, 1))
		cfg.Backends.Workers = max(1, int(math.Ceil(perBackend)))
	}
	if cfg.Backends.Queue == 0 {
		cfg.Backends.Queue = 32 * cfg.Backends.Workers
	}
	cfg.Client = fleetsim.PolicyNone()
	return cfg, cfg.Validate()
}

// parseMix parses -mix: groups NxR, comma-separated.
func parseMix(s string, jitter float64) ([]fleetsim.Group, error) {
	var gs []fleetsim.Group
	for _, part := range strings.Split(s, ",") {
		n, r, ok := strings.Cut(strings.TrimSpace(part), "x")
		clients, err1 := strconv.Atoi(strings.ReplaceAll(n, "_", ""))
		rate, err2 := strconv.ParseFloat(r, 64)
		if !ok || err1 != nil || err2 != nil {
			return nil, fmt.Errorf("-mix: %q is not clients x rate (e.g. 5000x0.1)", part)
		}
		gs = append(gs, fleetsim.Group{Clients: clients, Rate: rate, Jitter: jitter})
	}
	return gs, nil
}

// run does what the options ask and prints it to w.
func run(o options, w io.Writer) error {
	switch {
	case o.memory:
		return runMemory(w)
	case o.lab:
		return runLab(w)
	case o.grid:
		return runGrid(w, o)
	}
	cfg, err := o.config()
	if err != nil {
		return err
	}
	if o.sweep {
		return runSweep(w, cfg)
	}
	rows, err := fleetsim.SelectRows(o.rows)
	if err != nil {
		return err
	}
	start := time.Now()
	res, err := fleetsim.RunRows(cfg, rows)
	if err != nil {
		return err
	}
	rep := newReport(cfg, res, time.Since(start))
	if o.json {
		err = rep.writeJSON(w)
	} else {
		rep.writeText(w)
	}
	if err == nil && o.csv != "" {
		err = writeFile(o.csv, rep.writeCSV)
	}
	if err == nil && o.svg != "" {
		err = writeFile(o.svg, rep.writeSVG)
	}
	return err
}

// writeFile writes what write writes to path.
func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// machine describes this machine for the reports.
func machine() string {
	return fmt.Sprintf("%s %s/%s, %d CPUs (GOMAXPROCS %d)", runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.GOMAXPROCS(0))
}
