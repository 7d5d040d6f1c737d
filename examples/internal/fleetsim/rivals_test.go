package fleetsim

import (
	"math/rand/v2"
	"testing"
	"time"
)

func testEnv() *Env {
	return &Env{Rand: rand.New(rand.NewPCG(1, 2)), Base: base, Backends: 2, Clients: 1}
}

var unavailable = Outcome{Code: Unavailable, Pushback: NoPushback}

// retriesGranted makes calls that each fail once, at t0 + i×gap, and
// returns how many of their retries the client grants.
func retriesGranted(c Client, calls int, gap time.Duration, o Outcome) int {
	n := 0
	for i := range calls {
		now := base.Add(time.Duration(i) * gap)
		call := &Call{Attempts: 1, Deadline: now.Add(time.Hour)}
		if !c.Begin(call, now) {
			continue
		}
		c.Pick(call, now, 2)
		if v := c.Settle(call, now, o); v.Retry && c.Send(call, now) {
			n++
		}
		c.End(call, now, false)
	}
	return n
}

// TestGRPCThrottle: tokens start at 10, each failure takes one, and no
// retry follows once 5 or fewer are left: 4 retries from a full bucket;
// ten successful calls give one token back.
func TestGRPCThrottle(t *testing.T) {
	c := PolicyGRPCThrottled().New(testEnv(), 0)
	if n := retriesGranted(c, 20, time.Millisecond, unavailable); n != 4 {
		t.Errorf("%d retries, want 4", n)
	}
	if n := retriesGranted(PolicyGRPC().New(testEnv(), 0), 20, time.Millisecond, unavailable); n != 20 {
		t.Errorf("unthrottled: %d retries, want 20", n)
	}
	// DoNotRetry is obeyed and counts as a failure.
	if n := retriesGranted(PolicyGRPC().New(testEnv(), 0), 5, time.Millisecond, Outcome{Code: Unavailable, Pushback: DoNotRetry}); n != 0 {
		t.Errorf("with do-not-retry pushback: %d retries, want 0", n)
	}
}

// TestAWSQuota: 500 tokens, a transient retry costs 5 (100 retries), or
// 14 in the 2026 behaviour (35); a throttling retry costs 5 in both.
func TestAWSQuota(t *testing.T) {
	for _, tc := range []struct {
		p    *ClientPolicy
		o    Outcome
		want int
	}{
		{PolicyAWS(false), unavailable, 100},
		{PolicyAWS(true), unavailable, 35},
		{PolicyAWS(true), Outcome{Code: ResourceExhausted, Pushback: NoPushback}, 100},
	} {
		if n := retriesGranted(tc.p.New(testEnv(), 0), 200, time.Millisecond, tc.o); n != tc.want {
			t.Errorf("%s, %v: %d retries, want %d", tc.p.Name, tc.o.Code, n, tc.want)
		}
	}
	// A success without a retry refunds 1 token: 5 of them pay a retry
	// of a drained quota.
	c := PolicyAWS(false).New(testEnv(), 0)
	retriesGranted(c, 200, time.Millisecond, unavailable)
	for range 5 {
		call := &Call{Attempts: 1}
		c.Settle(call, base, Outcome{Code: OK})
	}
	if n := retriesGranted(c, 2, time.Millisecond, unavailable); n != 1 {
		t.Errorf("after 5 refunds: %d retries, want 1", n)
	}
}

// TestEnvoyBudget: with few active requests, at most 3 retries in flight
// or in backoff; with 100 active, 20.
func TestEnvoyBudget(t *testing.T) {
	c := PolicyEnvoy().New(testEnv(), 0).(*envoyClient)
	granted := 0
	for range 10 {
		call := &Call{Attempts: 1, Deadline: base.Add(time.Hour)}
		c.Pick(call, base, 2)
		if c.Settle(call, base, unavailable).Retry {
			granted++ // the retries stay in backoff: none ends
		}
	}
	if granted != 3 {
		t.Errorf("%d retries with no other request active, want 3", granted)
	}
	c = PolicyEnvoy().New(testEnv(), 0).(*envoyClient)
	for range 101 {
		c.Pick(&Call{}, base, 2) // 101 attempts in flight
	}
	granted = 0
	for range 30 {
		call := &Call{Attempts: 1, Deadline: base.Add(time.Hour)}
		if c.Settle(call, base, unavailable).Retry {
			granted++
		}
		c.Pick(&Call{}, base, 2) // another request takes its place
	}
	if granted != 20 {
		t.Errorf("%d retries with 100 requests active, want 20", granted)
	}
}

// TestFinagleBudget: a fresh client may retry 100 times in its first 10 s
// (10 a second of reserve over the ttl) plus a fifth of its requests.
func TestFinagleBudget(t *testing.T) {
	if n := retriesGranted(PolicyFinagle().New(testEnv(), 0), 200, time.Millisecond, unavailable); n != 100+200/5 {
		t.Errorf("%d retries for 200 requests in 0.2 s, want %d", n, 100+200/5)
	}
	// Ten seconds later the deposits and withdrawals have expired.
	c := PolicyFinagle().New(testEnv(), 0)
	retriesGranted(c, 200, time.Millisecond, unavailable)
	call := &Call{Attempts: 1, Deadline: base.Add(time.Hour)}
	if !c.Settle(call, base.Add(11*time.Second), unavailable).Retry {
		t.Error("no retry 11 s later, want one")
	}
}

// TestSREThrottle: the rejection probability is max(0, (requests − 2 ×
// accepts) / (requests + 1)) over 2 minutes: none while half the requests
// are accepted; nearly all after 1,000 requests and no accept; none
// again once the window has passed.
func TestSREThrottle(t *testing.T) {
	c := PolicySRE().New(testEnv(), 0)
	rejected := func(n int, at time.Time, o Outcome) int {
		r := 0
		for range n {
			call := &Call{Attempts: 1}
			if !c.Begin(call, at) {
				r++
				continue
			}
			c.Settle(call, at, o)
		}
		return r
	}
	if r := rejected(1000, base, Outcome{Code: OK}); r != 0 {
		t.Errorf("%d rejected while every request is accepted", r)
	}
	if r := rejected(5000, base.Add(3*time.Minute), unavailable); r < 4000 {
		t.Errorf("%d of 5,000 rejected with no accept, want most", r)
	}
	if r := rejected(100, base.Add(6*time.Minute), Outcome{Code: OK}); r != 0 {
		t.Errorf("%d rejected once the window passed, want 0", r)
	}
}
