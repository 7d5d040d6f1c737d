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
