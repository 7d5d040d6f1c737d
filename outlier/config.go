package outlier

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/serviceconfig"

	"github.com/stormguard/stormguard/internal/codename"
)

// Name is the name the policy is registered under, for the
// loadBalancingConfig of a service config.
const Name = "stormguard_outlier"

// Config is the policy's configuration. The zero value is the defaults;
// zero fields take their default.
type Config struct {
	// Child is the name of the wrapped policy; "" → "round_robin".
	Child string
	// ChildConfig is the child's own JSON configuration; nil → {}. Invalid
	// JSON makes the service config invalid (grpc.NewClient fails).
	ChildConfig json.RawMessage
	// Interval is the length of one counting bucket and how often the
	// endpoints are compared and ejection times checked; 0 → 100ms.
	// An endpoint with Config.MinRequests new failures is compared at once.
	Interval time.Duration
	// Window is how far back outcomes count; 0 → 10s. Each comparison uses
	// the most recent part of the window that holds MinRequests requests of
	// the endpoint and MinRequests of the rest. At most 1000 × Interval.
	Window time.Duration
	// FailureRatio is the share of failed requests at or above which an
	// endpoint may be ejected; 0 → 0.5. In (0, 1].
	FailureRatio float64
	// MinRequests is how many requests an endpoint, and the other
	// endpoints together, must have had before it may be ejected; 0 → 10.
	MinRequests int
	// MaxEjectionPercent bounds the share of endpoints ejected at once;
	// 0 → 50. One endpoint may always be ejected when there are two or
	// more; the last connected endpoint never is.
	MaxEjectionPercent int
	// BaseEjectionTime is how long a first ejection lasts; the n-th ejection
	// in a row lasts n times as long; 0 → 5s.
	BaseEjectionTime time.Duration
	// MaxEjectionTime caps the ejection time (but not below
	// BaseEjectionTime); 0 → 5m.
	MaxEjectionTime time.Duration
	// FailureCodes are the status codes that count as a failure of the
	// endpoint; nil → Unavailable, DeadlineExceeded, Internal, Unknown and
	// DataLoss. Every other code counts as a success, except Canceled (the
	// caller's decision), which is not counted at all.
	FailureCodes []codes.Code
}

// The defaults of Config; docs/outlier.md gives the reasons.
const (
	defaultChild              = "round_robin"
	defaultInterval           = 100 * time.Millisecond
	defaultWindow             = 10 * time.Second
	defaultFailureRatio       = 0.5
	defaultMinRequests        = 10
	defaultMaxEjectionPercent = 50
	defaultBaseEjectionTime   = 5 * time.Second
	defaultMaxEjectionTime    = 5 * time.Minute
	// maxBuckets bounds Window / Interval, and so each endpoint's memory.
	maxBuckets = 1000
	// maxMinRequests bounds MinRequests (a larger value never ejects).
	maxMinRequests = 1 << 20
)

// defaultFailureCodes are the codes that count as an endpoint's failure
// when Config.FailureCodes is nil.
var defaultFailureCodes = []codes.Code{codes.Unavailable, codes.DeadlineExceeded, codes.Internal, codes.Unknown, codes.DataLoss}

// withDefaults returns c with its zero fields set to the defaults.
func (c Config) withDefaults() Config {
	if c.Child == "" {
		c.Child = defaultChild
	}
	if len(bytes.TrimSpace(c.ChildConfig)) == 0 {
		c.ChildConfig = json.RawMessage("{}")
	}
	if c.Interval == 0 {
		c.Interval = defaultInterval
	}
	if c.Window == 0 {
		c.Window = max(defaultWindow, c.Interval)
	}
	if c.FailureRatio == 0 {
		c.FailureRatio = defaultFailureRatio
	}
	if c.MinRequests == 0 {
		c.MinRequests = defaultMinRequests
	}
	if c.MaxEjectionPercent == 0 {
		c.MaxEjectionPercent = defaultMaxEjectionPercent
	}
	if c.BaseEjectionTime == 0 {
		c.BaseEjectionTime = defaultBaseEjectionTime
	}
	if c.MaxEjectionTime == 0 {
		c.MaxEjectionTime = max(defaultMaxEjectionTime, c.BaseEjectionTime)
	}
	if c.FailureCodes == nil {
		c.FailureCodes = defaultFailureCodes
	}
	return c
}

