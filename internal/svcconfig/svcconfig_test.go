package svcconfig

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const retryPolicy = `{"maxAttempts": 7, "initialBackoff": "0.01s", "maxBackoff": "1.5s", "backoffMultiplier": 3, "retryableStatusCodes": ["UNAVAILABLE", 8]}`

func TestParse(t *testing.T) {
	c, err := Parse(`{
	  "loadBalancingConfig": [{"round_robin": {}}],
	  "methodConfig": [
	    {"name": [{"service": "a.v1.A", "method": "Get"}], "timeout": "1s", "retryPolicy": ` + retryPolicy + `},
	    {"name": [{"service": "a.v1.A"}], "hedgingPolicy": {"maxAttempts": 4, "hedgingDelay": "0.02s", "nonFatalStatusCodes": ["UNAVAILABLE"]}},
	    {"name": [{}], "hedgingPolicy": {"maxAttempts": 2}}
	  ],
	  "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}
	}`)
	require.NoError(t, err)
	assert.Empty(t, c.Warnings)
	assert.Equal(t, &Throttling{MaxTokens: 10, TokenRatio: 0.1}, c.Throttling)

	get := c.Lookup("/a.v1.A/Get")
	require.NotNil(t, get)
	assert.Nil(t, get.Hedging)
	assert.Equal(t, &Retry{MaxAttempts: 7, InitialBackoff: 10 * time.Millisecond, MaxBackoff: 1500 * time.Millisecond,
		BackoffMultiplier: 3, RetryableStatusCodes: []codes.Code{codes.Unavailable, codes.ResourceExhausted}}, get.Retry)

	put := c.Lookup("/a.v1.A/Put") // the service's
	require.NotNil(t, put)
	assert.Nil(t, put.Retry)
	assert.Equal(t, &Hedging{MaxAttempts: 4, HedgingDelay: 20 * time.Millisecond, NonFatalStatusCodes: []codes.Code{codes.Unavailable}}, put.Hedging)

	other := c.Lookup("/b.v1.B/Get") // the default
	require.NotNil(t, other)
	assert.Equal(t, &Hedging{MaxAttempts: 2}, other.Hedging)

	var none *Config
	assert.Nil(t, none.Lookup("/a.v1.A/Get"))
	empty, err := Parse(`{}`)
	require.NoError(t, err)
	assert.Nil(t, empty.Lookup("/a.v1.A/Get"))
	assert.Nil(t, empty.Throttling)
}

// TestParseAgreesWithGRPC: Parse accepts a service config exactly when
// grpc-go does (a config grpc applies is one the suite reads), checked
// through grpc.NewClient's validation of a default service config.
func TestParseAgreesWithGRPC(t *testing.T) {
	mc := func(name, policy string) string {
		return `{"methodConfig": [{"name": [` + name + `]` + policy + `}]}`
	}
	retry := func(fields string) string { return `, "retryPolicy": {` + fields + `}` }
	valid := `"maxAttempts": 3, "initialBackoff": "0.1s", "maxBackoff": "1s", "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]`
	for _, js := range []string{
		`{}`,
		mc(`{"service": "a.A"}`, retry(valid)),
		mc(`{"service": "a.A", "method": "M"}`, retry(valid)),
		mc(`{}`, retry(valid)),
		mc(`{"method": "M"}`, retry(valid)),
		`{"methodConfig": [{"name": [{"service": "a.A"}]}, {"name": [{"service": "a.A"}]}]}`,
		mc(`{"service": "a.A"}`, retry(strings.Replace(valid, `"maxAttempts": 3`, `"maxAttempts": 1`, 1))),
		mc(`{"service": "a.A"}`, retry(strings.Replace(valid, `"maxAttempts": 3`, `"maxAttempts": 9`, 1))),
		mc(`{"service": "a.A"}`, retry(strings.Replace(valid, `"0.1s"`, `"0s"`, 1))),
		mc(`{"service": "a.A"}`, retry(strings.Replace(valid, `"0.1s"`, `"-1s"`, 1))),
		mc(`{"service": "a.A"}`, retry(strings.Replace(valid, `"0.1s"`, `"100ms"`, 1))),
		mc(`{"service": "a.A"}`, retry(strings.Replace(valid, `"1s"`, `"1.0000000001s"`, 1))),
		mc(`{"service": "a.A"}`, retry(strings.Replace(valid, `"backoffMultiplier": 2`, `"backoffMultiplier": 0`, 1))),
		mc(`{"service": "a.A"}`, retry(strings.Replace(valid, `["UNAVAILABLE"]`, `[]`, 1))),
		mc(`{"service": "a.A"}`, retry(strings.Replace(valid, `["UNAVAILABLE"]`, `["NOT_A_CODE"]`, 1))),
		mc(`{"service": "a.A"}`, retry(strings.Replace(valid, `, "initialBackoff": "0.1s"`, ``, 1))),
		`{"retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}}`,
		`{"retryThrottling": {"maxTokens": 0, "tokenRatio": 0.1}}`,
		`{"retryThrottling": {"maxTokens": 1001, "tokenRatio": 0.1}}`,
		`{"retryThrottling": {"maxTokens": 10, "tokenRatio": 0}}`,
		`{"methodConfig": [], "retryThrottling": {"maxTokens": 0, "tokenRatio": 0.1}}`,
		`{"methodConfig": [], "retryThrottling": {"maxTokens": 10, "tokenRatio": -1}}`,
		`{"methodConfig": "nope"}`,
		`not json`,
	} {
		t.Run(js, func(t *testing.T) {
			_, err := Parse(js)
			cc, gerr := grpc.NewClient("passthrough:///x", grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithDefaultServiceConfig(js))
			if gerr == nil {
				cc.Close()
			}
			assert.Equal(t, gerr == nil, err == nil, "grpc: %v; Parse: %v", gerr, err)
		})
	}
}

