package interceptor

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/internal/clock"
	"github.com/stormguard/stormguard/internal/engine"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// failed remembers a failed call of route r with req in ctx's scope at
// now, as a unary call that sent one attempt would be.
func failed(c *Client, r *route, ctx context.Context, req any, err error) {
	k := &call{client: c, route: r, lastErr: err, scope: callerScope(ctx)}
	k.e.Rule = &r.eng.Rule
	now := c.now()
	k.e.Begin(&r.eng, now, 0)
	var a engine.Attempt
	k.e.Open(&a, engine.First, now) // the one attempt it sent
	k.remember(req, err)
}

// The remembered calls stay within returnMaxBytes whatever the servers
// send, and hold more than ten thousand calls of contexts that live on.
func TestReturnTableBytes(t *testing.T) {
	c := NewClient()
	r := c.routeOf("x", "/echo.v1.EchoService/Put")
	big := status.Error(codes.Unavailable, strings.Repeat("é", 32<<10))
	var cancels []context.CancelFunc
	defer func() {
		for _, cancel := range cancels {
			cancel()
		}
	}()
	for i := range 100_000 {
		ctx, cancel := context.WithCancel(context.Background())
		cancels = append(cancels, cancel)
		failed(c, r, ctx, &echov1.PutRequest{RequestId: fmt.Sprint(i)}, big)
	}
	n, bytes := 0, 0
	t2 := c.returns.Load()
	for i := range t2.shards {
		sh := &t2.shards[i]
		for _, head := range sh.m {
			for e := head; e != nil; e = e.next {
				n++
				assert.LessOrEqual(t, len(e.msg), maxRememberedMsg)
				assert.True(t, strings.HasSuffix(e.msg, "…"))
			}
		}
		bytes += sh.bytes
	}
	t.Logf("100,000 failed calls with 64 KiB messages: %d remembered in %d bytes", n, bytes)
	assert.LessOrEqual(t, bytes, returnMaxBytes)
	assert.Greater(t, n, 10_000)
}

// A call whose context is done, or whose route healed after it failed,
// no longer comes back, and a window after the last failure the whole
// table goes.
func TestReturnTableForgets(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	c := NewClient(clock.ClientOption(func() time.Time { return now }, nil).(ClientOption))
	r := c.routeOf("x", "/echo.v1.EchoService/Put")
	err := status.Error(codes.Unavailable, "down")
	done, cancel := context.WithCancel(context.Background())
	live, cancelLive := context.WithCancel(context.Background())
	defer cancelLive()
	req := &echov1.PutRequest{RequestId: "a"}
	failed(c, r, done, req, err)
	failed(c, r, live, req, err)
	require.NotNil(t, c.cameBack(callerScope(done), r, req, now))
	require.NotNil(t, c.cameBack(callerScope(live), r, &echov1.PutRequest{RequestId: "a"}, now), "the same content in a new message")
	assert.Nil(t, c.cameBack(callerScope(live), r, &echov1.PutRequest{RequestId: "b"}, now), "other content")
	cancel()
	assert.Nil(t, c.cameBack(callerScope(done), r, req, now), "its context is done")

	now = now.Add(time.Second)
	r.eng.Probes.Lock(now)
	r.eng.Probes.Heal(now)
	assert.Nil(t, c.cameBack(callerScope(live), r, req, now), "failed before its route healed")
	now = now.Add(time.Second)
	failed(c, r, live, req, err)
	assert.NotNil(t, c.cameBack(callerScope(live), r, req, now), "failed after")

	now = now.Add(returnWindow + time.Second)
	assert.Nil(t, c.cameBack(callerScope(live), r, req, now))
	assert.Nil(t, c.returns.Load(), "a window without failures: the table is gone")
}

// A code that says the call was served (NOT_FOUND, INVALID_ARGUMENT, ...)
// is not remembered: a loop that sends such a call again adds no load to a
// failing dependency. Those loops retry are.
func TestReturnTableCodes(t *testing.T) {
	c := NewClient()
	r := c.routeOf("x", "/echo.v1.EchoService/Put")
	for code, want := range map[codes.Code]bool{
		codes.Unavailable: true, codes.Aborted: true, codes.Unknown: true, codes.Internal: true,
		codes.ResourceExhausted: true, codes.DeadlineExceeded: true, codes.DataLoss: true,
		codes.NotFound: false, codes.InvalidArgument: false, codes.PermissionDenied: false,
		codes.FailedPrecondition: false, codes.AlreadyExists: false, codes.Unimplemented: false,
	} {
		ctx, cancel := context.WithCancel(context.Background())
		req := &echov1.PutRequest{RequestId: code.String()}
		failed(c, r, ctx, req, status.Error(code, "x"))
		assert.Equal(t, want, c.cameBack(callerScope(ctx), r, req, c.now()) != nil, code.String())
		cancel()
	}
}
