package outlier

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
)

// lbJSON returns the policy's own config out of a service config.
func lbJSON(t testing.TB, sc string) json.RawMessage {
	t.Helper()
	var v struct {
		LoadBalancingConfig []map[string]json.RawMessage `json:"loadBalancingConfig"`
	}
	if err := json.Unmarshal([]byte(sc), &v); err != nil || len(v.LoadBalancingConfig) != 1 {
		t.Fatalf("service config %s: %v", sc, err)
	}
	js, ok := v.LoadBalancingConfig[0][Name]
	if !ok {
		t.Fatalf("service config %s: no %s", sc, Name)
	}
	return js
}

func TestServiceConfigRoundTrip(t *testing.T) {
	if got, want := ServiceConfig(Config{}), `{"loadBalancingConfig":[{"stormguard_outlier":{}}]}`; got != want {
		t.Errorf("ServiceConfig(Config{}) = %s, want %s", got, want)
	}
	for _, c := range []Config{
		{},
		{Child: "pick_first"},
		{
			Child: "round_robin", ChildConfig: json.RawMessage(`{}`),
			Interval: 250 * time.Millisecond, Window: 30 * time.Second,
			FailureRatio: 0.8, MinRequests: 50, MaxEjectionPercent: 20,
			BaseEjectionTime: 1500 * time.Millisecond, MaxEjectionTime: time.Hour,
			FailureCodes: []codes.Code{codes.Unavailable, codes.ResourceExhausted},
		},
	} {
		lc, err := parseConfig(lbJSON(t, ServiceConfig(c)))
		if err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		if want := c.withDefaults(); !reflect.DeepEqual(lc.cfg, want) {
			t.Errorf("round trip of %+v:\n got %+v\nwant %+v", c, lc.cfg, want)
		}
	}
}

func TestParseConfigDefaults(t *testing.T) {
	for _, js := range []string{"", "{}", "  "} {
		lc, err := parseConfig(json.RawMessage(js))
		if err != nil {
			t.Fatalf("%q: %v", js, err)
		}
		want := Config{
			Child: "round_robin", ChildConfig: json.RawMessage("{}"),
			Interval: 100 * time.Millisecond, Window: 10 * time.Second,
			FailureRatio: 0.5, MinRequests: 10, MaxEjectionPercent: 50,
			BaseEjectionTime: 5 * time.Second, MaxEjectionTime: 5 * time.Minute,
			FailureCodes: []codes.Code{codes.Unavailable, codes.DeadlineExceeded, codes.Internal, codes.Unknown, codes.DataLoss},
		}
		if !reflect.DeepEqual(lc.cfg, want) {
			t.Errorf("%q: %+v", js, lc.cfg)
		}
		if lc.child != balancer.Get("round_robin") || lc.codes != 1<<codes.Unavailable|1<<codes.DeadlineExceeded|1<<codes.Internal|1<<codes.Unknown|1<<codes.DataLoss {
			t.Errorf("%q: child %v, codes %b", js, lc.child, lc.codes)
		}
	}
	// The first registered child wins; code names in any case.
	lc, err := parseConfig(json.RawMessage(`{"childPolicy":[{"no_such_policy":{}},{"pick_first":{}}],"failureCodes":["unavailable"],"interval":"50ms"}`))
	if err != nil {
		t.Fatal(err)
	}
	if lc.cfg.Child != "pick_first" || !reflect.DeepEqual(lc.cfg.FailureCodes, []codes.Code{codes.Unavailable}) || lc.cfg.Interval != 50*time.Millisecond {
		t.Errorf("parsed %+v", lc.cfg)
	}
	// An empty list counts nothing as a failure (the policy only balances).
	if lc, err := parseConfig(json.RawMessage(`{"failureCodes":[]}`)); err != nil || lc.codes != 0 {
		t.Errorf("failureCodes []: %v, codes %b", err, lc.codes)
	}
}

func TestParseConfigErrors(t *testing.T) {
	for _, js := range []string{
		`{"failureRation":0.5}`,
		`{"interval":"soon"}`,
		`{"interval":"-1s"}`,
		`{"interval":"0.5ms"}`,
		`{"window":"50ms"}`,
		`{"interval":"1ms","window":"2s"}`,
		`{"baseEjectionTime":"-5s"}`,
		`{"maxEjectionTime":"x"}`,
		`{"failureRatio":-0.5}`,
		`{"failureRatio":1.5}`,
		`{"minRequests":-1}`,
		`{"minRequests":2000000}`,
		`{"maxEjectionPercent":101}`,
		`{"maxEjectionPercent":-1}`,
		`{"failureCodes":["OK"]}`,
		`{"failureCodes":["NOPE"]}`,
		`{"failureCodes":[14]}`,
		`{"childPolicy":[{"no_such_policy":{}}]}`,
		`{"childPolicy":[{"round_robin":{},"pick_first":{}}]}`,
		`{"childPolicy":[{"stormguard_outlier":{}}]}`,
		`{"childPolicy":{"round_robin":{}}}`,
		`{} {}`,
		`[]`,
		`{`,
	} {
		if _, err := parseConfig(json.RawMessage(js)); err == nil {
			t.Errorf("%s: accepted", js)
		} else if !strings.HasPrefix(err.Error(), "outlier: ") {
			t.Errorf("%s: error %q does not say where it comes from", js, err)
		}
	}
}

// TestDialOption: grpc.NewClient accepts the policy's service config, and
// rejects an invalid one with the policy's error.
func TestDialOption(t *testing.T) {
	cc, err := grpc.NewClient("passthrough:///example", grpc.WithTransportCredentials(insecure.NewCredentials()), DialOption(Config{}))
	if err != nil {
		t.Fatal(err)
	}
	_ = cc.Close()
	for _, c := range []Config{{FailureRatio: 2}, {ChildConfig: json.RawMessage(`{not json`)}, {Child: "no_such_policy"}} {
		_, err = grpc.NewClient("passthrough:///example", grpc.WithTransportCredentials(insecure.NewCredentials()), DialOption(c))
		if err == nil || !strings.Contains(err.Error(), "outlier") {
			t.Errorf("%+v: NewClient error %v, want the policy's", c, err)
		}
	}
}

func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(`{}`))
	f.Add([]byte(lbJSON(f, ServiceConfig(Config{Interval: time.Second, Window: time.Minute, FailureRatio: 0.7, MinRequests: 5, FailureCodes: []codes.Code{codes.Unavailable}}))))
	f.Add([]byte(`{"childPolicy":[{"pick_first":{"shuffleAddressList":true}}],"maxEjectionPercent":100}`))
	f.Fuzz(func(t *testing.T, js []byte) {
		lc, err := parseConfig(js)
		if err != nil {
			return
		}
		if err := lc.cfg.validate(); err != nil {
			t.Fatalf("accepted an invalid config: %v", err)
		}
		again, err := parseConfig(lbJSON(t, ServiceConfig(lc.cfg)))
		if err != nil {
			t.Fatalf("ServiceConfig(%+v) does not parse: %v", lc.cfg, err)
		}
		if a, b := compacted(t, again.cfg), compacted(t, lc.cfg); !reflect.DeepEqual(a, b) {
			t.Fatalf("round trip: %+v → %+v", b, a)
		}
	})
}

// compacted returns c with its ChildConfig compacted, for comparisons.
func compacted(t *testing.T, c Config) Config {
	var b bytes.Buffer
	if err := json.Compact(&b, c.ChildConfig); err != nil {
		t.Fatalf("ChildConfig %q: %v", c.ChildConfig, err)
	}
	c.ChildConfig = b.Bytes()
	return c
}
