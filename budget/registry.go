package budget

import "github.com/stormguard/stormguard/internal/cowmap"

// A Registry holds one Budget per target, all made with the same Config, so
// that a failing dependency cannot spend the credit earned by a healthy one.
//
// The zero value is an empty Registry whose Budgets use the default Config.
// A nil *Registry returns nil Budgets, which impose no budget. All methods
// are safe for concurrent use. A Registry must not be copied after first use.
type Registry struct {
	cfg Config
	m   cowmap.Map[string, *Budget]
}

// NewRegistry returns an empty Registry whose Budgets are made by New(c).
func NewRegistry(c Config) *Registry {
	return &Registry{cfg: c}
}

// For returns the Budget for target, making it on first use. Every call with
// the same target returns the same Budget, also when callers race to make
// it. Once the Budget exists, For takes no lock and does not allocate.
//
// Budgets are never removed: the Registry is meant for a bounded set of
// targets, such as the addresses a client dials.
func (r *Registry) For(target string) *Budget {
	if r == nil {
		return nil
	}
	if b, ok := r.m.Load(target); ok {
		return b
	}
	return r.m.LoadOrCreate(target, r.create)
}

func (r *Registry) create(string) *Budget { return New(r.cfg) }

// Ratio returns the ratio the Registry's Budgets apply (Config.Ratio with
// the defaults and limits applied; 0 for none). A nil Registry has none.
func (r *Registry) Ratio() float64 {
	if r == nil {
		return 0
	}
	var b Budget
	b.setup(r.cfg)
	return float64(b.per) / unit
}

// Range calls f for each target and its Budget, in no particular order, until
// f returns false. It sees a consistent snapshot: Budgets made while it runs
// may be missed. f may call r.For.
func (r *Registry) Range(f func(target string, b *Budget) bool) {
	if r == nil {
		return
	}
	r.m.Range(f)
}

// Len reports the number of targets that have a Budget.
func (r *Registry) Len() int {
	if r == nil {
		return 0
	}
	return r.m.Len()
}
