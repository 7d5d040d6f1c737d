package svcconfig

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
)

// Config is what a service config says about retries: the retry and
// hedging policies of its method configs, and its retry throttling.
//
// A Config is immutable once parsed and safe for concurrent use.
type Config struct {
	// methods maps "/pkg.Svc/Method", "/pkg.Svc/" (a whole service) and ""
	// (every method) to the method config that names it.
	methods map[string]*Method
	// Throttling is the service config's retryThrottling; nil: none.
	Throttling *Throttling
	// Warnings says what Parse dropped (a hedgingPolicy it could not use).
	Warnings []string
}

// Method is the retry policy or the hedging policy of one method config
// (gRFC A6: a method config has at most one of them).
type Method struct {
	Retry   *Retry   // nil: none
	Hedging *Hedging // nil: none
}

// Retry is a method config's retryPolicy (gRFC A6).
type Retry struct {
	MaxAttempts                int // ≥ 2, as written (not capped)
	InitialBackoff, MaxBackoff time.Duration
	BackoffMultiplier          float64
	RetryableStatusCodes       []codes.Code // not empty
}

// Hedging is a method config's hedgingPolicy (gRFC A6).
type Hedging struct {
	MaxAttempts         int           // ≥ 2, as written (not capped)
	HedgingDelay        time.Duration // ≥ 0; 0: every attempt at once
	NonFatalStatusCodes []codes.Code  // may be empty
}

// Throttling is a service config's retryThrottling (gRFC A6).
type Throttling struct {
	MaxTokens  float64 // in (0, 1000]
	TokenRatio float64 // > 0, three decimals at most
}

// Lookup returns the method config of fullMethod ("/pkg.Svc/Method"): the
// one naming the method, else the one naming its service, else the
// default one (a name without service), else nil. A nil Config has none.
func (c *Config) Lookup(fullMethod string) *Method {
	if c == nil || len(c.methods) == 0 {
		return nil
	}
	if m, ok := c.methods[fullMethod]; ok {
		return m
	}
	if i := strings.LastIndexByte(fullMethod, '/'); i > 0 {
		if m, ok := c.methods[fullMethod[:i+1]]; ok {
			return m
		}
	}
	return c.methods[""]
}

// MaxJSON bounds the service config Parse reads: a larger one is an error.
const MaxJSON = 1 << 20

type jsonName struct {
	Service string `json:"service"`
	Method  string `json:"method"`
}

type jsonRetry struct {
	MaxAttempts          int          `json:"maxAttempts"`
	InitialBackoff       *string      `json:"initialBackoff"`
	MaxBackoff           *string      `json:"maxBackoff"`
	BackoffMultiplier    float64      `json:"backoffMultiplier"`
	RetryableStatusCodes []codes.Code `json:"retryableStatusCodes"`
}

type jsonHedging struct {
	MaxAttempts         int          `json:"maxAttempts"`
	HedgingDelay        *string      `json:"hedgingDelay"`
	NonFatalStatusCodes []codes.Code `json:"nonFatalStatusCodes"`
}

type jsonMethod struct {
	Name          []jsonName   `json:"name"`
	RetryPolicy   *jsonRetry   `json:"retryPolicy"`
	HedgingPolicy *jsonHedging `json:"hedgingPolicy"`
}

type jsonConfig struct {
	MethodConfig    []jsonMethod `json:"methodConfig"`
	RetryThrottling *Throttling  `json:"retryThrottling"`
}

// Parse reads the retry-related parts of a service config in its JSON
// form (gRFC A2, A6). It rejects what grpc-go rejects (an invalid
// retryPolicy or retryThrottling, a name with a method but no service, a
// method named twice), so that a config grpc-go applies is one Parse
// reads. A hedgingPolicy, which grpc-go does not read, is dropped with a
// warning (in Config.Warnings) when it is invalid or comes beside a
// retryPolicy; the rest of the config stands.
func Parse(js string) (*Config, error) {
	if len(js) > MaxJSON {
		return nil, fmt.Errorf("svcconfig: service config of %d bytes, more than %d", len(js), MaxJSON)
	}
	var raw jsonConfig
	if err := json.Unmarshal([]byte(js), &raw); err != nil {
		return nil, fmt.Errorf("svcconfig: %w", err)
	}
	c := &Config{}
	if t := raw.RetryThrottling; t != nil {
		switch {
		case t.MaxTokens > 0 && t.MaxTokens <= 1000 && t.TokenRatio > 0 && !math.IsInf(t.TokenRatio, 0):
			c.Throttling = &Throttling{MaxTokens: t.MaxTokens, TokenRatio: t.TokenRatio}
		case raw.MethodConfig != nil:
			return nil, fmt.Errorf("svcconfig: retryThrottling {maxTokens: %v, tokenRatio: %v}: maxTokens must be in (0, 1000] and tokenRatio positive", t.MaxTokens, t.TokenRatio)
		default:
			// grpc-go checks retryThrottling only in a config with method
			// configs, and takes this one: the suite takes it too, without
			// its throttling.
			c.Warnings = append(c.Warnings, fmt.Sprintf("retryThrottling {maxTokens: %v, tokenRatio: %v} ignored: maxTokens must be in (0, 1000] and tokenRatio positive", t.MaxTokens, t.TokenRatio))
		}
	}
	for i, jm := range raw.MethodConfig {
		m := &Method{}
		if jr := jm.RetryPolicy; jr != nil {
			r, err := retry(jr)
			if err != nil {
				return nil, fmt.Errorf("svcconfig: methodConfig[%d].retryPolicy: %w", i, err)
			}
			m.Retry = r
		}
		if jh := jm.HedgingPolicy; jh != nil {
			h, err := hedging(jh)
			switch {
			case err != nil:
				c.Warnings = append(c.Warnings, fmt.Sprintf("methodConfig[%d].hedgingPolicy ignored: %v", i, err))
			case m.Retry != nil:
				c.Warnings = append(c.Warnings, fmt.Sprintf("methodConfig[%d].hedgingPolicy ignored: a method config has a retryPolicy or a hedgingPolicy, not both", i))
			default:
				m.Hedging = h
			}
		}
		for _, n := range jm.Name {
			path, err := n.path()
			if err != nil {
				return nil, fmt.Errorf("svcconfig: methodConfig[%d]: %w", i, err)
			}
			if c.methods == nil {
				c.methods = make(map[string]*Method)
			}
			if _, dup := c.methods[path]; dup {
				return nil, fmt.Errorf("svcconfig: methodConfig[%d]: %q is named twice", i, path)
			}
			c.methods[path] = m
		}
	}
	return c, nil
}

