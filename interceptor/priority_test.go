package interceptor_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
	"github.com/stormguard/stormguard/priority"
	"github.com/stormguard/stormguard/semconv"
)

// priorities returns the stormguard-priority values of each attempt that
// reached o, in order (nil for an attempt without one).
func priorities(o *origin.Origin) [][]string {
	var out [][]string
	for _, c := range o.Calls() {
		out = append(out, c.Metadata.Get(semconv.PriorityKey))
	}
	return out
}

// TestPriorityIsSentOnEveryAttempt: a call's priority, when it is not
// Default, goes on every attempt (retries, hedges, streams); a call that
// sets none, or sets Default, sends no header.
func TestPriorityIsSentOnEveryAttempt(t *testing.T) {
	crit := priority.NewContext(t.Context(), priority.Critical)
	critical, sheddable := []string{"critical"}, []string{"sheddable"}

	t.Run("retries", func(t *testing.T) {
		e := newEnv(t, origin.FailFirst(2, codes.Unavailable), interceptor.WithBudget(nil))
		_, err := e.echo.Put(crit, &echov1.PutRequest{RequestId: "r"})
		require.NoError(t, err)
		assert.Equal(t, [][]string{critical, critical, critical}, priorities(e.origin))

		e.origin.Reset()
		_, err = e.echo.Put(priority.NewContext(t.Context(), priority.Sheddable), &echov1.PutRequest{RequestId: "s"})
		require.NoError(t, err)
		assert.Equal(t, [][]string{sheddable, sheddable, sheddable}, priorities(e.origin))

		e.origin.Reset()
		_, err = e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: "n"})
		require.NoError(t, err)
		_, err = e.echo.Put(priority.NewContext(crit, priority.Default), &echov1.PutRequest{RequestId: "d"})
		require.NoError(t, err)
		assert.Equal(t, [][]string{nil, nil, nil, nil, nil, nil}, priorities(e.origin), "no priority, or Default: no header")
	})

	t.Run("hedge", func(t *testing.T) {
		e := newEnv(t, firstAttemptStalls, interceptor.WithHedging(5*time.Millisecond, 2))
		_, err := e.echo.Put(crit, &echov1.PutRequest{RequestId: "h"})
		require.NoError(t, err)
		calls := e.origin.Calls()
		require.NotEmpty(t, calls)
		hedged := false
		for _, c := range calls {
			assert.Equal(t, critical, c.Metadata.Get(semconv.PriorityKey))
			hedged = hedged || len(c.Metadata.Get(semconv.PreviousAttemptsKey)) > 0
		}
		assert.True(t, hedged, "the hedge reached the origin")
	})

	t.Run("stream", func(t *testing.T) {
		e := newEnv(t, origin.Succeed())
		// Two streams: the first is sent before the connection is ready
		// (the Client watches it more closely), the second after.
		for _, id := range []string{"l1", "l2"} {
			s, err := e.echo.List(crit, &echov1.ListRequest{RequestId: id, Count: 1})
			require.NoError(t, err)
			_, err = s.Recv()
			require.NoError(t, err)
		}
		assert.Equal(t, [][]string{critical, critical}, priorities(e.origin))
	})

	t.Run("a stale value in the outgoing metadata", func(t *testing.T) {
		e := newEnv(t, origin.Succeed())
		// A proxy that copied its incoming metadata, then set a priority
		// of its own: one value goes, the call's.
		stale := metadata.AppendToOutgoingContext(t.Context(), semconv.PriorityKey, "critical")
		_, err := e.echo.Put(priority.NewContext(stale, priority.Sheddable), &echov1.PutRequest{RequestId: "p"})
		require.NoError(t, err)
		_, err = e.echo.Put(priority.NewContext(stale, priority.Default), &echov1.PutRequest{RequestId: "q"})
		require.NoError(t, err)
		// Without a priority of its own, the call sends the caller's
		// metadata as it is.
		_, err = e.echo.Put(stale, &echov1.PutRequest{RequestId: "m"})
		require.NoError(t, err)
		assert.Equal(t, [][]string{sheddable, nil, critical}, priorities(e.origin))
	})
}

// TestCallSpanRecordsThePriority: the call span has stormguard.priority
// when the call carries a priority, and no such attribute otherwise.
func TestCallSpanRecordsThePriority(t *testing.T) {
	e := newEnv(t, origin.Succeed())
	_, err := e.echo.Put(priority.NewContext(t.Context(), priority.Critical), &echov1.PutRequest{RequestId: "a"})
	require.NoError(t, err)
	_, err = e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: "b"})
	require.NoError(t, err)
	var got []string
	for _, s := range e.spans.GetSpans() {
		if s.Parent.IsValid() {
			continue // attempt spans
		}
		v := "-"
		for _, kv := range s.Attributes {
			if kv.Key == semconv.AttrPriority {
				v = kv.Value.Emit()
			}
		}
		got = append(got, v)
	}
	assert.Equal(t, []string{"critical", "-"}, got)
}
