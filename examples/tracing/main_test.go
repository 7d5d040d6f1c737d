package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stormguard/stormguard/semconv"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestSpanTree runs the scenarios with an in-memory exporter and checks
// the tree of each: the same checks the e2e test makes on what Jaeger
// returns.
func TestSpanTree(t *testing.T) {
	mem := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(mem))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	ctx, cancel := context.WithTimeout(t.Context(), runTimeout)
	defer cancel()

	results, err := Run(ctx, tp)
	require.NoError(t, err)
	checkShape(t, results, fromStubs(mem.GetSpans()))
}

// TestRealMain runs the example as `go -C examples/tracing run .` does
// without OTEL_EXPORTER_OTLP_ENDPOINT, and checks what it prints.
func TestRealMain(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), runTimeout)
	defer cancel()
	var out bytes.Buffer
	start := time.Now()
	require.NoError(t, realMain(ctx, &out, ""))
	t.Logf("ran in %v", time.Since(start))
	s := out.String()
	for _, sc := range scenarios {
		assert.Contains(t, s, RootPrefix+sc.name+" [internal]")
	}
	for _, want := range []string{
		"echo.v1.EchoService/Put [client]",
		"Attempt.echo.v1.EchoService/Put [internal]",
		"@ +", // events
		semconv.EventRetryScheduled + "  stormguard.cause=UNAVAILABLE  stormguard.delay_s=",
		semconv.EventRetryRefused + "  stormguard.reason=budget",
		semconv.EventHedgeSent + "  previous-rpc-attempts=1",
		semconv.EventBreakerRejected + "  stormguard.reason=breaker",
		semconv.EventRetryRefused + "  stormguard.reason=not_idempotent",
		"stormguard.attempt.kind=hedge  stormguard.hedge=true",
		"(refused by budget)",
		"(refused by breaker)",
	} {
		assert.Contains(t, s, want)
	}
	assert.Contains(t, s, "[1/5] retried-twice: ")
	assert.NotContains(t, s, "(no spans)")
	assert.NotContains(t, s, "other trace")
	assert.NotContains(t, s, "exported", "nothing exported without an endpoint")
	// Children are indented under their parent: a call span one level
	// below its root, attempts and events one more.
	assert.True(t, strings.Contains(s, "\n   tracing-example/retried-twice [internal]"), "root at depth 1")
	assert.True(t, strings.Contains(s, "\n      echo.v1.EchoService/Put [client]"), "call at depth 2")
	assert.True(t, strings.Contains(s, "\n         Attempt.echo.v1.EchoService/Put [internal]"), "attempt at depth 3")
	assert.True(t, strings.Contains(s, "\n         @ +"), "event at depth 3")
	if t.Failed() {
		t.Log(s)
	}
}
