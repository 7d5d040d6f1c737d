package interceptor_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// One broken method never gets a method that serves refused: Put fails
// every attempt, enough of them to open a breaker, while Get, called
// rarely, serves. Every Get is sent and succeeds (the old per-target
// breaker refused all ten), and Put stays refused by its own breaker.
func TestBrokenMethodDoesNotRefuseAnother(t *testing.T) {
	e := newEnv(t, func(c origin.Call) origin.Reply {
		if c.Method == put {
			return origin.Reply{Code: codes.Unavailable, Message: "Put is broken"}
		}
		return origin.Reply{}
	})
	for i := range 25 {
		_, _ = e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: fmt.Sprint("p", i)}, interceptor.MaxAttempts(1))
	}
	_, err := e.echo.Put(t.Context(), &echov1.PutRequest{RequestId: "refused"})
	require.Equal(t, interceptor.ReasonBreaker, interceptor.RefusedBy(err), "Put's breaker is open")
	refused := 0
	for i := range 10 {
		if _, err := e.echo.Get(t.Context(), &echov1.GetRequest{RequestId: fmt.Sprint("g", i)}); err != nil {
			refused++
			t.Logf("Get %d: %v", i, err)
		}
	}
	assert.Zero(t, refused, "Gets refused because Put fails")
	assert.Equal(t, 10, e.origin.Count(get))
	ts := e.guard.Targets()
	require.Len(t, ts, 1)
	require.Len(t, ts[0].Breakers, 2, "one breaker per method")
	assert.Equal(t, get, ts[0].Breakers[0].Method)
	assert.Equal(t, "closed", ts[0].Breakers[0].State)
	assert.Equal(t, put, ts[0].Breakers[1].Method)
	assert.Equal(t, "open", ts[0].Breakers[1].State)
}
