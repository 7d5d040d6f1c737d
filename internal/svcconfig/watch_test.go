package svcconfig

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
)

// TestWatchFollowsTheResolver: a real ClientConn dialed with a Watch's
// builders around a manual resolver: the Watch reads each service config
// the resolver gives (its JSON, which grpc keeps to itself), a new
// generation each time; an update without a config brings the default
// back, and an invalid one changes nothing, as in grpc.
func TestWatchFollowsTheResolver(t *testing.T) {
	r := manual.NewBuilderWithScheme("svcconfig-watch-test")
	built := make(chan struct{})
	r.BuildCallback = func(resolver.Target, resolver.ClientConn, resolver.BuildOptions) { close(built) }
	resolver.Register(r)
	def, err := Parse(`{"methodConfig": [{"name": [{}], "hedgingPolicy": {"maxAttempts": 2}}]}`)
	require.NoError(t, err)
	w := NewWatch(def)
	cfg, th, gen0 := w.Current()
	assert.Same(t, def, cfg)
	assert.Nil(t, th)
	assert.False(t, w.Following())
	assert.Zero(t, w.Endpoints())

	cc, err := grpc.NewClient("svcconfig-watch-test:///x", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithResolvers(w.Builders("svcconfig-watch-test", "no-such-scheme")...))
	require.NoError(t, err)
	defer cc.Close()
	cc.Connect() // builds the resolver
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	select {
	case <-built:
	case <-ctx.Done():
		t.Fatal("the resolver was never built")
	}
	assert.True(t, w.Following())

	push := func(js string) {
		t.Helper()
		s := resolver.State{Addresses: []resolver.Address{{Addr: "127.0.0.1:1"}}}
		if js != "" {
			s.ServiceConfig = r.CC().ParseServiceConfig(js)
		}
		_ = r.CC().UpdateState(s) // an invalid config is an error
	}

	push(`{"methodConfig": [{"name": [{"service": "a.A"}], "retryPolicy": ` + retryPolicy + `}], "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.5}}`)
	cfg, th, gen1 := w.Current()
	require.NotNil(t, cfg)
	assert.Greater(t, gen1, gen0)
	require.NotNil(t, cfg.Lookup("/a.A/M").Retry)
	assert.Equal(t, 7, cfg.Lookup("/a.A/M").Retry.MaxAttempts, "not capped at grpc's 5")
	assert.Nil(t, cfg.Lookup("/b.B/M"))
	require.NotNil(t, th)
	assert.Equal(t, 10.0, th.Tokens())
	th.Failure()

	// The same throttling in the next config keeps its tokens.
	push(`{"methodConfig": [{"name": [{"service": "a.A"}], "retryPolicy": ` + retryPolicy + `}], "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.5}}`)
	_, th2, gen2 := w.Current()
	assert.Greater(t, gen2, gen1)
	assert.Same(t, th, th2)
	assert.Equal(t, 9.0, th2.Tokens())

	// An invalid config: grpc keeps the one it had, and so does the Watch.
	push(`{"methodConfig": [{"name": [{"service": "a.A"}], "retryPolicy": {"maxAttempts": 1}}]}`)
	cfg3, _, gen3 := w.Current()
	assert.Greater(t, gen3, gen2, "a new update, if not a new config")
	assert.NotNil(t, cfg3.Lookup("/a.A/M").Retry)
	assert.Equal(t, 1, w.Endpoints())

	// No config: the default applies again.
	push("")
	cfg4, th4, gen4 := w.Current()
	assert.Greater(t, gen4, gen3)
	assert.Same(t, def, cfg4)
	assert.Nil(t, th4)
}

func TestThrottle(t *testing.T) {
	var none *Throttle
	none.Failure()
	none.Success()
	assert.False(t, none.Throttled())

	c, err := Parse(`{"retryThrottling": {"maxTokens": 4, "tokenRatio": 0.25}}`)
	require.NoError(t, err)
	th := newThrottle(c, nil)
	assert.False(t, th.Throttled())
	th.Failure()
	assert.False(t, th.Throttled(), "3 of 4: above half")
	th.Failure()
	assert.True(t, th.Throttled(), "2 of 4: at half")
	th.Success()
	assert.False(t, th.Throttled(), "2.25 of 4")
	for range 100 {
		th.Failure()
	}
	assert.Equal(t, 0.0, th.Tokens(), "never below 0")
	for range 100 {
		th.Success()
	}
	assert.Equal(t, 4.0, th.Tokens(), "never above maxTokens")

	other, err := Parse(`{"retryThrottling": {"maxTokens": 5, "tokenRatio": 0.25}}`)
	require.NoError(t, err)
	assert.NotSame(t, th, newThrottle(other, th), "new settings, new tokens")
	assert.Nil(t, newThrottle(nil, th))
}