// validate reports the first absurd value of c (after withDefaults).
func (c Config) validate() error {
	switch {
	case c.Interval < time.Millisecond:
		return fmt.Errorf("outlier: interval %v: must be at least 1ms", c.Interval)
	case c.Window < c.Interval:
		return fmt.Errorf("outlier: window %v: must be at least the interval %v", c.Window, c.Interval)
	case c.Window/c.Interval > maxBuckets:
		return fmt.Errorf("outlier: window %v: must be at most %d intervals of %v", c.Window, maxBuckets, c.Interval)
	case !(c.FailureRatio > 0 && c.FailureRatio <= 1): // also rejects NaN
		return fmt.Errorf("outlier: failure ratio %v: must be in (0, 1]", c.FailureRatio)
	case c.MinRequests < 1 || c.MinRequests > maxMinRequests:
		return fmt.Errorf("outlier: min requests %d: must be in [1, %d]", c.MinRequests, maxMinRequests)
	case c.MaxEjectionPercent < 0 || c.MaxEjectionPercent > 100:
		return fmt.Errorf("outlier: max ejection percent %d: must be in [0, 100]", c.MaxEjectionPercent)
	case c.BaseEjectionTime < 0:
		return fmt.Errorf("outlier: base ejection time %v: must not be negative", c.BaseEjectionTime)
	case c.MaxEjectionTime < 0:
		return fmt.Errorf("outlier: max ejection time %v: must not be negative", c.MaxEjectionTime)
	}
	for _, code := range c.FailureCodes {
		if code == codes.OK || code > codes.Unauthenticated {
			return fmt.Errorf("outlier: failure code %s: must be a non-OK gRPC code", codename.Name(code))
		}
	}
	return nil
}

// codeMask returns the set of codes as bits.
func codeMask(cs []codes.Code) uint32 {
	var m uint32
	for _, c := range cs {
		if c <= codes.Unauthenticated {
			m |= 1 << c
		}
	}
	return m
}

// jsonConfig is Config as the service config spells it.
type jsonConfig struct {
	ChildPolicy        []map[string]json.RawMessage `json:"childPolicy,omitempty"`
	Interval           string                       `json:"interval,omitempty"`
	Window             string                       `json:"window,omitempty"`
	FailureRatio       float64                      `json:"failureRatio,omitempty"`
	MinRequests        int                          `json:"minRequests,omitempty"`
	MaxEjectionPercent int                          `json:"maxEjectionPercent,omitempty"`
	BaseEjectionTime   string                       `json:"baseEjectionTime,omitempty"`
	MaxEjectionTime    string                       `json:"maxEjectionTime,omitempty"`
	FailureCodes       *[]string                    `json:"failureCodes,omitempty"`
}

// ServiceConfig returns a gRPC service config, as JSON, whose
// loadBalancingConfig is this policy with c. Zero fields are left out, so
// the policy's defaults apply to them. Pass it to grpc.WithDefaultServiceConfig,
// or merge its loadBalancingConfig into a service config of your own.
func ServiceConfig(c Config) string { return serviceConfig(Name, c) }

// serviceConfig is ServiceConfig for the policy registered as name.
func serviceConfig(name string, c Config) string {
	js := jsonConfig{
		Interval:           durationJSON(c.Interval),
		Window:             durationJSON(c.Window),
		FailureRatio:       c.FailureRatio,
		MinRequests:        c.MinRequests,
		MaxEjectionPercent: c.MaxEjectionPercent,
		BaseEjectionTime:   durationJSON(c.BaseEjectionTime),
		MaxEjectionTime:    durationJSON(c.MaxEjectionTime),
	}
	if c.Child != "" || len(c.ChildConfig) > 0 {
		child, cfg := c.Child, c.ChildConfig
		if child == "" {
			child = defaultChild
		}
		if len(bytes.TrimSpace(cfg)) == 0 {
			cfg = json.RawMessage("{}")
		}
		js.ChildPolicy = []map[string]json.RawMessage{{child: cfg}}
	}
	if c.FailureCodes != nil {
		names := make([]string, 0, len(c.FailureCodes))
		for _, code := range c.FailureCodes {
			names = append(names, codename.Name(code))
		}
		js.FailureCodes = &names
	}
	b, err := json.Marshal(map[string]any{"loadBalancingConfig": []map[string]jsonConfig{{name: js}}})
	if err != nil {
		// Only an invalid ChildConfig gets here: write a config that
		// grpc.NewClient rejects with this error, rather than another one.
		b, _ = json.Marshal(map[string]any{"loadBalancingConfig": []map[string]any{{name: map[string]string{"childPolicy": "invalid ChildConfig: " + err.Error()}}}})
	}
	return string(b)
}

