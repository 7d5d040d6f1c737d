package fleetsim

import (
	"cmp"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
)

// Row is one setup of a comparison: a client policy against a server
// policy (nil: plain servers).
type Row struct {
	Key, Name string
	Client    *ClientPolicy
	Server    *ServerPolicy
}

// The suite's rows besides its defaults: its client against plain
// servers, and grpc-go's retryPolicy clients against its server.
const (
	KeySuite           = "suite"
	KeySuiteClientOnly = "suite-client"
	KeyGRPCSuiteServer = "grpc-suiteserver"
)

// Rows returns every row, in table order: the rivals, then the suite's
// defaults (client and server), its client alone, and grpc-go's clients
// behind its server.
func Rows() []Row {
	var rows []Row
	for _, p := range Rivals() {
		rows = append(rows, Row{Key: p.Key, Name: p.Name, Client: p})
	}
	return append(rows,
		Row{Key: KeySuite, Name: "stormguard defaults", Client: PolicySuite(), Server: PolicySuiteServer()},
		Row{Key: KeySuiteClientOnly, Name: "stormguard client, plain server", Client: PolicySuite()},
		Row{Key: KeyGRPCSuiteServer, Name: "grpc-go retryPolicy, stormguard server", Client: PolicyGRPC(), Server: PolicySuiteServer()},
	)
}

// SelectRows returns the rows named by keys (comma-separated; "all": all
// of them; "grid": the rivals and the suite's defaults; "" or "default":
// those and grpc-go's clients behind the suite's server).
func SelectRows(keys string) ([]Row, error) {
	all := Rows()
	switch keys {
	case "all":
		return all, nil
	case "grid":
		return all[:len(Rivals())+1], nil
	case "", "default":
		return append(all[:len(Rivals())+1:len(Rivals())+1], all[len(Rivals())+2]), nil
	}
	var out []Row
	for _, k := range strings.Split(keys, ",") {
		k = strings.TrimSpace(k)
		found := false
		for _, r := range all {
			if r.Key == k {
				out, found = append(out, r), true
			}
		}
		if !found {
			var names []string
			for _, r := range all {
				names = append(names, r.Key)
			}
			return nil, fmt.Errorf("unknown row %q (want some of %s)", k, strings.Join(names, ","))
		}
	}
	return out, nil
}

// RunRows runs cfg once per row, as many side by side as the machine has
// cores (each run is one goroutine and deterministic), and returns the
// results in the rows' order.
func RunRows(cfg Config, rows []Row) ([]*Result, error) {
	jobs := make([]Config, len(rows))
	for i, r := range rows {
		jobs[i] = cfg
		jobs[i].Client, jobs[i].Server = r.Client, r.Server
	}
	res, err := RunAll(jobs)
	for i, r := range res {
		if r != nil {
			r.Policy, r.Name = rows[i].Key, rows[i].Name
		}
	}
	return res, err
}

// RunAll runs the configurations, GOMAXPROCS at a time, the dearest first
// (so that the last to finish is not a long one started late), and
// returns their results in order (and the first error).
func RunAll(cfgs []Config) ([]*Result, error) {
	out := make([]*Result, len(cfgs))
	errs := make([]error, len(cfgs))
	order := make([]int, len(cfgs))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(cost(&cfgs[b]), cost(&cfgs[a])) })
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	var wg sync.WaitGroup
	for _, i := range order {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			out[i], errs[i] = Run(cfgs[i])
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// cost estimates a run's work: its calls, the suite's client counted four
// times (its budget and breaker cost most of a call's time in a large
// fleet).
func cost(c *Config) float64 {
	w := 1.0
	if c.Client != nil && c.Client.Key == "suite" {
		w = 4
	}
	calls := c.Rate() * c.Duration.Seconds()
	for _, g := range c.Groups {
		if g.Workers > 0 {
			calls += float64(g.Clients * g.Calls)
		}
	}
	return w * calls
}
