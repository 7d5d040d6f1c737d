package redisstore

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// WithClock returns c with now in place of this replica's clock
// (time.Now): the time it measures the time left before a request's
// deadline on, so that a test can move it, or skew it.
func WithClock(c Config, now func() time.Time) Config {
	c.now = now
	return c
}

// WithRedisClock returns c with now in place of Redis's clock (TIME): the
// time every script of its Stores compares, so that a test can move it.
// Give every Store of a test that shares a prefix the same clock.
func WithRedisClock(c Config, now func() time.Time) Config {
	c.redisNow = now
	return c
}

// LoadScripts loads the store's scripts into rdb's script cache, as their
// first use would: a test that measures Redis's memory does so first, so
// that the cache is not counted as what the entries hold.
func LoadScripts(ctx context.Context, rdb redis.Scripter) error {
	for _, sc := range []*redis.Script{claimScript, completeScript, releaseScript, waitScript, retakeScript} {
		if err := sc.Load(ctx, rdb).Err(); err != nil {
			return err
		}
	}
	return nil
}
