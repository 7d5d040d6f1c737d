package deadline_test

import (
	"context"
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

// incoming returns a server-side context: deadline dl (none when zero) and
// the header values vals.
func incoming(dl time.Time, vals ...string) context.Context {
	ctx := context.Background()
	if !dl.IsZero() {
		ctx = withDeadline(dl)
	}
	md := metadata.MD{"x-other": {"1"}}
	if len(vals) > 0 {
		md[deadline.MetadataKey] = vals
	}
	return metadata.NewIncomingContext(ctx, md)
}

func TestServerApply(t *testing.T) {
	ms := time.Millisecond
	cases := []struct {
		name   string
		min    time.Duration
		ctxDL  time.Duration // 0: no ctx deadline
		vals   []string
		wantDL time.Duration // 0: none
		want   deadline.ServerStats
		code   codes.Code
	}{
		{name: "nothing"},
		{name: "ctx deadline only", ctxDL: 500 * ms, wantDL: 500 * ms},
		{name: "header tighter", ctxDL: 500 * ms, vals: []string{"100"}, wantDL: 100 * ms, want: deadline.ServerStats{Tightened: 1}},
		{name: "header looser", ctxDL: 100 * ms, vals: []string{"500"}, wantDL: 100 * ms},
		{name: "header equal", ctxDL: 100 * ms, vals: []string{"100"}, wantDL: 100 * ms},
		{name: "header within resolution", ctxDL: 100*ms + 999_999, vals: []string{"100"}, wantDL: 100*ms + 999_999},
		{name: "header one resolution earlier", ctxDL: 101 * ms, vals: []string{"100"}, wantDL: 100 * ms, want: deadline.ServerStats{Tightened: 1}},
		{name: "header without ctx deadline", vals: []string{"250"}, wantDL: 250 * ms, want: deadline.ServerStats{Tightened: 1}},
		{name: "clamped header without ctx deadline", vals: []string{"9999999999"}, wantDL: deadline.MaxHeader, want: deadline.ServerStats{Tightened: 1}},
		{name: "clamped header looser", ctxDL: time.Hour, vals: []string{"9999999999"}, wantDL: time.Hour},
		{name: "header zero", ctxDL: 500 * ms, vals: []string{"0"}, want: deadline.ServerStats{Refused: 1}, code: codes.DeadlineExceeded},
		{name: "header zero, no ctx deadline", vals: []string{"0"}, want: deadline.ServerStats{Refused: 1}, code: codes.DeadlineExceeded},
		{name: "header zero within resolution still refused", ctxDL: 500_000, vals: []string{"0"}, want: deadline.ServerStats{Refused: 1}, code: codes.DeadlineExceeded},
		{name: "ctx deadline passed", ctxDL: -ms, want: deadline.ServerStats{Refused: 1}, code: codes.DeadlineExceeded},
		{name: "ctx deadline passed, loose header", ctxDL: -ms, vals: []string{"500"}, want: deadline.ServerStats{Refused: 1}, code: codes.DeadlineExceeded},
		{name: "below minimum", min: 50 * ms, ctxDL: 500 * ms, vals: []string{"49"}, want: deadline.ServerStats{Refused: 1}, code: codes.DeadlineExceeded},
		{name: "at minimum", min: 50 * ms, vals: []string{"50"}, wantDL: 50 * ms, want: deadline.ServerStats{Tightened: 1}},
		{name: "minimum without any deadline", min: 50 * ms},
		{name: "malformed", ctxDL: 500 * ms, vals: []string{"-1"}, wantDL: 500 * ms, want: deadline.ServerStats{Malformed: 1}},
		{name: "malformed unit", vals: []string{"100ms"}, want: deadline.ServerStats{Malformed: 1}},
		{name: "malformed zero is not a refusal", ctxDL: 500 * ms, vals: []string{" 0"}, wantDL: 500 * ms, want: deadline.ServerStats{Malformed: 1}},
		{name: "several values", ctxDL: 500 * ms, vals: []string{"1", "2"}, wantDL: 500 * ms, want: deadline.ServerStats{Malformed: 1}},
		{name: "empty value", ctxDL: 500 * ms, vals: []string{""}, wantDL: 500 * ms, want: deadline.ServerStats{Malformed: 1}},
		{name: "too many digits", ctxDL: 500 * ms, vals: []string{"00000000001"}, wantDL: 500 * ms, want: deadline.ServerStats{Malformed: 1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// In a synctest bubble: Apply reads the real clock, which
			// stands still while the bubble's goroutine runs.
			synctest.Test(t, func(t *testing.T) {
				base := time.Now() // the real clock, standing still in the bubble
				s := deadline.NewServer(deadline.ServerConfig{MinRemaining: tc.min})
				var dl time.Time
				if tc.ctxDL != 0 {
					dl = base.Add(tc.ctxDL)
				}
				in := incoming(dl, tc.vals...)
				ctx, cancel, err := s.Apply(in)
				require.NotNil(t, cancel)
				defer cancel()
				assert.Equal(t, tc.code, status.Code(err))
				assert.Equal(t, tc.want, s.Stats())
				if err != nil {
					assert.Equal(t, in, ctx)
					return
				}
				got, ok := ctx.Deadline()
				if tc.wantDL == 0 {
					assert.False(t, ok, "no deadline expected, got %v", got)
				} else {
					assert.True(t, ok)
					assert.Equal(t, base.Add(tc.wantDL), got)
				}
				if s.Stats().Tightened == 0 {
					assert.Equal(t, in, ctx, "the context is passed through untouched")
				}
				// Metadata stays visible to the handler.
				assert.Equal(t, []string{"1"}, metadata.ValueFromIncomingContext(ctx, "x-other"))
			})
		})
	}
}

func TestServerRefusesWhenCallerLeft(t *testing.T) {
	s := deadline.NewServer(deadline.ServerConfig{})
	gone, cancel := context.WithCancel(incoming(time.Time{}, "500"))
	cancel()
	_, done, err := s.Apply(gone)
	done()
	assert.Equal(t, codes.Canceled, status.Code(err))

	expired, cancel := context.WithDeadline(incoming(time.Time{}), time.Now().Add(-time.Second))
	defer cancel()
	_, done, err = s.Apply(expired)
	done()
	assert.Equal(t, codes.DeadlineExceeded, status.Code(err))
	assert.Equal(t, deadline.ServerStats{Refused: 2}, s.Stats())
}

func TestZeroValues(t *testing.T) {
	var c deadline.Client
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	out, err := c.AttemptContext(ctx, time.Now())
	require.NoError(t, err)
	assert.Len(t, metadata.ValueFromOutgoingContext(out, deadline.MetadataKey), 1)
	call, done := c.CallContext(context.Background())
	done()
	assert.Equal(t, context.Background(), call)

	var s deadline.Server
	_, done, err = s.Apply(incoming(time.Time{}, "0"))
	done()
	assert.Equal(t, codes.DeadlineExceeded, status.Code(err))
	assert.Equal(t, deadline.ServerStats{Refused: 1}, s.Stats())
}

func TestServerStatsAccumulate(t *testing.T) {
	s := deadline.NewServer(deadline.ServerConfig{}) // on the real clock: nothing here depends on it
	for _, v := range []string{"1", "x", "0", "2", "+3"} {
		_, cancel, _ := s.Apply(incoming(time.Time{}, v))
		cancel()
	}
	assert.Equal(t, deadline.ServerStats{Refused: 1, Malformed: 2, Tightened: 2}, s.Stats())
}

func TestServerApplyAllocations(t *testing.T) {
	s := deadline.NewServer(deadline.ServerConfig{})
	dl := time.Now().Add(time.Hour)
	for name, tc := range map[string]struct {
		ctx context.Context
		max float64
	}{
		"no header":        {incoming(dl), 0},
		"header looser":    {incoming(dl, "999999999"), 1}, // grpc copies the value it finds
		"header malformed": {incoming(dl, "-1"), 1},
	} {
		allocs := testing.AllocsPerRun(200, func() {
			_, cancel, err := s.Apply(tc.ctx)
			if err != nil {
				t.Fatal(err)
			}
			cancel()
		})
		t.Logf("Apply, %s: %v allocs", name, allocs)
		assert.LessOrEqual(t, allocs, tc.max, name)
	}
}

func TestRemaining(t *testing.T) {
	_, ok := deadline.Remaining(context.Background())
	assert.False(t, ok)
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	left, ok := deadline.Remaining(ctx)
	assert.True(t, ok)
	assert.InDelta(t, float64(time.Hour), float64(left), float64(time.Minute))
	left, ok = deadline.Remaining(withDeadline(time.Now().Add(-time.Second)))
	assert.True(t, ok)
	assert.Zero(t, left)
}
