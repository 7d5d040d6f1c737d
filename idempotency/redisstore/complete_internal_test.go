package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stormguard/stormguard/idempotency/dedupe"
	"github.com/stormguard/stormguard/idempotency/redisstore/internal/redistest"
)

// TestCompleteRunAgainSucceeds: a Complete whose reply was lost and that
// the client sends again (go-redis retries a command on a broken
// connection) finds its own completion and succeeds; another Complete of
// the same claim fails.
func TestCompleteRunAgainSucceeds(t *testing.T) {
	srv := redistest.Start(t)
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	defer rc.Close()
	s, err := New(Config{Client: rc, Fence: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := s.Claim(ctx, dedupe.Scope{Identity: "alice", Key: "k"}, codecFP)
	if err != nil || c.State != dedupe.Owned {
		t.Fatal(c.State, err)
	}
	tk := c.Token.(*token)
	data := mustEncode(t, &dedupe.Record{Fingerprint: codecFP, Response: []byte("r")})
	for i, nonce := range []string{"call-1", "call-1", "call-2"} {
		v, err := s.completeOnce(ctx, tk, c, data, int64(len(data)), nonce)
		if err != nil {
			t.Fatal(err)
		}
		want := "C"
		if nonce == "call-2" {
			want = "E"
		}
		if v[0] != want {
			t.Errorf("run %d (%s): %v, want %s", i, nonce, v, want)
		}
	}
}
