package interceptor_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
	"github.com/stormguard/stormguard/semconv"
)

// The time line of the yield tests: healthy, then overloaded from
// overloadFrom to overloadTo, then healthy again until yieldRunEnd.
const (
	overloadFrom = 2 * time.Second
	overloadTo   = 5 * time.Second
	yieldRunEnd  = 8 * time.Second
)

// overloadedOrigin answers as a target that is healthy but for a slow 5%
// of attempts (1 s, cut short when their caller cancels), and, between
// overloadFrom and overloadTo after start, overloaded: every first
// attempt takes 50 ms (a queue), and, when shed, every other attempt is
// answered UNAVAILABLE with "do not retry" at once, as a stormguard
// server sheds retries and hedges. attempts receives, for every attempt
// that is not a first one, when it arrived.
func overloadedOrigin(start time.Time, shed bool, attempts chan<- time.Duration) origin.Script {
	return func(c origin.Call) origin.Reply {
		at := c.Arrived.Sub(start)
		retry := len(c.Metadata.Get(semconv.PreviousAttemptsKey)) > 0
		if retry {
			attempts <- at
		}
		switch {
		case at >= overloadFrom && at < overloadTo && retry && shed:
			return origin.Reply{Code: codes.Unavailable, Message: "shed", Trailer: metadata.Pairs(semconv.PushbackKey, "-1")}
		case at >= overloadFrom && at < overloadTo:
			return origin.Reply{Delay: 50 * time.Millisecond}
		case !retry && drawFails(c.RequestID, 1, 0.05):
			return origin.Reply{Delay: time.Second}
		}
		return origin.Reply{Delay: time.Millisecond}
	}
}

// countRetries runs 8 callers in a closed loop of Puts until yieldRunEnd
// (each waits 5 ms between calls) and returns the arrival times of the
// attempts that were not first attempts.
func countRetries(t *testing.T, shed bool, opts ...interceptor.ClientOption) []time.Duration {
	return countRetriesOf(t, shed, 8, 5*time.Millisecond, opts...)
}

// countRetriesOf is countRetries with callers callers, each waiting think
// between calls.
func countRetriesOf(t *testing.T, shed bool, callers int, think time.Duration, opts ...interceptor.ClientOption) []time.Duration {
	start := time.Now()
	attempts := make(chan time.Duration, 100_000)
	e := newEnv(t, overloadedOrigin(start, shed, attempts), opts...)
	var wg sync.WaitGroup
	for w := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(w) * 700 * time.Microsecond)
			for i := 0; time.Since(start) < yieldRunEnd; i++ {
				ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
				_, _ = e.echo.Put(ctx, &echov1.PutRequest{RequestId: fmt.Sprint(w, "-", i)})
				cancel()
				time.Sleep(think)
			}
		}()
	}
	wg.Wait()
	close(attempts)
	var out []time.Duration
	for at := range attempts {
		out = append(out, at)
	}
	return out
}

// unbounded is a retry budget that allows a retry or hedge per call: it
// bounds nothing in these tests.
var unbounded = interceptor.WithBudget(budget.NewRegistry(budget.Config{Ratio: 1}))

// in counts the times in [from, to).
func in(ts []time.Duration, from, to time.Duration) int {
	n := 0
	for _, t := range ts {
		if t >= from && t < to {
			n++
		}
	}
	return n
}

// TestHedgesYieldToAnOverloadedTarget: a client hedging Puts after 10 ms
// (5% of attempts are slow) against a target that becomes overloaded for
// 3 s: a stormguard-like server that sheds the hedges with "do not
// retry", and a plain server that is only slow. Within a second of the
// overload's start no hedge reaches it (the server that sheds: within
// 100 ms, its first shed hedge stops the others); once it has passed,
// hedges come back within 2 s. The client's retry budget allows a retry
// or hedge per call (Ratio 1), so that it does not bound the hedges: the
// yield alone stops them.
func TestHedgesYieldToAnOverloadedTarget(t *testing.T) {
	testYield(t, "hedges", interceptor.WithHedging(10*time.Millisecond, 2))
}

// TestPerAttemptTimeoutRetriesYieldToAnOverloadedTarget: the same target
// and calls with a 20 ms per-attempt timeout instead of hedging: the
// retries sent beside slow attempts stop within a second of the
// overload's start, and come back after it (the budget does not bound
// them here either).
func TestPerAttemptTimeoutRetriesYieldToAnOverloadedTarget(t *testing.T) {
	testYield(t, "retries beside slow attempts", interceptor.WithRetryPolicy(interceptor.RetryPolicy{PerAttemptTimeout: 20 * time.Millisecond}))
}

// testYield runs countRetries with opt against the target that sheds and
// the one that is only slow, and checks what reached it when.
func testYield(t *testing.T, what string, opt interceptor.ClientOption) {
	for _, shed := range []bool{true, false} {
		t.Run(fmt.Sprintf("shed=%v", shed), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				sent := countRetries(t, shed, opt, unbounded)
				before := in(sent, time.Second, overloadFrom)
				during := in(sent, overloadFrom+time.Second, overloadTo)
				after := in(sent, overloadTo+2*time.Second, yieldRunEnd)
				t.Logf("%s: %d in the second before the overload, %d from 1 s into it to its end, %d from 2 s after it",
					what, before, during, after)
				assert.Positive(t, before, "none while healthy")
				assert.Zero(t, during, "%s reached the overloaded target", what)
				assert.Positive(t, after, "%s did not come back", what)
				if shed {
					// The first it sheds stops the others at once.
					assert.Zero(t, in(sent, overloadFrom+100*time.Millisecond, overloadTo), "%s after the target shed one", what)
				}
			})
		})
	}
}

// TestAQuietClientYieldsToo: one caller, five calls a second, with a
// 20 ms per-attempt timeout, against a plain target that becomes slow for
// 3 s: from 1 s into it no retry is sent beside a slow attempt.
func TestAQuietClientYieldsToo(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		retries := countRetriesOf(t, false, 1, 200*time.Millisecond,
			interceptor.WithRetryPolicy(interceptor.RetryPolicy{PerAttemptTimeout: 20 * time.Millisecond}), unbounded)
		during := in(retries, overloadFrom+time.Second, overloadTo)
		t.Logf("retries from 1 s into the overload to its end: %d", during)
		assert.Zero(t, during, "a quiet client's retries reached the overloaded target")
	})
}