// DialOption returns grpc.WithDefaultServiceConfig(ServiceConfig(c)): the
// policy with c, unless the name resolver supplies a service config.
func DialOption(c Config) grpc.DialOption {
	return grpc.WithDefaultServiceConfig(ServiceConfig(c))
}

// durationJSON spells d as a protobuf JSON duration ("0.1s"); "" for 0.
func durationJSON(d time.Duration) string {
	if d == 0 {
		return ""
	}
	return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + "s"
}

// parseDuration reads a service-config duration: "0.1s", or anything
// time.ParseDuration accepts ("100ms"); "" is 0.
func parseDuration(field, s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("outlier: %s %q: %v", field, s, err)
	}
	if d <= 0 {
		return 0, fmt.Errorf("outlier: %s %q: must be positive", field, s)
	}
	return d, nil
}

// lbConfig is the parsed configuration handed to the balancer.
type lbConfig struct {
	serviceconfig.LoadBalancingConfig
	cfg      Config // with defaults
	child    balancer.Builder
	childCfg serviceconfig.LoadBalancingConfig // nil when the child takes none
	codes    uint32
}

// parseConfig parses the policy's JSON configuration. Unknown fields,
// absurd values and an unregistered child are errors (grpc then rejects the
// service config).
func parseConfig(js json.RawMessage) (*lbConfig, error) {
	var jc jsonConfig
	if len(bytes.TrimSpace(js)) > 0 {
		dec := json.NewDecoder(bytes.NewReader(js))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&jc); err != nil {
			return nil, fmt.Errorf("outlier: config: %v", err)
		}
		if dec.More() {
			return nil, errors.New("outlier: config: trailing data")
		}
	}
	var c Config
	var err error
	if c.Interval, err = parseDuration("interval", jc.Interval); err != nil {
		return nil, err
	}
	if c.Window, err = parseDuration("window", jc.Window); err != nil {
		return nil, err
	}
	if c.BaseEjectionTime, err = parseDuration("baseEjectionTime", jc.BaseEjectionTime); err != nil {
		return nil, err
	}
	if c.MaxEjectionTime, err = parseDuration("maxEjectionTime", jc.MaxEjectionTime); err != nil {
		return nil, err
	}
	c.FailureRatio, c.MinRequests, c.MaxEjectionPercent = jc.FailureRatio, jc.MinRequests, jc.MaxEjectionPercent
	if jc.FailureCodes != nil {
		c.FailureCodes = []codes.Code{}
		for _, name := range *jc.FailureCodes {
			code, ok := codename.Parse(strings.ToUpper(name))
			if !ok {
				return nil, fmt.Errorf("outlier: failure code %q: not a gRPC code name", name)
			}
			c.FailureCodes = append(c.FailureCodes, code)
		}
	}
	// The first child policy that is registered, as gRPC's own parsers do.
	for _, entry := range jc.ChildPolicy {
		if len(entry) != 1 {
			return nil, fmt.Errorf("outlier: childPolicy entry with %d policies: want exactly one", len(entry))
		}
		for name, cfg := range entry {
			if c.Child == "" && balancer.Get(name) != nil {
				c.Child, c.ChildConfig = name, cfg
			}
		}
	}
	if len(jc.ChildPolicy) > 0 && c.Child == "" {
		return nil, errors.New("outlier: childPolicy: none of the policies is registered")
	}
	if c.Child == Name {
		return nil, errors.New("outlier: childPolicy: the policy cannot wrap itself")
	}
	c = c.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	child := balancer.Get(c.Child)
	if child == nil {
		return nil, fmt.Errorf("outlier: child policy %q is not registered", c.Child)
	}
	out := &lbConfig{cfg: c, child: child, codes: codeMask(c.FailureCodes)}
	if p, ok := child.(balancer.ConfigParser); ok {
		if out.childCfg, err = p.ParseConfig(c.ChildConfig); err != nil {
			return nil, fmt.Errorf("outlier: child policy %q: %v", c.Child, err)
		}
	}
	return out, nil
}
