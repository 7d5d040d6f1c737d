package redisstore_test

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stormguard/stormguard/idempotency/redisstore"
)

// client returns a go-redis client of addr, closed when t ends.
func client(t testing.TB, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, Protocol: 2,
		DialTimeout: time.Second, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// prefixes numbers the prefixes, so that a test run again (-count)
// starts on an empty store.
var prefixes atomic.Int64

// prefix returns a prefix of t's own on a shared Redis.
func prefix(t testing.TB) string {
	return "{test:" + strings.NewReplacer(" ", "_", "/", ".").Replace(t.Name()) + ":" +
		strconv.FormatInt(prefixes.Add(1), 10) + "}:"
}

// newStore returns a Store of c, closed when t ends.
func newStore(t testing.TB, c redisstore.Config) *redisstore.Store {
	t.Helper()
	s, err := redisstore.New(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// skewClock is a clock running off ahead of base by an adjustable offset.
type skewClock struct {
	base func() time.Time
	off  atomic.Int64
}

func (c *skewClock) Now() time.Time { return c.base().Add(time.Duration(c.off.Load())) }

// primed returns a Store of c whose first-use fence is already over, as
// if the store had been in use for long: unless the store's state is in
// Redis already, it writes it there, with a fence that ended at the
// epoch's start (ms 0).
func primed(t testing.TB, c redisstore.Config) *redisstore.Store {
	t.Helper()
	p := c.Prefix
	if p == "" {
		p = redisstore.DefaultPrefix
	}
	ctx := context.Background()
	made, err := c.Client.HSetNX(ctx, p+"g", "epoch", "primed").Result()
	if err != nil {
		t.Fatal(err)
	}
	if made {
		if err := c.Client.HSet(ctx, p+"g", "fence", 0, "n", 0, "b", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	return newStore(t, c)
}
