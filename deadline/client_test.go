package deadline_test

import (
	"context"
	"math"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/deadline"
)

// at is a context with a fixed deadline and no timer: the pure logic reads
// only Deadline, so tests can pick any clock.
type at struct {
	context.Context
	dl time.Time
}

func (c at) Deadline() (time.Time, bool) { return c.dl, true }

func withDeadline(dl time.Time) context.Context { return at{context.Background(), dl} }

// base is an arbitrary fixed instant for tests that give the time.
var base = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

func sent(t *testing.T, ctx context.Context) []string {
	t.Helper()
	md, _ := metadata.FromOutgoingContext(ctx)
	return md.Get(deadline.MetadataKey)
}

func TestClientHeaderAndMargin(t *testing.T) {
	cases := []struct {
		name string
		cfg  deadline.ClientConfig
		left time.Duration
		want string
	}{
		{"default margin", deadline.ClientConfig{}, 250 * time.Millisecond, "245"},
		{"no margin", deadline.ClientConfig{Margin: -1}, 250 * time.Millisecond, "250"},
		{"rounded down", deadline.ClientConfig{Margin: -1}, 250*time.Millisecond - time.Nanosecond, "249"},
		{"sub-millisecond", deadline.ClientConfig{Margin: -1}, 900 * time.Microsecond, "1"},
		{"fixed margin", deadline.ClientConfig{Margin: 20 * time.Millisecond}, 250 * time.Millisecond, "230"},
		{"fraction", deadline.ClientConfig{Margin: -1, MarginFraction: 0.1}, 250 * time.Millisecond, "225"},
		{"both", deadline.ClientConfig{Margin: 20 * time.Millisecond, MarginFraction: 0.1}, 250 * time.Millisecond, "205"},
		{"margin capped at a quarter", deadline.ClientConfig{Margin: time.Second}, 250 * time.Millisecond, "187"},
		{"short deadline, default margin", deadline.ClientConfig{}, 6 * time.Millisecond, "4"},
		{"margin and fraction capped", deadline.ClientConfig{Margin: time.Second, MarginFraction: 0.9}, time.Second, "100"},
		{"fraction clamped", deadline.ClientConfig{Margin: -1, MarginFraction: 5}, time.Second, "100"},
		{"fraction +Inf", deadline.ClientConfig{Margin: -1, MarginFraction: math.Inf(1)}, time.Second, "100"},
		{"fraction negative", deadline.ClientConfig{Margin: -1, MarginFraction: -1}, time.Second, "1000"},
		{"fraction NaN", deadline.ClientConfig{Margin: -1, MarginFraction: math.NaN()}, time.Second, "1000"},
		{"negative margin", deadline.ClientConfig{Margin: -time.Second}, time.Second, "1000"},
		{"huge", deadline.ClientConfig{Margin: -1}, 400 * 24 * time.Hour, "2592000000"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := deadline.NewClient(tc.cfg)
			ctx, err := c.AttemptContext(withDeadline(base.Add(tc.left)), base)
			require.NoError(t, err)
			assert.Equal(t, []string{tc.want}, sent(t, ctx))
			dl, _ := ctx.Deadline()
			assert.Equal(t, base.Add(tc.left), dl, "the attempt's own deadline is left alone")
		})
	}
}

func TestClientFailFast(t *testing.T) {
	c := deadline.NewClient(deadline.ClientConfig{MinRemaining: 10 * time.Millisecond})
	for _, left := range []time.Duration{-time.Hour, -time.Nanosecond, 0, time.Nanosecond, 10*time.Millisecond - time.Nanosecond} {
		in := withDeadline(base.Add(left))
		ctx, err := c.AttemptContext(in, base)
		assert.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v left", left)
		assert.Equal(t, in, ctx, "on error the context is returned unchanged")
		assert.Empty(t, sent(t, ctx))
	}
	_, err := c.AttemptContext(withDeadline(base.Add(10*time.Millisecond)), base)
	assert.NoError(t, err, "exactly the minimum is enough")

	// Default: only an expired deadline fails.
	c = deadline.NewClient(deadline.ClientConfig{})
	_, err = c.AttemptContext(withDeadline(base), base)
	assert.Equal(t, codes.DeadlineExceeded, status.Code(err))
	ctx, err := c.AttemptContext(withDeadline(base.Add(time.Nanosecond)), base)
	assert.NoError(t, err)
	assert.Equal(t, []string{"1"}, sent(t, ctx), "time left is never sent as expired")
	// MinRemaining negative counts as zero.
	c = deadline.NewClient(deadline.ClientConfig{MinRemaining: -time.Second})
	_, err = c.AttemptContext(withDeadline(base), base)
	assert.Equal(t, codes.DeadlineExceeded, status.Code(err))
}

func TestClientStaleHeader(t *testing.T) {
	c := deadline.NewClient(deadline.ClientConfig{Margin: -1})
	// A proxy copied its incoming metadata, header included, to the outgoing
	// context, some of it appended later, under mixed case.
	stale := metadata.NewOutgoingContext(withDeadline(base.Add(time.Second)),
		metadata.MD{deadline.MetadataKey: {"99999"}, "x-trace": {"t1"}})
	stale = metadata.AppendToOutgoingContext(stale, "Stormguard-Deadline-Ms", "88888", "x-other", "o")
	ctx, err := c.AttemptContext(stale, base)
	require.NoError(t, err)
	md, _ := metadata.FromOutgoingContext(ctx)
	assert.Equal(t, metadata.MD{deadline.MetadataKey: {"1000"}, "x-trace": {"t1"}, "x-other": {"o"}}, md)

	// Without a deadline, no header is sent, and a stale one is dropped.
	noDL := metadata.AppendToOutgoingContext(context.Background(), deadline.MetadataKey, "5", "x-trace", "t")
	ctx, err = c.AttemptContext(noDL, base)
	require.NoError(t, err)
	md, _ = metadata.FromOutgoingContext(ctx)
	assert.Equal(t, metadata.MD{"x-trace": {"t"}}, md)

	// Without a deadline and without a header, the context is untouched.
	plain := metadata.AppendToOutgoingContext(context.Background(), "x-trace", "t")
	ctx, err = c.AttemptContext(plain, base)
	require.NoError(t, err)
	assert.Equal(t, plain, ctx)
}

