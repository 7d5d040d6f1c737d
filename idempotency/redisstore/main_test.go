package redisstore_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/stormguard/stormguard/idempotency/redisstore/internal/redistest"
)

// shared is the redis-server most tests use, each under its own prefix.
var shared *redistest.Server

// redisAddr is shared's address, for the examples.
var redisAddr string

func TestMain(m *testing.M) {
	if why := redistest.Missing(); why != "" {
		if os.Getenv("CI") != "" {
			fmt.Fprintf(os.Stderr, "FAIL: %s, and CI is set: these tests need a real redis-server\n", why)
			os.Exit(1)
		}
		fmt.Fprintf(os.Stderr, "SKIP: every test of redisstore needs a real redis-server: %s\n", why)
		os.Exit(0)
	}
	dir, err := os.MkdirTemp("", "redisstore-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	shared, err = redistest.StartMain(dir, "--maxmemory", "256mb", "--maxmemory-policy", "noeviction")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	redisAddr = shared.Addr
	// go-redis logs every failed dial; the tests that stop Redis make
	// many on purpose.
	redis.SetLogger(quiet{})
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		shared.Stop()
		_ = os.RemoveAll(dir)
		os.Exit(code)
	}))
}

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}
