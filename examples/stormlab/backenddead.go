package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
	"github.com/stormguard/stormguard/outlier"
)

// The workload of scenario 9, the same for every row.
const (
	deadCalls    = 2000
	deadWorkers  = 8
	deadDeadline = 2 * time.Second
)

// The extra rows of scenario 9: the suite's interceptors, as
// suiteDefaults, with the outlier policy instead of plain round_robin; and
// the suite's defaults installed by hand (Unary and Stream, beside
// grpc.WithResolvers), where the suite's rows are installed with
// DialOptions, which reads the endpoints the resolver gives.
const (
	suiteOutlier policyKey = "suite-outlier"
	suiteByHand  policyKey = "suite-by-hand"
)

// deadPolicies are scenario 9's rows: every policy, then the suite with
// the outlier policy, then the suite installed by hand.
func deadPolicies() []policy {
	return append(policies(), policy{suiteOutlier, "stormguard + outlier"}, policy{suiteByHand, "stormguard defaults, by hand"})
}

// Scenario 9: one backend of N answers UNAVAILABLE to
// everything, behind grpc-go's round_robin.
func backendDead(ctx context.Context) (*Result, error) {
	res := &Result{
		ID: 9, Key: "backend-dead", Title: "One backend of N dead",
		Setup: fmt.Sprintf("%d requests from %d concurrent workers, %v deadline each, through grpc-go's round_robin over N origins "+
			"on 127.0.0.1 (a manual resolver); the first origin answers UNAVAILABLE to everything (its transport is up). "+
			"load = requests at all origins ÷ calls; dead = requests the dead origin got, and that ÷ the no-retries row's. "+
			"The last row is the suite's defaults with the outlier policy (outlier.ServiceConfig(outlier.Config{})) instead of round_robin.",
			deadCalls, deadWorkers, deadDeadline),
		cols:  []col{colVariant, colPolicy, colCalls, colOrigin, colAmpl, colOKPct, colDead, colDeadRel, colErrors, colRefused},
		chart: "9 backend dead\n%s",
	}
	for _, n := range []int{2, 3} {
		variant := fmt.Sprintf("1 of %d", n)
		var base *Row
		for _, p := range deadPolicies() {
			row, lastDead, err := deadRow(ctx, p, n)
			if err != nil {
				return nil, fmt.Errorf("%s, %s, %s: %w", res.Title, variant, p.name, err)
			}
			row.Variant = variant
			if p.key == noRetries {
				base = &row
			}
			if base != nil && base.Dead > 0 {
				row.DeadRatio = float64(row.Dead) / float64(base.Dead)
			}
			if p.key == suiteOutlier {
				res.Notes = append(res.Notes, fmt.Sprintf("%s, %s: the dead origin's last request came %v after the row's first call began (%d requests).",
					variant, p.name, lastDead.Round(100*time.Microsecond), row.Dead))
			}
			res.Rows = append(res.Rows, row)
		}
	}
	return res, nil
}

// deadRow runs one row: n origins, the first dead, the workload through p.
// It also returns how long after the start the dead origin's last request
// arrived.
func deadRow(ctx context.Context, p policy, n int) (Row, time.Duration, error) {
	e := newEnv(p)
	defer e.close()
	var origins []*origin.Origin
	var ls []*origin.Listener
	for i := range n {
		script := origin.Succeed()
		if i == 0 {
			script = origin.Always(codes.Unavailable)
		}
		o := origin.New(script)
		l, err := e.serve(o)
		if err != nil {
			return Row{}, 0, err
		}
		origins = append(origins, o)
		ls = append(ls, l)
	}
	client, err := e.dialBackends(ls)
	if err != nil {
		return Row{}, 0, err
	}
	start := time.Now()
	out := pool(ctx, deadCalls, deadWorkers, deadDeadline, put(client))
	total := 0
	for _, o := range origins {
		total += o.Total()
	}
	row := out.row(p, total)
	row.Dead = origins[0].Total()
	var last time.Duration
	if calls := origins[0].Calls(); len(calls) > 0 {
		last = calls[len(calls)-1].Arrived.Sub(start)
	}
	return row, last, nil
}

// dialBackends returns a client of every listener in ls through p's client
// side, with grpc-go's round_robin over them (the outlier policy around it
// for suiteOutlier) and a manual resolver.
func (e *env) dialBackends(ls []*origin.Listener) (echov1.EchoServiceClient, error) {
	var eps []resolver.Endpoint
	for _, l := range ls {
		eps = append(eps, resolver.Endpoint{Addresses: []resolver.Address{{Addr: l.Target}}})
	}
	r := manual.NewBuilderWithScheme("stormlab")
	r.InitialState(resolver.State{Endpoints: eps})
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	roundRobin := `{"loadBalancingConfig": [{"round_robin": {}}]}`
	switch e.p.key {
	case grpcRetry, grpcThrottled:
		sc, err := withLB(grpcServiceConfig(e.p.key == grpcThrottled), roundRobin)
		if err != nil {
			return nil, err
		}
		opts = append(opts, grpc.WithResolvers(r), grpc.WithDefaultServiceConfig(sc))
	case noRetries:
		opts = append(opts, grpc.WithResolvers(r), grpc.WithDisableRetry(), grpc.WithDefaultServiceConfig(roundRobin))
	case suiteByHand:
		guard := interceptor.NewClient(e.p.clientOptions(e.extra...)...)
		opts = append(opts, grpc.WithResolvers(r), grpc.WithDisableRetry(), grpc.WithDefaultServiceConfig(roundRobin),
			grpc.WithChainUnaryInterceptor(guard.Unary()), grpc.WithChainStreamInterceptor(guard.Stream()))
	default:
		sc := roundRobin
		if e.p.key == suiteOutlier {
			sc = outlier.ServiceConfig(outlier.Config{})
		}
		guard := interceptor.NewClient(e.p.clientOptions(e.extra...)...)
		opts = append(append(opts, guard.DialOptions(r)...), grpc.WithDefaultServiceConfig(sc))
	}
	cc, err := grpc.NewClient("stormlab:///backends", opts...)
	if err != nil {
		return nil, err
	}
	e.conns = append(e.conns, cc)
	return echov1.NewEchoServiceClient(cc), nil
}

// withLB returns the service config sc with the loadBalancingConfig of lb.
func withLB(sc, lb string) (string, error) {
	var a, b map[string]any
	if err := json.Unmarshal([]byte(sc), &a); err != nil {
		return "", err
	}
	if err := json.Unmarshal([]byte(lb), &b); err != nil {
		return "", err
	}
	a["loadBalancingConfig"] = b["loadBalancingConfig"]
	out, err := json.Marshal(a)
	return string(out), err
}
