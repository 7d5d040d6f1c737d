package svcconfig

import (
	"sync"
	"sync/atomic"

	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/serviceconfig"
)

// Watch is the service config a ClientConn's resolver last gave it, read
// by the suite. Make one per ClientConn (or per set of ClientConns dialed
// with the same options) with NewWatch, and dial with its Builders.
//
// A Watch is safe for concurrent use; Current is one atomic load.
type Watch struct {
	// cur is the config in effect: the resolver's, or def when the
	// resolver gave none; nil before any, or when it is unknown (a
	// resolver that made its config without ParseServiceConfig).
	cur atomic.Pointer[state]
	def *Config // the default service config (nil: none known)
	// built is true once a resolver was built through the Watch's
	// builders: until then (or ever, for a scheme it does not wrap) its
	// generation does not change with the ClientConn's service config.
	built atomic.Bool

	mu     sync.Mutex
	parsed [4]parsedConfig // the latest configs parsed for the resolver, newest last
}

// state is one service config in effect, with the resolver's endpoints.
type state struct {
	cfg       *Config // nil: unknown
	gen       uint64
	throttle  *Throttle // nil: no retryThrottling
	endpoints int       // the endpoints (or addresses) the resolver gave; 0: none yet
}

type parsedConfig struct {
	key serviceconfig.Config
	cfg *Config
}

// NewWatch returns a Watch whose config is def until a resolver gives one
// (def is the default service config the ClientConn is dialed with, nil
// for none).
func NewWatch(def *Config) *Watch {
	w := &Watch{def: def}
	w.cur.Store(&state{cfg: def, gen: 1, throttle: newThrottle(def, nil)})
	return w
}

// Current returns the service config in effect (nil: none, or unknown),
// its retry throttle (nil: none), and its generation, which changes with
// every resolver update.
func (w *Watch) Current() (cfg *Config, throttle *Throttle, gen uint64) {
	s := w.cur.Load()
	return s.cfg, s.throttle, s.gen
}

// Generation returns the generation of the service config in effect.
func (w *Watch) Generation() uint64 { return w.cur.Load().gen }

// Endpoints returns how many endpoints (or, from a resolver that gives
// none, addresses) the resolver gave the ClientConn last; 0 before it gave
// any, or when no resolver is followed.
func (w *Watch) Endpoints() int { return w.cur.Load().endpoints }

// Following reports whether a resolver was built through the Watch's
// builders, so that its generation changes with every service config the
// ClientConn is given. Until then, or for a ClientConn whose scheme the
// Watch does not wrap, the service config can change unseen.
func (w *Watch) Following() bool { return w.built.Load() }

// Builders returns resolver builders that wrap each of schemes' builders
// (as registered now: a scheme without one is skipped), to be given to
// grpc.WithResolvers.
func (w *Watch) Builders(schemes ...string) []resolver.Builder {
	var out []resolver.Builder
	for _, s := range schemes {
		if b := resolver.Get(s); b != nil {
			out = append(out, builder{b, w})
		}
	}
	return out
}

// Wrap returns builders that wrap bs (resolvers of the caller's own: a
// manual resolver, a service-discovery client), to be given to
// grpc.WithResolvers.
func (w *Watch) Wrap(bs ...resolver.Builder) []resolver.Builder {
	out := make([]resolver.Builder, 0, len(bs))
	for _, b := range bs {
		if b != nil {
			out = append(out, builder{b, w})
		}
	}
	return out
}

// builder builds its resolver with a ClientConn that shows w the service
// configs the resolver parses and gives.
type builder struct {
	resolver.Builder
	w *Watch
}

func (b builder) Build(t resolver.Target, cc resolver.ClientConn, o resolver.BuildOptions) (resolver.Resolver, error) {
	b.w.built.Store(true)
	return b.Builder.Build(t, &clientConn{ClientConn: cc, w: b.w}, o)
}

// clientConn is a resolver's ClientConn that reads the service configs
// the resolver parses (their JSON) and gives (UpdateState).
type clientConn struct {
	resolver.ClientConn
	w *Watch
}

func (c *clientConn) ParseServiceConfig(js string) *serviceconfig.ParseResult {
	pr := c.ClientConn.ParseServiceConfig(js)
	if pr != nil && pr.Err == nil && pr.Config != nil {
		cfg, err := Parse(js)
		if err != nil {
			cfg = nil // grpc took it and we did not: unknown
		}
		c.w.noteParsed(pr.Config, cfg)
	}
	return pr
}

func (c *clientConn) UpdateState(s resolver.State) error {
	err := c.ClientConn.UpdateState(s)
	n := len(s.Endpoints)
	if n == 0 {
		n = len(s.Addresses)
	}
	c.w.update(s.ServiceConfig, n)
	return err
}

func (w *Watch) noteParsed(key serviceconfig.Config, cfg *Config) {
	w.mu.Lock()
	defer w.mu.Unlock()
	copy(w.parsed[:], w.parsed[1:])
	w.parsed[len(w.parsed)-1] = parsedConfig{key, cfg}
}

// update notes the service config a resolver gave, with its n endpoints:
// none (the default applies), an invalid one (grpc keeps the one it had),
// or one parsed through the resolver's ClientConn (unknown if it was not).
func (w *Watch) update(pr *serviceconfig.ParseResult, n int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	old := w.cur.Load()
	var cfg *Config
	switch {
	case pr == nil:
		cfg = w.def
	case pr.Err != nil:
		// grpc keeps the config it had (or fails the channel); the
		// endpoints are new.
		w.cur.Store(&state{cfg: old.cfg, gen: old.gen + 1, throttle: old.throttle, endpoints: n})
		return
	default:
		for i := len(w.parsed) - 1; i >= 0; i-- {
			if p := w.parsed[i]; p.key != nil && p.key == pr.Config {
				cfg = p.cfg
				break
			}
		}
	}
	w.cur.Store(&state{cfg: cfg, gen: old.gen + 1, throttle: newThrottle(cfg, old.throttle), endpoints: n})
}
