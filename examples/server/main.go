package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"google.golang.org/grpc"

	"github.com/stormguard/stormguard/idempotency/dedupe"
	"github.com/stormguard/stormguard/interceptor"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// stopGrace bounds the graceful stop: calls still running after it are cut.
const stopGrace = 5 * time.Second

// config is what the flags ask for.
type config struct {
	addr  string
	flaky int
	run   time.Duration // 0: until interrupted
}

func main() {
	var cfg config
	flag.StringVar(&cfg.addr, "addr", "127.0.0.1:50051", "address to listen on (port 0 picks a free port)")
	flag.IntVar(&cfg.flaky, "flaky", 0, "fail the first attempt of every `N`-th unary request with UNAVAILABLE (0: never)")
	flag.DurationVar(&cfg.run, "for", 0, "stop after this long (0: run until SIGINT or SIGTERM)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "server:", err)
		os.Exit(1)
	}
}

// run serves until ctx is done (or cfg.run has passed), then stops
// gracefully.
func run(ctx context.Context, cfg config, out io.Writer) error {
	if cfg.run > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.run)
		defer cancel()
	}
	lis, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		return err
	}
	log := newLog(out)
	// The demo serves plaintext on 127.0.0.1 to trusted demo clients, so
	// its callers have no identity (no TLS client certificate, no
	// authorization metadata): they share one anonymous key space, by
	// explicit choice. A real server authenticates its callers instead.
	guard := interceptor.NewServer(interceptor.WithDedupe(dedupe.NewServer(dedupe.Config{AllowAnonymous: true})))
	srv := grpc.NewServer(
		// Outermost first: log what arrived, then the suite (deadline,
		// dedupe, pushback), then the demo's injected failures.
		grpc.ChainUnaryInterceptor(log.unary, guard.Unary(), flakyUnary(cfg.flaky)),
		grpc.ChainStreamInterceptor(log.stream, guard.Stream()),
	)
	echov1.RegisterEchoServiceServer(srv, newEcho())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	log.printf("server: listening on %s (flaky: %d)", lis.Addr(), cfg.flaky)

	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	log.printf("server: stopping")
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(stopGrace):
		srv.Stop()
		<-stopped
	}
	if err := <-served; err != nil && err != grpc.ErrServerStopped {
		return err
	}
	log.printf("server: stopped")
	return nil
}
