package redisstore_test

import (
	"context"
	"flag"
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

// sharedAddr returns shared's address, or skips t when there is no
// redis-server.
func sharedAddr(t testing.TB) string {
	t.Helper()
	if shared == nil {
		redistest.Require(t)
	}
	return shared.Addr
}

func TestMain(m *testing.M) {
	if why := redistest.Missing(); why != "" {
		if os.Getenv("CI") != "" {
			fmt.Fprintf(os.Stderr, "FAIL: %s, and CI is set: these tests need a real redis-server\n", why)
			os.Exit(1)
		}
		// The tests that need Redis skip themselves (sharedAddr,
		// redistest.Start); examples cannot skip, so they are left out.
		fmt.Fprintf(os.Stderr, "redisstore: %s: the tests that need it are skipped\n", why)
		_ = flag.Set("test.skip", "^Example")
		goleak.VerifyTestMain(m)
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
