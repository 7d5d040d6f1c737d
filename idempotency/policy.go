package idempotency

import (
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"

	"github.com/stormguard/stormguard/internal/codename"
	"github.com/stormguard/stormguard/internal/cowmap"
	"github.com/stormguard/stormguard/internal/limits"
	"github.com/stormguard/stormguard/internal/protoreg"
	stormguardv1 "github.com/stormguard/stormguard/proto/stormguard/v1"
)

// Level says whether, and on what condition, a method may be sent more than
// once. Higher levels are more permissive.
type Level uint8

const (
	// Unmarked methods are attempted exactly once: the zero Level.
	Unmarked Level = iota
	// RetryWithKey methods have side effects, but the server deduplicates
	// them on the idempotency-key metadata: they may be repeated only when
	// every attempt carries the same key.
	RetryWithKey
	// Idempotent methods (idempotency_level = IDEMPOTENT) may be retried:
	// repeating one leaves the same state as sending it once.
	Idempotent
	// NoSideEffects methods (idempotency_level = NO_SIDE_EFFECTS) may be
	// retried and hedged freely.
	NoSideEffects
)

// String returns the level's name, as in the proto option where there is one.
func (l Level) String() string {
	switch l {
	case Unmarked:
		return "UNMARKED"
	case RetryWithKey:
		return "RETRY_WITH_KEY"
	case Idempotent:
		return "IDEMPOTENT"
	case NoSideEffects:
		return "NO_SIDE_EFFECTS"
	}
	return "Level(" + strconv.Itoa(int(l)) + ")"
}

// Policy is what the proto says about one method. The zero Policy is an
// unmarked method: one attempt, no hedging.
//
// Fields that are zero mean "use the client's option or default".
type Policy struct {
	// Level says whether the method may be repeated.
	Level Level
	// Known reports whether the protobuf registry knows the method.
	Known bool
	// ClientStreaming and ServerStreaming give the method's shape.
	ClientStreaming, ServerStreaming bool
	// MaxAttempts caps attempts per logical call, the first included;
	// 0: the client's default.
	MaxAttempts int
	// Hedging is true when the method has a hedging_delay.
	Hedging bool
	// HedgingDelay is the delay before each hedge; 0 with Hedging means
	// adaptive.
	HedgingDelay time.Duration
	// MaxHedges caps hedges beyond the first attempt; 0: MaxAttempts-1.
	MaxHedges int
	// RetryableCodes lists the codes after which an attempt may be
	// retried; empty: the client's default.
	RetryableCodes CodeSet
	// PerAttemptTimeout is how long an attempt may go unanswered before a
	// retry is sent beside it; 0: never, attempts may use all the time
	// the call has left.
	PerAttemptTimeout time.Duration
	// SendOnce is true when the proto marks the method send_once: it is
	// sent exactly once, whatever a service config, WithIdempotent-style
	// overrides or its other options say. Its Level is then Unmarked and
	// its other fields zero.
	SendOnce bool
}

// Repeatable reports whether a logical call of this method may send more
// than one attempt: always for NoSideEffects and Idempotent methods, only
// with an idempotency key for RetryWithKey methods, never for Unmarked ones.
func (p Policy) Repeatable(hasKey bool) bool {
	switch p.Level {
	case NoSideEffects, Idempotent:
		return true
	case RetryWithKey:
		return hasKey
	}
	return false
}

// CodeSet is a set of gRPC status codes. The zero CodeSet is empty.
type CodeSet uint32

// Codes returns the set of the given codes. Codes outside 1..16 (OK and
// unknown values) are left out: OK is never an error to retry.
func Codes(cs ...codes.Code) CodeSet {
	var s CodeSet
	for _, c := range cs {
		if c > codes.OK && c <= codes.Unauthenticated {
			s |= 1 << c
		}
	}
	return s
}

// Has reports whether c is in s.
func (s CodeSet) Has(c codes.Code) bool { return c < 32 && s&(1<<c) != 0 }

// ParseCodes returns the set of the named codes. Names are as in the gRPC
// service config ("UNAVAILABLE", "RESOURCE_EXHAUSTED"; case-insensitive),
// or decimal code numbers. Unknown names, and OK, are ignored.
func ParseCodes(names ...string) CodeSet {
	var s CodeSet
	for _, n := range names {
		if c, ok := parseCode(n); ok {
			s |= Codes(c)
		}
	}
	return s
}

func parseCode(name string) (codes.Code, bool) {
	name = strings.TrimSpace(name)
	if c, ok := codename.Parse(strings.ToUpper(name)); ok && c != codes.OK {
		return c, true
	}
	if n, err := strconv.ParseUint(name, 10, 8); err == nil && n > 0 && n <= uint64(codes.Unauthenticated) {
		return codes.Code(n), true
	}
	return codes.OK, false
}