func TestClientEachAttemptSendsWhatIsLeft(t *testing.T) {
	c := deadline.NewClient(deadline.ClientConfig{Margin: 5 * time.Millisecond})
	call := withDeadline(base.Add(300 * time.Millisecond))
	// The last, with 1 ms left: the margin takes a quarter of it.
	for i, want := range []string{"295", "195", "45", "1"} {
		now := base.Add([]time.Duration{0, 100, 250, 299}[i] * time.Millisecond)
		ctx, err := c.AttemptContext(call, now)
		require.NoError(t, err)
		assert.Equal(t, []string{want}, sent(t, ctx), "attempt %d", i+1)
	}
	// A retry built on an earlier attempt's context replaces, never appends.
	first, err := c.AttemptContext(call, base)
	require.NoError(t, err)
	second, err := c.AttemptContext(first, base.Add(100*time.Millisecond))
	require.NoError(t, err)
	assert.Equal(t, []string{"195"}, sent(t, second))
}

// TestClientCallContext, in a synctest bubble: the default timeout is
// measured from the real clock, which stands still in the bubble.
func TestClientCallContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		now := time.Now()
		c := deadline.NewClient(deadline.ClientConfig{DefaultTimeout: time.Minute})
		ctx, cancel := c.CallContext(context.Background())
		dl, ok := ctx.Deadline()
		assert.True(t, ok)
		assert.Equal(t, now.Add(time.Minute), dl)
		cancel()
		assert.ErrorIs(t, ctx.Err(), context.Canceled)

		// An existing deadline is kept, even a longer one.
		parent, pcancel := context.WithTimeout(context.Background(), time.Hour)
		defer pcancel()
		ctx, cancel = c.CallContext(parent)
		defer cancel()
		assert.Equal(t, parent, ctx)

		// No DefaultTimeout: no deadline.
		ctx, cancel = deadline.NewClient(deadline.ClientConfig{}).CallContext(context.Background())
		defer cancel()
		_, ok = ctx.Deadline()
		assert.False(t, ok)
	})
}

func TestClientDownstream(t *testing.T) {
	c := deadline.NewClient(deadline.ClientConfig{Margin: 10 * time.Millisecond, MarginFraction: 0.25})
	assert.Equal(t, 65*time.Millisecond, c.Downstream(100*time.Millisecond))
	assert.Equal(t, 5*time.Millisecond, c.Downstream(10*time.Millisecond), "the margin takes at most a quarter")
	assert.Equal(t, time.Duration(0), c.Downstream(0))
	assert.Equal(t, time.Duration(0), c.Downstream(-time.Second))
}

// A short deadline is never made to look expired: with the default margin,
// or none, an attempt with any time left sends a header a server reads as
// time left (not "0"), and the margin takes at most a quarter of it. The
// old client took its 5 ms whole and rounded the rest down: a call needed
// about 7 ms left to reach a handler, where plain grpc-go needs 1 ms.
func TestClientShortDeadlines(t *testing.T) {
	for _, cfg := range []deadline.ClientConfig{{}, {Margin: -1}, {Margin: time.Second}} {
		c := deadline.NewClient(cfg)
		for _, left := range []time.Duration{time.Nanosecond, 100 * time.Microsecond, 900 * time.Microsecond, time.Millisecond,
			1900 * time.Microsecond, 2 * time.Millisecond, 5 * time.Millisecond, 6 * time.Millisecond, 7 * time.Millisecond, 19 * time.Millisecond} {
			down := c.Downstream(left)
			assert.GreaterOrEqual(t, down, left-left/4, "margin %v, %v left: the margin takes at most a quarter", cfg.Margin, left)
			ctx, err := c.AttemptContext(withDeadline(base.Add(left)), base)
			require.NoError(t, err)
			v := metadata.ValueFromOutgoingContext(ctx, deadline.MetadataKey)
			require.Len(t, v, 1)
			d, ok := deadline.ParseHeader(v[0])
			assert.True(t, ok && d > 0, "margin %v, %v left: header %q reads as expired", cfg.Margin, left, v[0])
		}
	}
}

func TestClientAttemptAllocations(t *testing.T) {
	c := deadline.NewClient(deadline.ClientConfig{Margin: time.Millisecond})
	ctx := withDeadline(base.Add(time.Second))
	allocs := testing.AllocsPerRun(200, func() {
		if _, err := c.AttemptContext(ctx, base); err != nil {
			t.Fatal(err)
		}
	})
	t.Logf("AttemptContext: %v allocs", allocs)
	assert.LessOrEqual(t, allocs, 4.0, "one metadata.AppendToOutgoingContext")
	noDL := context.Background()
	assert.Zero(t, testing.AllocsPerRun(200, func() { _, _ = c.AttemptContext(noDL, base) }))
	expired := withDeadline(base)
	assert.Zero(t, testing.AllocsPerRun(200, func() { _, _ = c.AttemptContext(expired, base) }))
}
