package main

import (
	"context"
	"fmt"
	"time"
)

// blipShape is the overload blip: an origin of 4 workers ×
// 5 ms (800/s) with a queue of 100, 560 calls/s with a 100 ms deadline,
// and 2 s at 16 ms per request.
var blipShape = shape{
	workers: 4, service: 5 * time.Millisecond, queue: 100, rate: 560, clients: 4,
	deadline: 100 * time.Millisecond, slow: 16 * time.Millisecond,
	before: 2 * time.Second, trigger: 2 * time.Second, after: 6 * time.Second,
}

// maxBlipRecovery bounds the suite's recovery after the blip: as fast as
// no retries (which recover within a step), within 0.5 s of its end.
const maxBlipRecovery = 0.5

// The blip's variant with a per-attempt timeout in the suite's defaults
// (no retries has none: its row is the main one): 40% of the deadline, as
// the metastable scenario's main rows have.
const (
	blipPerTryVariant = "per-try 40ms"
	blipPerTry        = 40 * time.Millisecond
)

// Scenario 11: a short overload. Protection must not outlast
// its cause: the old defaults' breaker opened during the blip and kept
// refusing a healthy origin for 5.5 s after it.
func overloadBlip(ctx context.Context) (*Result, error) {
	res := &Result{
		ID: 11, Key: "blip", Title: "Overload blip: protection must not outlast its cause",
		Setup:   blipShape.setup(),
		cols:    []col{colVariant, colPolicy, colOrigin, colAmpl, colOK, colErrors, colRefused, colServerRefused, colRecovery, colGoodput},
		StepS:   msStep.Seconds(),
		Trigger: &window{From: blipShape.before.Seconds(), To: (blipShape.before + blipShape.trigger).Seconds()},
	}
	var jobs []*capacityJob
	for _, p := range []policy{
		{noRetries, "no retries"},
		{grpcRetry, "grpc-go retryPolicy"},
		{grpcThrottled, "grpc-go retryPolicy+throttling"},
		{suiteClientOnly, "stormguard client, plain server"},
		{suiteNoOverload, "stormguard, server WithOverload(nil)"},
		{suiteDefaults, "stormguard defaults"},
	} {
		jobs = append(jobs, &capacityJob{p: p, trigger: true})
	}
	jobs = append(jobs, &capacityJob{p: policy{suiteDefaults, "stormguard defaults"}, trigger: true,
		variant: blipPerTryVariant, perTry: blipPerTry, setPerTry: true})
	rows, err := runCapacityJobs(ctx, blipShape, jobs)
	if err != nil {
		return nil, fmt.Errorf("%s, %w", res.Title, err)
	}
	res.Rows = rows
	return res, nil
}