// maxCached bounds the per-resolver cache. Method names come from generated
// client code, so a real program has far fewer; the bound only keeps a
// misbehaving caller from growing memory without limit. Beyond it, lookups
// still work but are not cached.
const maxCached = 10_000

// Resolver resolves method names to Policies, with optional overrides, and
// caches the results.
//
// Create one with [NewResolver]; the zero Resolver knows no method and
// resolves every name to an unmarked Policy. A Resolver is safe for
// concurrent use.
type Resolver struct {
	files      *protoregistry.Files
	idempotent protoreg.MethodSet // marked IDEMPOTENT by ResolverConfig
	cache      cowmap.Map[string, Policy]
}

// ResolverConfig configures a Resolver. The zero value resolves through
// protoregistry.GlobalFiles without overrides.
type ResolverConfig struct {
	// Idempotent marks methods IDEMPOTENT, for protos you cannot annotate.
	// An entry is a full method ("/pkg.Svc/Method", the leading slash
	// optional) or a whole service ("/pkg.Svc/" or "pkg.Svc"). An override
	// never lowers a level: a NO_SIDE_EFFECTS method stays one. Empty
	// entries are ignored. A whole service marks its writes too; names
	// are matched exactly, case included (CheckMarks reports names that
	// mark nothing).
	Idempotent []string
	// Files is the registry to resolve methods in; nil means
	// protoregistry.GlobalFiles.
	Files *protoregistry.Files
}

// NewResolver returns a Resolver for c.
func NewResolver(c ResolverConfig) *Resolver {
	r := &Resolver{files: c.Files}
	if r.files == nil {
		r.files = protoregistry.GlobalFiles
	}
	r.cache.Max = maxCached
	r.idempotent = protoreg.ParseMethodSet(c.Idempotent)
	return r
}

var defaultResolver = NewResolver(ResolverConfig{})

// Lookup resolves fullMethod ("/pkg.Service/Method", as grpc passes it to
// interceptors) through protoregistry.GlobalFiles, without overrides. See
// [Resolver.Lookup].
func Lookup(fullMethod string) Policy { return defaultResolver.Lookup(fullMethod) }

// Lookup returns the Policy of fullMethod ("/pkg.Service/Method"). Unknown
// methods and malformed names ("", "x", "/a/b/c", no leading slash) resolve
// to an unmarked Policy; overrides apply to them too.
//
// The result is cached after the first lookup of a well-formed name: later
// lookups take no lock and allocate nothing. A method registered after its
// first lookup keeps the policy it resolved to then.
func (r *Resolver) Lookup(fullMethod string) Policy {
	if p, ok := r.cache.Load(fullMethod); ok {
		return p
	}
	svc, method, ok := protoreg.SplitMethod(fullMethod)
	if !ok {
		return r.override(Policy{}, fullMethod)
	}
	return r.cache.LoadOrCreate(fullMethod, func(string) Policy {
		return r.override(r.resolve(svc, method), fullMethod)
	})
}

func (r *Resolver) override(p Policy, fullMethod string) Policy {
	if !p.SendOnce && p.Level < Idempotent && r.idempotent.Has(fullMethod) {
		p.Level = Idempotent
	}
	return p
}

func (r *Resolver) resolve(svc, method string) Policy {
	md := protoreg.FindMethod(r.files, svc, method)
	if md == nil {
		return Policy{}
	}
	p := Policy{Known: true, ClientStreaming: md.IsStreamingClient(), ServerStreaming: md.IsStreamingServer()}
	opts, ok := md.Options().(*descriptorpb.MethodOptions)
	if !ok || opts == nil {
		return p
	}
	switch opts.GetIdempotencyLevel() {
	case descriptorpb.MethodOptions_NO_SIDE_EFFECTS:
		p.Level = NoSideEffects
	case descriptorpb.MethodOptions_IDEMPOTENT:
		p.Level = Idempotent
	}
	mp, _ := proto.GetExtension(opts, stormguardv1.E_Method).(*stormguardv1.MethodPolicy)
	if mp == nil {
		return p
	}
	if mp.GetSendOnce() {
		return Policy{Known: true, ClientStreaming: p.ClientStreaming, ServerStreaming: p.ServerStreaming, SendOnce: true}
	}
	if mp.GetRetryWithKey() && p.Level == Unmarked {
		p.Level = RetryWithKey
	}
	p.MaxAttempts = int(min(mp.GetMaxAttempts(), limits.MaxAttempts))
	p.MaxHedges = int(min(mp.GetMaxHedges(), limits.MaxAttempts))
	if d := mp.GetHedgingDelay(); d != nil {
		p.Hedging = true
		p.HedgingDelay = max(d.AsDuration(), 0)
	}
	p.RetryableCodes = ParseCodes(mp.GetRetryableCodes()...)
	if d := mp.GetPerAttemptTimeout(); d != nil {
		p.PerAttemptTimeout = max(d.AsDuration(), 0)
	}
	return p
}
