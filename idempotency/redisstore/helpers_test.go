package redisstore_test

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/idempotency/dedupe"
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

// primed returns a Store of c whose first-use fence is already over: it
// claims once with its clock set back by more than the fence (on an empty
// store, the claim is fenced: it creates the store's state), then sets the
// clock right.
// Every time the store compares afterwards is taken from c.Now as it is.
func primed(t testing.TB, c redisstore.Config) *redisstore.Store {
	t.Helper()
	base := c.Now
	if base == nil {
		base = time.Now
	}
	clock := &skewClock{base: base}
	fence := c.Fence
	if fence == 0 {
		fence = redisstore.DefaultFence
	}
	clock.off.Store(int64(-fence - time.Second))
	c.Now = clock.Now
	s := newStore(t, c)
	ctx := context.Background()
	pc, err := s.Claim(ctx, dedupe.Scope{Identity: "prime", Key: "prime"}, dedupe.Fingerprint{Method: "/prime/Prime"})
	switch {
	case err == nil && pc.State == dedupe.Owned: // another store on the prefix primed it, and the fence is over
		if err := s.Release(ctx, pc); err != nil {
			t.Fatal(err)
		}
	case status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "first use"):
		t.Fatalf("first claim: %v %v, want the fence's Unavailable", pc.State, err)
	}
	clock.off.Store(0)
	return s
}
