package interceptor

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/internal/engine"
)

// TargetState is a snapshot of what a Client knows of one target, for a
// health or debug page. Targets are canonical ("dns:///host:port" for
// "host:port"), or the names WithTargetName gives them.
type TargetState struct {
	Target    string          `json:"target"`
	Budget    *BudgetState    `json:"budget,omitempty"`   // nil without a budget
	Breakers  []BreakerState  `json:"breakers,omitempty"` // one per method called, sorted by method; none without a breaker
	Endpoints []EndpointState `json:"endpoints,omitempty"`
}

// BudgetState is a target's retry budget (see budget.Stats).
type BudgetState struct {
	Balance  float64 `json:"balance"` // retries or hedges it would grant now
	Credit   float64 `json:"credit"`  // negative while it is owed what it lent
	Lending  bool    `json:"lending"`
	Requests uint64  `json:"requests"`
	Granted  uint64  `json:"granted"`
	Lent     uint64  `json:"lent"`
	Refused  uint64  `json:"refused"`
}

// BreakerState is the circuit breaker of one method of a target (see
// breaker.Stats).
type BreakerState struct {
	Method    string     `json:"method"` // "/pkg.Svc/Method"
	State     string     `json:"state"`  // closed, open or half-open
	Attempts  int64      `json:"attempts"`
	Failures  int64      `json:"failures"`
	OpenUntil *time.Time `json:"open_until,omitempty"`
	Opened    uint64     `json:"opened"`
	Rejected  uint64     `json:"rejected"`
}

// EndpointState is one endpoint of a target, as the Client saw it in the
// last few seconds.
type EndpointState struct {
	Addr    string `json:"addr"`
	OK      int64  `json:"ok"`
	Failed  int64  `json:"failed"`
	Avoided bool   `json:"avoided"` // it fails while the others serve: attempts go elsewhere
}

// Targets returns a snapshot of every target the Client has called, sorted
// by target. It is safe for concurrent use with calls; each target's parts
// are read one after the other, not at one instant.
func (c *Client) Targets() []TargetState {
	byTarget := map[string]*TargetState{}
	get := func(t string) *TargetState {
		if s, ok := byTarget[t]; ok {
			return s
		}
		s := &TargetState{Target: t}
		byTarget[t] = s
		return s
	}
	now := c.now()
	if c.budgets != nil {
		c.budgets.Range(func(t string, b *budget.Budget) bool {
			st := b.StatsAt(now)
			get(t).Budget = &BudgetState{Balance: st.Balance, Credit: st.Credit, Lending: st.Lending,
				Requests: st.Requests, Granted: st.Granted, Lent: st.Lent, Refused: st.Refused}
			return true
		})
	}
	c.brk.Range(func(k routeKey, rb *routeBreaker) bool {
		st := rb.b.StatsAt(now)
		bs := BreakerState{Method: k.method, State: st.State.String(), Attempts: st.Attempts, Failures: st.Failures, Opened: st.Opened, Rejected: st.Rejected}
		if !st.OpenUntil.IsZero() {
			bs.OpenUntil = &st.OpenUntil
		}
		ts := get(k.target)
		ts.Breakers = append(ts.Breakers, bs)
		return true
	})
	c.endpoints.Range(func(t string, e *engine.Endpoints) bool {
		ts := get(t)
		for _, ep := range e.Snapshot(now) {
			ts.Endpoints = append(ts.Endpoints, EndpointState{Addr: ep.Addr.String(), OK: ep.OK, Failed: ep.Failed, Avoided: ep.Avoided})
		}
		return true
	})
	out := make([]TargetState, 0, len(byTarget))
	for _, s := range byTarget {
		slices.SortFunc(s.Breakers, func(a, b BreakerState) int { return strings.Compare(a.Method, b.Method) })
		out = append(out, *s)
	}
	slices.SortFunc(out, func(a, b TargetState) int { return strings.Compare(a.Target, b.Target) })
	return out
}

// StateHandler returns an http.Handler that serves Targets as JSON
// ({"targets": [...]}) to GET and HEAD requests, for a debug page. It
// exposes target and endpoint addresses: serve it only where those may be
// seen.
func (c *Client) StateHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_ = json.NewEncoder(w).Encode(struct {
			Targets []TargetState `json:"targets"`
		}{c.Targets()})
	})
}
