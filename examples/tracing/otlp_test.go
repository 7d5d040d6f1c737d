package main

import (
	"bytes"
	"context"
	"net"
	"sync"
	"testing"

	"github.com/stormguard/stormguard/semconv"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
)

// collector is an in-process OTLP/gRPC trace receiver.
type collector struct {
	collectortrace.UnimplementedTraceServiceServer
	mu       sync.Mutex
	services map[string]int // service.name → spans
	names    map[string]int // span name → count
}

func (c *collector) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		service := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				service = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				c.services[service]++
				c.names[s.GetName()]++
			}
		}
	}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

// TestOTLPExport runs the example with an OTLP endpoint, as
// OTEL_EXPORTER_OTLP_ENDPOINT=http://... go -C examples/tracing run . does,
// against an in-process receiver: every span arrives, under the service
// name stormguard-example. (The e2e test does the same against Jaeger and
// reads the spans back through its API.)
func TestOTLPExport(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	c := &collector{services: map[string]int{}, names: map[string]int{}}
	s := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(s, c)
	go func() { _ = s.Serve(l) }()
	defer s.Stop()

	ctx, cancel := context.WithTimeout(t.Context(), runTimeout)
	defer cancel()
	var out bytes.Buffer
	require.NoError(t, realMain(ctx, &out, "http://"+l.Addr().String()))

	c.mu.Lock()
	defer c.mu.Unlock()
	total := 0
	for _, n := range c.names {
		total += n
	}
	assert.Equal(t, map[string]int{ServiceName: total}, c.services)
	for _, sc := range scenarios {
		assert.Equal(t, 1, c.names[RootPrefix+sc.name], "root span of %s", sc.name)
	}
	// 1+1+1+2+1 calls; 3+1+2+3+1+1 attempts (the call an open breaker refused at its pick has one, not sent).
	assert.Equal(t, 5, c.names["echo.v1.EchoService/Put"])
	assert.Equal(t, 1, c.names["echo.v1.EchoService/Notify"])
	assert.Equal(t, 10, c.names["Attempt.echo.v1.EchoService/Put"])
	assert.Equal(t, 1, c.names["Attempt.echo.v1.EchoService/Notify"])
	assert.Contains(t, out.String(), "exported 22 spans over OTLP/gRPC to http://"+l.Addr().String()+` as service "stormguard-example"`)
	assert.Contains(t, out.String(), semconv.EventHedgeSent)
}