func (n jsonName) path() (string, error) {
	if n.Service == "" {
		if n.Method != "" {
			return "", errors.New("a name with a method has a service")
		}
		return "", nil
	}
	return "/" + n.Service + "/" + n.Method, nil
}

func retry(jr *jsonRetry) (*Retry, error) {
	r := &Retry{MaxAttempts: jr.MaxAttempts, BackoffMultiplier: jr.BackoffMultiplier, RetryableStatusCodes: jr.RetryableStatusCodes}
	var err error
	if r.InitialBackoff, err = positive(jr.InitialBackoff, "initialBackoff"); err != nil {
		return nil, err
	}
	if r.MaxBackoff, err = positive(jr.MaxBackoff, "maxBackoff"); err != nil {
		return nil, err
	}
	switch {
	case r.MaxAttempts < 2:
		return nil, fmt.Errorf("maxAttempts %d is less than 2", r.MaxAttempts)
	case !(r.BackoffMultiplier > 0) || math.IsInf(r.BackoffMultiplier, 0):
		return nil, fmt.Errorf("backoffMultiplier %v is not positive", r.BackoffMultiplier)
	case len(r.RetryableStatusCodes) == 0:
		return nil, errors.New("retryableStatusCodes is empty")
	}
	return r, nil
}

func hedging(jh *jsonHedging) (*Hedging, error) {
	h := &Hedging{MaxAttempts: jh.MaxAttempts, NonFatalStatusCodes: jh.NonFatalStatusCodes}
	if h.MaxAttempts < 2 {
		return nil, fmt.Errorf("maxAttempts %d is less than 2", h.MaxAttempts)
	}
	if jh.HedgingDelay != nil {
		d, err := ParseDuration(*jh.HedgingDelay)
		if err != nil || d < 0 {
			return nil, fmt.Errorf("hedgingDelay %q is not a duration of 0 or more", *jh.HedgingDelay)
		}
		h.HedgingDelay = d
	}
	return h, nil
}

func positive(s *string, field string) (time.Duration, error) {
	if s == nil {
		return 0, fmt.Errorf("%s is missing", field)
	}
	d, err := ParseDuration(*s)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%s %q is not a positive duration", field, *s)
	}
	return d, nil
}

// ParseDuration parses a duration in the JSON form of
// google.protobuf.Duration: decimal seconds with at most nine fractional
// digits, followed by "s" ("1s", "0.025s", "-2.5s"). Durations beyond
// what a time.Duration holds (about 292 years) are an error.
func ParseDuration(s string) (time.Duration, error) {
	bad := fmt.Errorf("svcconfig: malformed duration %q", s)
	num, ok := strings.CutSuffix(s, "s")
	if !ok || num == "" {
		return 0, bad
	}
	neg := false
	if num[0] == '-' {
		neg, num = true, num[1:]
	}
	whole, frac, hasFrac := strings.Cut(num, ".")
	if whole == "" || !digits(whole) || hasFrac && (frac == "" || len(frac) > 9 || !digits(frac)) {
		return 0, bad
	}
	sec, err := strconv.ParseInt(whole, 10, 64)
	if err != nil || sec > math.MaxInt64/int64(time.Second)-1 {
		return 0, bad
	}
	var ns int64
	if hasFrac {
		n, _ := strconv.ParseInt(frac+strings.Repeat("0", 9-len(frac)), 10, 64)
		ns = n
	}
	d := time.Duration(sec)*time.Second + time.Duration(ns)
	if neg {
		d = -d
	}
	return d, nil
}

func digits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
