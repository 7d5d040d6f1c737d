package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"go.uber.org/goleak"
	"google.golang.org/grpc"

	"github.com/stormguard/stormguard/internal/origin"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestTryIt runs the "Try it" commands of examples/server/README.md and
// examples/client/README.md — the server with -flaky 2, the client against
// it, then SIGTERM to the server — as built programs, on a free port
// instead of 50051, and checks that both exit 0 in bounded time.
func TestTryIt(t *testing.T) {
	if testing.Short() {
		t.Skip("builds two programs")
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	dir := t.TempDir()
	for _, p := range []string{"server", "client"} {
		out, err := exec.CommandContext(ctx, gobin, "build", "-o", filepath.Join(dir, p), "github.com/stormguard/stormguard/examples/"+p).CombinedOutput()
		if err != nil {
			t.Fatalf("go build %s: %v\n%s", p, err, out)
		}
	}

	srv := exec.CommandContext(ctx, filepath.Join(dir, "server"), "-addr", "127.0.0.1:0", "-flaky", "2")
	stdout, err := srv.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var srvErr bytes.Buffer
	srv.Stderr = &srvErr
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	var (
		srvLog []string
		wg     sync.WaitGroup
	)
	first := make(chan string, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if len(srvLog) == 0 {
				first <- sc.Text()
			}
			srvLog = append(srvLog, sc.Text())
		}
		close(first)
	}()
	var addr string
	select {
	case line := <-first:
		if f := strings.Fields(line); len(f) >= 4 {
			addr = f[3]
		}
	case <-time.After(30 * time.Second):
	}
	if addr == "" {
		_ = srv.Process.Kill()
		_ = srv.Wait()
		t.Fatalf("the server did not say where it listens; stderr: %s", srvErr.String())
	}

	cli := exec.CommandContext(ctx, filepath.Join(dir, "client"), "-addr", addr)
	cliOut, err := cli.CombinedOutput()
	if err != nil {
		t.Errorf("client: %v\n%s", err, tail(cliOut))
	}
	for _, want := range []string{
		"==> Charge (retry_with_key", "OK, ch_1",
		"==> Notify (unmarked: sent exactly once): Unavailable",
		`"Name": "echo.v1.EchoService/Charge"`, `"Name": "Attempt.echo.v1.EchoService/Charge"`,
		`"Name": "stormguard.retry.scheduled"`,
	} {
		if !bytes.Contains(cliOut, []byte(want)) {
			t.Errorf("client output lacks %q", want)
		}
	}

	if err := srv.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if err := srv.Wait(); err != nil {
		t.Errorf("server after SIGTERM: %v; stderr: %s", err, srvErr.String())
	}
	log := strings.Join(srvLog, "\n")
	for _, want := range []string{`Charge request_id="charge-1" attempt=2`, "server: stopped"} {
		if !strings.Contains(log, want) {
			t.Errorf("server log lacks %q:\n%s", want, log)
		}
	}
}

func tail(b []byte) []byte {
	if len(b) > 4000 {
		return b[len(b)-4000:]
	}
	return b
}

// serveOrigin serves the lab's programmable origin on 127.0.0.1.
func serveOrigin(t *testing.T) *origin.Listener {
	t.Helper()
	l, err := origin.TCP()
	if err != nil {
		t.Fatal(err)
	}
	srv := origin.Serve(l, origin.New(origin.Succeed()))
	t.Cleanup(srv.Stop)
	return l
}

func TestRunPrintsSpansToStdout(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	l := serveOrigin(t)
	var out bytes.Buffer
	if err := run(context.Background(), config{addr: l.Target, timeout: 5 * time.Second}, &out); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	if n := strings.Count(s, "==> "); n != 6 {
		t.Errorf("%d outcomes, want 6:\n%s", n, s)
	}
	if strings.Contains(s, "==> ") && strings.Count(s, ": OK, ") != 6 {
		t.Errorf("not every call succeeded:\n%s", s)
	}
	for _, m := range []string{"Get", "Put", "Charge", "Notify", "List"} {
		if !strings.Contains(s, `"Name": "echo.v1.EchoService/`+m+`"`) {
			t.Errorf("no span for %s", m)
		}
	}
}

func TestRunFailsWithoutServer(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	err = run(context.Background(), config{addr: addr, timeout: 2 * time.Second}, &bytes.Buffer{})
	if !errors.Is(err, errNoneSucceeded) {
		t.Errorf("run: %v, want errNoneSucceeded", err)
	}
}

// collector is an OTLP/gRPC trace collector that counts spans by name.
type collector struct {
	collectortrace.UnimplementedTraceServiceServer
	mu    sync.Mutex
	names map[string]int
}

func (c *collector) Export(_ context.Context, r *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range r.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				c.names[s.GetName()]++
			}
		}
	}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

func TestRunSendsSpansOverOTLP(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	col := &collector{names: map[string]int{}}
	gs := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(gs, col)
	go func() { _ = gs.Serve(lis) }()
	defer gs.Stop()
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+lis.Addr().String())
	t.Setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")

	l := serveOrigin(t)
	var out bytes.Buffer
	if err := run(context.Background(), config{addr: l.Target, timeout: 5 * time.Second}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "spans go to OTLP/gRPC http://") || strings.Contains(out.String(), `"SpanContext"`) {
		t.Errorf("output:\n%s", out.String())
	}
	col.mu.Lock()
	defer col.mu.Unlock()
	if col.names["echo.v1.EchoService/Charge"] != 1 || col.names["Attempt.echo.v1.EchoService/Get"] < 2 {
		t.Errorf("collector got %v", col.names)
	}
}
