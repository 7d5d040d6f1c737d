package clock_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/stormguard/stormguard/internal/clock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func fired(t clock.Timer) bool {
	select {
	case <-t.C():
		return true
	default:
		return false
	}
}

func TestFakeFiresInOrderWhenAdvanced(t *testing.T) {
	f := clock.NewFake(t0)
	a, b := f.NewTimer(10*time.Millisecond), f.NewTimer(20*time.Millisecond)
	assert.Equal(t, 2, f.Pending())
	f.Advance(9 * time.Millisecond)
	assert.False(t, fired(a))
	f.Advance(time.Millisecond)
	assert.True(t, fired(a))
	assert.False(t, fired(b))
	assert.Equal(t, t0.Add(10*time.Millisecond), f.Now())
	f.Advance(time.Hour)
	assert.True(t, fired(b))
	assert.Equal(t, 0, f.Pending())
}

func TestFakeStopAndZeroDelay(t *testing.T) {
	f := clock.NewFake(t0)
	a := f.NewTimer(time.Second)
	assert.True(t, a.Stop())
	assert.False(t, a.Stop())
	f.Advance(time.Hour)
	assert.False(t, fired(a))
	z := f.NewTimer(0)
	assert.True(t, fired(z), "a timer of 0 fires at once")
	assert.False(t, z.Stop())
}

func TestFakeWaitPending(t *testing.T) {
	f := clock.NewFake(t0)
	done := make(chan bool)
	go func() { done <- f.WaitPending(1, 10*time.Second) }()
	f.NewTimer(time.Second)
	require.True(t, <-done)
	assert.False(t, f.WaitPending(2, 10*time.Millisecond), "times out")
}

func TestRealTimer(t *testing.T) {
	r := clock.NewTimer(time.Millisecond)
	<-r.C()
	assert.False(t, r.Stop())
}

// TestFakeRunsFunctionsInOrderAtTheirTimes: AfterFunc's functions run in
// Advance's goroutine, by deadline (then in the order they were made),
// each with the clock at its deadline; one scheduled by another runs in
// the same Advance if it falls due by its end.
func TestFakeRunsFunctionsInOrderAtTheirTimes(t *testing.T) {
	f := clock.NewFake(t0)
	var got []string
	note := func(name string) func() {
		return func() { got = append(got, name+"@"+f.Now().Sub(t0).String()) }
	}
	f.AfterFunc(30*time.Millisecond, note("c"))
	f.AfterFunc(10*time.Millisecond, func() {
		note("a")()
		f.AfterFunc(5*time.Millisecond, note("a2")) // at 15ms
	})
	f.AfterFunc(10*time.Millisecond, note("b")) // same deadline, made later
	stop := f.AfterFunc(20*time.Millisecond, note("stopped"))
	assert.True(t, stop())
	assert.False(t, stop())
	f.AfterFunc(time.Hour, note("late"))
	assert.Equal(t, 3+1, f.Pending())
	if d, ok := f.Next(); !ok || d != 10*time.Millisecond {
		t.Fatalf("Next = %v, %v", d, ok)
	}
	f.Advance(40 * time.Millisecond)
	assert.Equal(t, []string{"a@10ms", "b@10ms", "a2@15ms", "c@30ms"}, got)
	assert.Equal(t, t0.Add(40*time.Millisecond), f.Now())
	assert.Equal(t, 1, f.Pending())
}

// TestFakeTimersFireBesideFunctions: a timer due before a function has
// fired when the function runs.
func TestFakeTimersFireBesideFunctions(t *testing.T) {
	f := clock.NewFake(t0)
	tm := f.NewTimer(5 * time.Millisecond)
	var sawFired bool
	f.AfterFunc(10*time.Millisecond, func() { sawFired = fired(tm) })
	f.Advance(time.Second)
	assert.True(t, sawFired)
	z := false
	f.AfterFunc(0, func() { z = true })
	assert.False(t, z, "a function of 0 runs at the next Advance, not at once")
	f.Advance(0)
	assert.True(t, z)
}

func TestRealAfterFunc(t *testing.T) {
	var c clock.Clock = clock.Real{}
	done := make(chan struct{})
	c.AfterFunc(time.Millisecond, func() { close(done) })
	<-done
	stop := c.AfterFunc(time.Hour, func() { t.Error("ran") })
	assert.True(t, stop())
	assert.WithinDuration(t, time.Now(), c.Now(), time.Minute)
}

var _ clock.Clock = (*clock.Fake)(nil)
