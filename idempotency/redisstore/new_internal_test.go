package redisstore

import (
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stormguard/stormguard/idempotency/dedupe"
	"github.com/stormguard/stormguard/idempotency/redisstore/internal/redistest"
)

// settings is what New made of a Config: the Store's resolved fields.
type settings struct {
	prefix, gKey, channel, target string
	maxEntries, maxPerID          int
	maxBytes, maxBytesPerID       int64
	ttl, horizon, lease, margin   time.Duration
	fence, heartbeat, poll, op    time.Duration
}

func settingsOf(s *Store) settings {
	return settings{
		prefix: s.prefix, gKey: s.gKey, channel: s.channel, target: s.br.Target(),
		maxEntries: s.maxEntries, maxPerID: s.maxPerID, maxBytes: s.maxBytes, maxBytesPerID: s.maxBytesPerID,
		ttl: s.ttl, horizon: s.horizon, lease: s.lease, margin: s.margin,
		fence: s.fence, heartbeat: s.heartbeat, poll: s.poll, op: s.op,
	}
}

// TestNewResolvesConfig: New gives every zero (or negative, where the
// field says so) Config field its default, caps the per-identity bounds by
// the totals, keeps the values it is given, and gives each Store its own
// token prefix and a clock.
func TestNewResolvesConfig(t *testing.T) {
	srv := redistest.Start(t)
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rc.Close() })
	defaults := settings{
		prefix: DefaultPrefix, gKey: DefaultPrefix + "g", channel: DefaultPrefix + "done", target: "redisstore:" + DefaultPrefix,
		maxEntries: dedupe.DefaultMaxEntries, maxPerID: dedupe.DefaultMaxEntries / 4,
		maxBytes: dedupe.DefaultMaxBytes, maxBytesPerID: dedupe.DefaultMaxBytes / 4,
		ttl: dedupe.DefaultTTL, horizon: dedupe.DefaultRetryHorizon, lease: DefaultLease, margin: DefaultLeaseMargin,
		fence: DefaultFence, heartbeat: DefaultHeartbeat, poll: DefaultPollInterval, op: DefaultOpTimeout,
	}
	for _, tc := range []struct {
		name string
		c    Config
		want func(*settings)
	}{
		{"zero", Config{}, func(*settings) {}},
		{"negative", Config{
			MaxEntries: -1, MaxBytes: -1, MaxEntriesPerIdentity: -1, MaxBytesPerIdentity: -1, TTL: -1,
			Lease: -1, LeaseMargin: -1, Heartbeat: -1, PollInterval: -1, OpTimeout: -1,
			RetryHorizon: -1, Fence: -1, // negative: off
		}, func(s *settings) { s.horizon, s.fence = -1, -1 }},
		{"caps", Config{MaxEntries: 10, MaxEntriesPerIdentity: 50, MaxBytes: 1000, MaxBytesPerIdentity: 5000},
			func(s *settings) { s.maxEntries, s.maxPerID, s.maxBytes, s.maxBytesPerID = 10, 10, 1000, 1000 }},
		{"small", Config{MaxEntries: 2, MaxBytes: 3},
			func(s *settings) { s.maxEntries, s.maxPerID, s.maxBytes, s.maxBytesPerID = 2, 1, 3, 0 }},
		{"given", Config{
			Prefix: "{p}:", MaxEntries: 100, MaxEntriesPerIdentity: 7, MaxBytes: 1 << 20, MaxBytesPerIdentity: 1 << 10,
			TTL: time.Hour, RetryHorizon: time.Minute, Lease: 2 * time.Minute, LeaseMargin: 3 * time.Second,
			Fence: 4 * time.Second, Heartbeat: 5 * time.Second, PollInterval: 6 * time.Millisecond, OpTimeout: 7 * time.Millisecond,
		}, func(s *settings) {
			*s = settings{
				prefix: "{p}:", gKey: "{p}:g", channel: "{p}:done", target: "redisstore:{p}:",
				maxEntries: 100, maxPerID: 7, maxBytes: 1 << 20, maxBytesPerID: 1 << 10,
				ttl: time.Hour, horizon: time.Minute, lease: 2 * time.Minute, margin: 3 * time.Second,
				fence: 4 * time.Second, heartbeat: 5 * time.Second, poll: 6 * time.Millisecond, op: 7 * time.Millisecond,
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.c
			c.Client = rc
			s, err := New(c)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			want := defaults
			tc.want(&want)
			if got := settingsOf(s); got != want {
				t.Errorf("New(%s):\n got %+v\nwant %+v", tc.name, got, want)
			}
			if s.now == nil {
				t.Error("no clock")
			}
			if len(s.tokPrefix) != 17 || !strings.HasSuffix(s.tokPrefix, ".") {
				t.Errorf("token prefix %q: want 16 hex digits and a dot", s.tokPrefix)
			}
		})
	}
	c := Config{Client: rc}
	s, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s2, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if s.tokPrefix == s2.tokPrefix {
		t.Errorf("two stores share the token prefix %q", s.tokPrefix)
	}
}