// TestParseHedging: a hedgingPolicy grpc-go ignores is read; an invalid
// one, or one beside a retryPolicy, is dropped with a warning while the
// rest of the config stands.
func TestParseHedging(t *testing.T) {
	for _, tc := range []struct {
		policy string
		want   *Hedging
	}{
		{`"hedgingPolicy": {"maxAttempts": 3}`, &Hedging{MaxAttempts: 3}},
		{`"hedgingPolicy": {"maxAttempts": 12, "hedgingDelay": "1.5s"}`, &Hedging{MaxAttempts: 12, HedgingDelay: 1500 * time.Millisecond}},
		{`"hedgingPolicy": {"maxAttempts": 1}`, nil},
		{`"hedgingPolicy": {"maxAttempts": 3, "hedgingDelay": "-1s"}`, nil},
		{`"hedgingPolicy": {"maxAttempts": 3, "hedgingDelay": "soon"}`, nil},
		{`"retryPolicy": ` + retryPolicy + `, "hedgingPolicy": {"maxAttempts": 3}`, nil},
	} {
		t.Run(tc.policy, func(t *testing.T) {
			c, err := Parse(`{"methodConfig": [{"name": [{"service": "a.A"}], ` + tc.policy + `}]}`)
			require.NoError(t, err)
			m := c.Lookup("/a.A/M")
			require.NotNil(t, m)
			assert.Equal(t, tc.want, m.Hedging)
			assert.Equal(t, tc.want == nil, len(c.Warnings) == 1, "warnings: %v", c.Warnings)
		})
	}
}

func TestParseBounded(t *testing.T) {
	_, err := Parse(`{"x": "` + strings.Repeat("a", MaxJSON) + `"}`)
	assert.ErrorContains(t, err, "more than")
}

func TestParseDuration(t *testing.T) {
	for s, want := range map[string]time.Duration{
		"0s": 0, "1s": time.Second, "0.025s": 25 * time.Millisecond, "-2.5s": -2500 * time.Millisecond,
		"0.000000001s": 1, "9223372035s": 9223372035 * time.Second,
	} {
		got, err := ParseDuration(s)
		require.NoError(t, err, s)
		assert.Equal(t, want, got, s)
	}
	for _, s := range []string{"", "s", "1", "1ms", "1.s", ".5s", "1.0000000001s", "+1s", "1e3s", "--1s", "9223372037s", "99999999999999999999s", " 1s"} {
		_, err := ParseDuration(s)
		assert.Error(t, err, s)
	}
}

func FuzzParse(f *testing.F) {
	f.Add(`{"methodConfig": [{"name": [{"service": "a.A"}], "retryPolicy": ` + retryPolicy + `}], "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}}`)
	f.Add(`{"methodConfig": [{"name": [{}], "hedgingPolicy": {"maxAttempts": 3, "hedgingDelay": "0.1s"}}]}`)
	f.Fuzz(func(t *testing.T, js string) {
		c, err := Parse(js)
		if err != nil {
			return
		}
		for _, m := range c.methods {
			if r := m.Retry; r != nil && (r.MaxAttempts < 2 || r.InitialBackoff <= 0 || r.MaxBackoff <= 0 || !(r.BackoffMultiplier > 0) || len(r.RetryableStatusCodes) == 0) {
				t.Fatalf("an invalid retryPolicy was accepted: %+v", r)
			}
			if h := m.Hedging; h != nil && (h.MaxAttempts < 2 || h.HedgingDelay < 0 || m.Retry != nil) {
				t.Fatalf("an invalid hedgingPolicy was accepted: %+v", h)
			}
		}
		if th := c.Throttling; th != nil && !(th.MaxTokens > 0 && th.MaxTokens <= 1000 && th.TokenRatio > 0) {
			t.Fatalf("invalid retryThrottling accepted: %+v", th)
		}
	})
}

func FuzzParseDuration(f *testing.F) {
	for _, s := range []string{"1s", "0.5s", "-1.000000001s", "1e3s", "9223372036s"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParseDuration(s)
		if err != nil {
			return
		}
		// What it accepts, time.ParseDuration reads the same way.
		want, err := time.ParseDuration(s)
		if err != nil || want != d {
			t.Fatalf("%q: %v, time.ParseDuration: %v, %v", s, d, want, err)
		}
	})
}
