package svcconfig

import (
	"math"
	"sync/atomic"
)

// Throttle is a service config's retryThrottling at work (gRFC A6): a
// token count that starts at MaxTokens, loses one for each failed attempt
// and gains TokenRatio for each successful one, never beyond MaxTokens or
// below 0; retries and hedges are throttled while it is at or below half
// of MaxTokens. Counts are kept in thousandths, as grpc-go does.
//
// A Throttle is safe for concurrent use, lock-free. A nil *Throttle
// throttles nothing.
type Throttle struct {
	limit  Throttling
	max    int64 // thousandths
	ratio  int64 // thousandths
	tokens atomic.Int64
}

// newThrottle returns the throttle of cfg's retryThrottling (nil: none),
// keeping old's tokens when its settings are the same.
func newThrottle(cfg *Config, old *Throttle) *Throttle {
	if cfg == nil || cfg.Throttling == nil {
		return nil
	}
	if old != nil && old.limit == *cfg.Throttling {
		return old
	}
	t := &Throttle{limit: *cfg.Throttling, max: int64(math.Round(cfg.Throttling.MaxTokens * 1000)), ratio: int64(math.Round(cfg.Throttling.TokenRatio * 1000))}
	t.tokens.Store(t.max)
	return t
}

// Failure counts a failed attempt.
func (t *Throttle) Failure() {
	if t == nil {
		return
	}
	for {
		v := t.tokens.Load()
		if t.tokens.CompareAndSwap(v, max(v-1000, 0)) {
			return
		}
	}
}

// Success counts a successful attempt.
func (t *Throttle) Success() {
	if t == nil {
		return
	}
	for {
		v := t.tokens.Load()
		if v >= t.max || t.tokens.CompareAndSwap(v, min(v+t.ratio, t.max)) {
			return
		}
	}
}

// Throttled reports whether retries and hedges are throttled now.
func (t *Throttle) Throttled() bool {
	return t != nil && t.tokens.Load() <= t.max/2
}

// Tokens returns the token count.
func (t *Throttle) Tokens() float64 {
	if t == nil {
		return 0
	}
	return float64(t.tokens.Load()) / 1000
}
