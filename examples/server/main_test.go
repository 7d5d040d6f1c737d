package main

import (
	"bufio"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stormguard/stormguard/semconv"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// start runs the server on a free port until the test ends; it returns
// the address and the lines the server printed so far (a func to call
// after the server stopped).
func start(t *testing.T, cfg config) (addr string, stopAndLog func() []string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := run(ctx, cfg, pw)
		pw.CloseWithError(err)
		done <- err
	}()
	lines := make(chan []string, 1)
	first := make(chan string, 1)
	go func() {
		var all []string
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			if len(all) == 0 {
				first <- sc.Text()
			}
			all = append(all, sc.Text())
		}
		close(first)
		lines <- all
	}()
	var line string
	select {
	case line = <-first:
	case <-time.After(10 * time.Second):
		t.Fatal("the server did not say where it listens")
	}
	f := strings.Fields(line)
	if len(f) < 4 || f[2] != "on" {
		t.Fatalf("first line %q", line)
	}
	var log []string
	stopped := false
	stop := func() []string {
		if !stopped {
			stopped = true
			cancel()
			if err := <-done; err != nil {
				t.Errorf("run: %v", err)
			}
			log = <-lines
		}
		return log
	}
	t.Cleanup(func() { stop() })
	return f[3], stop
}

func dial(t *testing.T, addr string) echov1.EchoServiceClient {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithDisableRetry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return echov1.NewEchoServiceClient(cc)
}

func TestFlakyFailsEveryNthFirstAttemptAndLogs(t *testing.T) {
	addr, stop := start(t, config{addr: "127.0.0.1:0", flaky: 2})
	c := dial(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Put(ctx, &echov1.PutRequest{RequestId: "a", Key: "k", Value: []byte("v")}); err != nil {
		t.Fatalf("first request: %v", err)
	}
	_, err := c.Get(ctx, &echov1.GetRequest{RequestId: "b", Key: "k"})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("second request's first attempt: %v, want Unavailable", err)
	}
	retry := metadata.AppendToOutgoingContext(ctx, semconv.PreviousAttemptsKey, "1")
	r, err := c.Get(retry, &echov1.GetRequest{RequestId: "b", Key: "k"})
	if err != nil || string(r.GetValue()) != "v" {
		t.Fatalf("retry: %v, %q; want what Put stored", err, r.GetValue())
	}
	log := strings.Join(stop(), "\n")
	for _, want := range []string{
		`Put request_id="a" attempt=1`,
		`Get request_id="b" attempt=1 deadline=`,
		`→ Unavailable: server: -flaky 2`,
		`Get request_id="b" attempt=2`,
		"server: stopped",
	} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
}

func TestRunStopsAfterFor(t *testing.T) {
	start := time.Now()
	if err := run(context.Background(), config{addr: "127.0.0.1:0", run: 100 * time.Millisecond}, io.Discard); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("ran %v", d)
	}
}

func TestRunBadAddress(t *testing.T) {
	if err := run(context.Background(), config{addr: "127.0.0.1:-1"}, io.Discard); err == nil {
		t.Error("no error for a bad address")
	}
}
