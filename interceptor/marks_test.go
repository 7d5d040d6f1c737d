package interceptor_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stormguard/stormguard/interceptor"
)

// records is a slog.Handler that keeps every record.
type records struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (h *records) Enabled(context.Context, slog.Level) bool { return true }
func (h *records) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *records) WithGroup(string) slog.Handler            { return h }
func (h *records) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.recs = append(h.recs, r.Clone())
	return nil
}

// attrs returns the records' levels and attributes.
func (h *records) attrs() []map[string]any {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []map[string]any
	for _, r := range h.recs {
		m := map[string]any{"level": r.Level.String()}
		r.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value.Any(); return true })
		out = append(out, m)
	}
	return out
}

// A WithIdempotent name that the protobuf registry does not know, while it
// knows the service, marks nothing: NewClient says so, naming the closest
// method; a whole-service mark logs the methods it marks, and warns of the
// send_once methods it does not.
func TestWithIdempotentChecksNames(t *testing.T) {
	const svc = "/echo.v1.EchoService/"
	all := []string{svc + "Get", svc + "Put", svc + "Charge", svc + "Notify", svc + "Transfer", svc + "List", svc + "Upload", svc + "Chat"}
	logs := &records{}
	interceptor.NewClient(append(noopProviders(), interceptor.WithTelemetry(interceptor.Telemetry{Logger: slog.New(logs)}),
		interceptor.WithIdempotent(svc+"notify", svc+"Fetch", svc+"Put", "/unknown.v1.Svc/Do"),
		interceptor.WithIdempotent(svc),
	)...)
	got := logs.attrs()
	t.Logf("%d records: %v", len(got), got)
	require.Len(t, got, 4)
	assert.Equal(t, map[string]any{"level": "WARN", "entry": svc + "notify", "service": "echo.v1.EchoService", "closest": svc + "Notify", "methods": all}, got[0])
	assert.Equal(t, map[string]any{"level": "WARN", "entry": svc + "Fetch", "service": "echo.v1.EchoService", "methods": all}, got[1])
	assert.Equal(t, map[string]any{"level": "INFO", "entry": svc, "marked": []string{svc + "Charge", svc + "Notify"}}, got[2])
	assert.Equal(t, map[string]any{"level": "WARN", "entry": svc, "send_once": []string{svc + "Transfer"}}, got[3])

	// Names the registry knows, or cannot check, log nothing.
	quiet := &records{}
	interceptor.NewClient(append(noopProviders(), interceptor.WithTelemetry(interceptor.Telemetry{Logger: slog.New(quiet)}),
		interceptor.WithIdempotent(svc+"Notify", "/unknown.v1.Svc/Do"))...)
	assert.Empty(t, quiet.attrs())
}
