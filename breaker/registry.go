package breaker

import "github.com/stormguard/stormguard/internal/cowmap"

// Registry holds one Breaker per target, all configured alike.
//
// The zero value is an empty Registry whose breakers use the default
// Config. A Registry must not be copied after first use. All methods are
// safe for concurrent use. Breakers are created on first use and never
// removed, so targets should come from a bounded set (configured
// addresses, not per-request values).
type Registry struct {
	c Config
	m cowmap.Map[string, *Breaker]
}

// NewRegistry returns an empty Registry whose breakers are configured by c;
// each is named by its own target (Breaker.Target, OnStateChange).
func NewRegistry(c Config) *Registry {
	return &Registry{c: c}
}

// For returns the Breaker for target, creating it on first use. Once the
// target exists, For takes no lock and does not allocate.
func (r *Registry) For(target string) *Breaker {
	if b, ok := r.m.Load(target); ok {
		return b
	}
	return r.m.LoadOrCreate(target, r.create)
}

func (r *Registry) create(target string) *Breaker {
	return newNamed(target, r.c)
}

// Range calls f for each target and its Breaker, in no particular order,
// until f returns false. It sees a snapshot: breakers created meanwhile may
// be missed. f may call For and any Breaker method.
func (r *Registry) Range(f func(target string, b *Breaker) bool) {
	r.m.Range(f)
}

// Len returns the number of targets with a Breaker.
func (r *Registry) Len() int { return r.m.Len() }
