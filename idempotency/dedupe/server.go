package dedupe

import (
	"context"
	"crypto/sha256"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/internal/cowmap"
	"github.com/stormguard/stormguard/internal/protoreg"
)

// DefaultNotStored is the set of codes whose outcome the server
// interceptor does not store: failures after which a retry may succeed
// (Unavailable, DeadlineExceeded, ResourceExhausted, Aborted), and
// Canceled, which a handler returns when its caller left, so that the
// caller's retry runs the handler again instead of replaying the failure.
const DefaultNotStored = idempotency.CodeSet(1<<codes.Canceled | 1<<codes.DeadlineExceeded |
	1<<codes.ResourceExhausted | 1<<codes.Aborted | 1<<codes.Unavailable)

// Config configures a Server. The zero value deduplicates the keyed
// requests of retry_with_key methods in a default [MemoryStore], scoped by
// [DefaultIdentity], and refuses such requests from callers without
// identity.
type Config struct {
	// Store keeps the records; nil: NewMemoryStore(MemoryConfig{}).
	// Several Servers (for example one per service of a process) may
	// share a Store: a record answers only its own method and request.
	Store Store
	// Identity returns who is calling, to scope keys by; "" means the
	// caller has no identity (see AllowAnonymous). nil: [DefaultIdentity],
	// from the TLS client certificate and the authorization metadata. Set
	// it to the principal an authentication interceptor put in ctx when
	// there is one. It is called once per keyed request to a deduplicated
	// method, and must be fast and safe for concurrent use; an identity
	// longer than MaxIdentityLen is replaced by its hash.
	Identity func(ctx context.Context) string
	// AllowAnonymous lets callers without identity share one anonymous key
	// space: any of them can then replay another's stored outcome by
	// sending the same key and request, and learn that a key was used.
	// Set it only when every caller is trusted (a private network, a test).
	// false: a keyed request without identity is refused with
	// codes.FailedPrecondition before the handler runs.
	AllowAnonymous bool
	// NotStored lists the codes whose outcome is not stored, so that a
	// retry executes the handler again; 0: DefaultNotStored. A handler
	// that returns one of these codes must not have applied its effect.
	// An error marked with Refused is never stored, whatever its code.
	NotStored idempotency.CodeSet
	// Methods lists methods to deduplicate besides those whose proto marks
	// them retry_with_key (see idempotency.Lookup), for protos you cannot
	// annotate: full method names ("/pkg.Svc/Method", the leading slash
	// optional) or whole services ("/pkg.Svc/" or "pkg.Svc"). Empty
	// entries are ignored. Keys on any other method are not looked at:
	// those requests pass through, and nothing is stored. Client-streaming
	// and bidirectional methods pass through even when listed.
	Methods []string
	// MaxStreamBytes bounds the heap the response messages recorded for
	// one deduplicated stream hold, counted as Record.Size counts them;
	// 0 (or less): DefaultMaxStreamBytes. It is also what one stream in
	// progress may hold for its record, on top of what the store holds.
	// A stream whose responses outgrow it is stored as a tombstone, whose
	// replay is codes.Internal: it ran, and does not run again.
	MaxStreamBytes int64
}

// DefaultMaxStreamBytes is the default of Config.MaxStreamBytes.
const DefaultMaxStreamBytes = 1 << 20

// Server holds the deduplicating server interceptors, [Server.Unary] and
// [Server.Stream], for the unary and server-streaming methods that are
// marked retry_with_key or listed in Config.Methods. The package
// documentation says what they do with a keyed request.
//
// Create a Server with [NewServer]; the zero Server is not usable. A
// Server is safe for concurrent use.
type Server struct {
	store          Store
	identity       func(context.Context) string
	allowAnonymous bool
	notStored      idempotency.CodeSet
	methods        cowmap.Map[string, *methodInfo]

	extra          protoreg.MethodSet // Config.Methods
	maxStreamBytes int64

	hits, misses, waits, conflicts, invalid, anonymous, full, notStoredN, storeErrors, oversized atomic.Uint64
}

// Stats counts what a Server did since it was created. Counters of the
// store (evictions, refusals) are the store's: see MemoryStore.Stats.
type Stats struct {
	// Hits counts keyed requests answered with a stored outcome, without
	// running the handler (after waiting or not).
	Hits uint64
	// Misses counts keyed requests that ran the handler.
	Misses uint64
	// Waits counts keyed requests that found their key in flight and
	// waited for it.
	Waits uint64
	// Conflicts counts keys reused with another method or request.
	Conflicts uint64
	// Invalid counts requests refused for malformed key metadata.
	Invalid uint64
	// Anonymous counts keyed requests refused because the caller had no
	// identity and Config.AllowAnonymous was not set.
	Anonymous uint64
	// Full counts keyed requests refused because the store had no room
	// (codes.ResourceExhausted, with a pushback); the handler did not run.
	Full uint64
	// NotStored counts handler runs whose outcome was not stored.
	NotStored uint64
	// StoreErrors counts Store calls that failed.
	StoreErrors uint64
	// Oversized counts deduplicated streams whose responses outgrew
	// Config.MaxStreamBytes and whose outcome was stored as a
	// tombstone.
	Oversized uint64
}

// maxMethods bounds the per-method cache of a Server. Method names come
// from the services a grpc.Server registers; the bound only keeps a
// misbehaving caller from growing memory without limit.
const maxMethods = 10_000

// NewServer returns a Server configured by c.
func NewServer(c Config) *Server {
	s := &Server{store: c.Store, identity: c.Identity, allowAnonymous: c.AllowAnonymous, notStored: c.NotStored}
	if s.identity == nil {
		s.identity = DefaultIdentity
	}
	if s.store == nil {
		s.store = NewMemoryStore(MemoryConfig{})
	}
	if s.notStored == 0 {
		s.notStored = DefaultNotStored
	}
	s.methods.Max = maxMethods
	s.extra = protoreg.ParseMethodSet(c.Methods)
	s.maxStreamBytes = c.MaxStreamBytes
	if s.maxStreamBytes <= 0 {
		s.maxStreamBytes = DefaultMaxStreamBytes
	}
	return s
}

// Stats returns the Server's counters.
func (s *Server) Stats() Stats {
	return Stats{
		Hits:        s.hits.Load(),
		Misses:      s.misses.Load(),
		Waits:       s.waits.Load(),
		Conflicts:   s.conflicts.Load(),
		Invalid:     s.invalid.Load(),
		Anonymous:   s.anonymous.Load(),
		Full:        s.full.Load(),
		NotStored:   s.notStoredN.Load(),
		StoreErrors: s.storeErrors.Load(),
		Oversized:   s.oversized.Load(),
	}
}

// Unary returns the deduplicating unary server interceptor.
func (s *Server) Unary() grpc.UnaryServerInterceptor { return s.unary }

// Deduplicates reports whether the interceptors deduplicate the keyed
// requests of fullMethod ("/pkg.Svc/Method"): it is marked retry_with_key,
// or listed in Config.Methods. It takes no lock and does not allocate once
// the method has been seen.
func (s *Server) Deduplicates(fullMethod string) bool { return s.method(fullMethod).dedupe }

// Refused marks err as the refusal of a request whose handler did not run,
// returned by the handler chain that a deduplicating interceptor calls
// (an overload protection that sheds the request before its handler,
// say): the interceptor releases the request's key without storing the
// outcome, whatever its code and Config.NotStored, so that the caller's
// retry runs the handler. The returned error carries err's gRPC status;
// Refused(nil) is nil.
func Refused(err error) error {
	if err == nil {
		return nil
	}
	return &refusedError{err}
}

// refusedError is an error marked by Refused.
type refusedError struct{ err error }

func (e *refusedError) Error() string              { return e.err.Error() }
func (e *refusedError) Unwrap() error              { return e.err }
func (e *refusedError) GRPCStatus() *status.Status { return status.Convert(e.err) }

// refused reports whether err was marked by Refused.
func refused(err error) bool {
	var r *refusedError
	return errors.As(err, &r)
}

// Stream returns the stream server interceptor: it deduplicates the
// server-streaming methods to deduplicate, and passes every other stream
// through untouched.
func (s *Server) Stream() grpc.StreamServerInterceptor { return s.stream }

func (s *Server) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	mi := s.method(info.FullMethod)
	if !mi.dedupe {
		return handler(ctx, req)
	}
	key, ok, err := idempotency.KeyFromIncoming(ctx)
	if !ok {
		return handler(ctx, req)
	}
	if err != nil {
		s.invalid.Add(1)
		return nil, err
	}
	scope, err := s.scope(ctx, key, info.FullMethod)
	if err != nil {
		return nil, err
	}
	msg, ok := req.(proto.Message)
	if !ok {
		return nil, status.Error(codes.Internal, "dedupe: the request of "+info.FullMethod+
			" is not a protobuf message; it cannot be deduplicated")
	}
	fp := Fingerprint{Method: info.FullMethod}
	if fp.RequestHash, err = hashRequest(msg); err != nil {
		return nil, status.Error(codes.Internal, "dedupe: cannot serialize the request: "+err.Error())
	}
	c, rec, err := s.claim(ctx, scope, fp)
	if err == nil && rec == nil {
		return s.execute(ctx, req, handler, c, mi)
	}
	var resp any
	if err == nil {
		resp, err = s.replay(ctx, mi, fp, rec)
	}
	if md := pushbackMD(err); md != nil {
		_ = grpc.SetTrailer(ctx, md)
	}
	return resp, err
}

// scope returns the scope of key: the caller's identity and the key. It
// refuses a caller without identity unless AllowAnonymous is set.
func (s *Server) scope(ctx context.Context, key, method string) (Scope, error) {
	id := s.identity(ctx)
	if id == "" && !s.allowAnonymous {
		s.anonymous.Add(1)
		return Scope{}, status.Error(codes.FailedPrecondition, "dedupe: "+method+
			" deduplicates keyed requests per caller, and this request carries no caller identity "+
			"(no TLS client certificate, no authorization metadata): send one, or, if all the server's "+
			"callers are trusted, configure the server with dedupe.Config{AllowAnonymous: true}")
	}
	return Scope{Identity: boundIdentity(id), Key: key}, nil
}

// claim takes scope for fp, waiting (bounded by ctx) while another
// execution of the same request holds it. It returns either an owned claim,
// whose handler the caller runs (and counts as a miss), or the record to
// replay (counted as a hit), or a status error: a conflict, the caller's
// context, or the store's.
func (s *Server) claim(ctx context.Context, scope Scope, fp Fingerprint) (Claim, *Record, error) {
	for {
		c, err := s.store.Claim(ctx, scope, fp)
		if err != nil {
			if ctx.Err() != nil {
				return Claim{}, nil, status.FromContextError(ctx.Err()).Err()
			}
			return Claim{}, nil, s.storeError(err)
		}
		switch c.State {
		case Owned:
			s.misses.Add(1)
			return c, nil, nil
		case Done:
			if c.Holder != fp {
				return Claim{}, nil, s.conflict(fp, c.Holder)
			}
			if c.Record == nil {
				return Claim{}, nil, s.storeFailure("answered DONE without a record")
			}
			s.hits.Add(1)
			return Claim{}, c.Record, nil
		case InFlight:
			if c.Holder != fp {
				return Claim{}, nil, s.conflict(fp, c.Holder)
			}
			s.waits.Add(1)
			rec, err := s.store.Wait(ctx, c)
			if err != nil {
				if ctx.Err() != nil {
					return Claim{}, nil, status.FromContextError(ctx.Err()).Err()
				}
				return Claim{}, nil, s.storeError(err)
			}
			if rec != nil {
				s.hits.Add(1)
				return Claim{}, rec, nil
			}
			// Released without an outcome: claim again, and maybe run it.
		default:
			return Claim{}, nil, s.storeFailure("answered " + c.State.String())
		}
	}
}

func (s *Server) conflict(fp, holder Fingerprint) error {
	s.conflicts.Add(1)
	if fp.Method != holder.Method {
		return status.Error(codes.InvalidArgument, "dedupe: this "+idempotency.MetadataKey+
			" was already used for another method; a new request needs a new key")
	}
	return status.Error(codes.InvalidArgument, "dedupe: this "+idempotency.MetadataKey+
		" was already used with a different request to this method; a new request needs a new key")
}

// execute runs the handler under the owned claim c and stores or releases
// its outcome.
func (s *Server) execute(ctx context.Context, req any, handler grpc.UnaryHandler, c Claim, mi *methodInfo) (resp any, err error) {
	hctx := ctx
	var cs *captureStream
	if inner := grpc.ServerTransportStreamFromContext(ctx); inner != nil {
		cs = &captureStream{ServerTransportStream: inner}
		hctx = grpc.NewContextWithServerTransportStream(ctx, cs)
	}
	finished := false
	defer func() {
		if !finished { // the handler panicked: let the next attempt run
			s.release(ctx, c)
		}
	}()
	resp, err = handler(hctx, req)
	finished = true

	st, ok := status.FromError(err)
	if !ok {
		st = status.FromContextError(err) // as grpc does with a handler's error
	}
	if s.notStored.Has(st.Code()) || (err != nil && st.Code() == codes.OK) || refused(err) {
		s.release(ctx, c)
		return resp, err
	}
	rec := &Record{Fingerprint: c.Holder, Code: st.Code(), Message: st.Message()}
	if err != nil {
		rec.Details = st.Proto().GetDetails()
	} else {
		m, ok := resp.(proto.Message)
		if !ok {
			s.release(ctx, c)
			return resp, err
		}
		if rec.Response, err = proto.Marshal(m); err != nil {
			s.release(ctx, c)
			return resp, nil // grpc reports the marshalling error
		}
		mi.learn(m)
	}
	if cs != nil {
		rec.Header, rec.Trailer = cs.captured()
	}
	if cerr := s.store.Complete(context.WithoutCancel(ctx), c, rec); cerr != nil {
		s.storeErrors.Add(1)
	}
	return resp, err
}

func (s *Server) release(ctx context.Context, c Claim) {
	s.notStoredN.Add(1)
	if err := s.store.Release(context.WithoutCancel(ctx), c); err != nil {
		s.storeErrors.Add(1)
	}
}

// replay answers with the stored outcome rec.
func (s *Server) replay(ctx context.Context, mi *methodInfo, fp Fingerprint, rec *Record) (any, error) {
	if rec.Fingerprint != fp {
		return nil, s.storeFailure("answered with a record of another request")
	}
	// Best effort: see the Server doc.
	_ = grpc.SetHeader(ctx, rec.Header)
	_ = grpc.SetTrailer(ctx, rec.Trailer)
	if rec.Code != codes.OK {
		return nil, rec.err()
	}
	mt := mi.outType()
	if mt == nil {
		return nil, status.Error(codes.Internal, "dedupe: cannot rebuild the stored response of "+
			fp.Method+": its output type is unknown to the protobuf registry")
	}
	m := mt.New().Interface()
	if err := proto.Unmarshal(rec.Response, m); err != nil {
		return nil, status.Error(codes.Internal, "dedupe: cannot rebuild the stored response: "+err.Error())
	}
	return m, nil
}

// err returns the status error rec stores; nil for codes.OK.
func (rec *Record) err() error {
	if len(rec.Details) == 0 {
		return status.Error(rec.Code, rec.Message)
	}
	p := status.New(rec.Code, rec.Message).Proto()
	p.Details = rec.Details
	return status.FromProto(p).Err()
}

// storeError turns the error of a Store's Claim or Wait into the status
// error the caller gets, and counts it. A refusal for want of room is
// passed on with its pushback. Any other error fails closed: the request
// is refused with codes.Unavailable and a pushback, and the handler does
// not run.
func (s *Server) storeError(err error) error {
	if st, ok := status.FromError(err); ok && st.Code() == codes.ResourceExhausted {
		s.full.Add(1)
		wait, ok := retryDelay(st)
		if !ok {
			wait = busyPushback
		}
		return &pushbackError{st: st, after: wait}
	}
	return s.storeFailure("failed: " + err.Error())
}

// storeFailure counts a store that failed or misbehaved, and returns the
// Unavailable status error, with a pushback, that the caller gets.
func (s *Server) storeFailure(what string) error {
	s.storeErrors.Add(1)
	st := status.New(codes.Unavailable, "dedupe: the idempotency store "+what+
		"; the request did not run, and may be retried")
	return &pushbackError{st: st, after: storePushback}
}

// storePushback is when a caller refused because the Store failed is told
// to come back.
const storePushback = time.Second

// Busy reports whether err is a Server's refusal of a keyed request for
// want of room in its Store (codes.ResourceExhausted, with a pushback):
// the Store's room was held by requests in flight and records younger than
// its retry horizon, and the handler did not run. A stored outcome
// replayed with that code is not one.
func Busy(err error) bool {
	var pe *pushbackError
	return errors.As(err, &pe) && pe.st.Code() == codes.ResourceExhausted
}

// pushbackError is a status error that tells the caller when to retry:
// the interceptor sends it as grpc-retry-pushback-ms.
type pushbackError struct {
	st    *status.Status
	after time.Duration
}

func (e *pushbackError) Error() string              { return e.st.Err().Error() }
func (e *pushbackError) GRPCStatus() *status.Status { return e.st }

// pushbackMD returns the trailer that carries err's pushback, or nil.
func pushbackMD(err error) metadata.MD {
	pe, ok := err.(*pushbackError)
	if !ok {
		return nil
	}
	return metadata.Pairs(pushbackKey, strconv.FormatInt(max(pe.after.Milliseconds(), 1), 10))
}

// pushbackKey is the gRFC A6 trailer that tells a client when to retry.
const pushbackKey = "grpc-retry-pushback-ms"

// methodInfo is what the server knows of one method, resolved once.
type methodInfo struct {
	// dedupe is true when the method is marked retry_with_key or listed in
	// Config.Methods.
	dedupe bool
	out    atomic.Pointer[outType]
	// in is the request type of a method to deduplicate, from the
	// registry (for streams); nil if the registry does not know it.
	in protoreflect.MessageType
}

type outType struct{ protoreflect.MessageType }

func (mi *methodInfo) outType() protoreflect.MessageType {
	if o := mi.out.Load(); o != nil {
		return o.MessageType
	}
	return nil
}

// learn records the type of a response, for methods the registry does not
// know.
func (mi *methodInfo) learn(m proto.Message) {
	if mi.out.Load() == nil {
		mi.out.CompareAndSwap(nil, &outType{m.ProtoReflect().Type()})
	}
}

func (s *Server) method(full string) *methodInfo {
	if mi, ok := s.methods.Load(full); ok {
		return mi
	}
	return s.methods.LoadOrCreate(full, s.resolveMethod)
}

// resolveMethod finds whether full is deduplicated, and its message types
// in the global registries.
func (s *Server) resolveMethod(full string) *methodInfo {
	mi := &methodInfo{dedupe: idempotency.Lookup(full).Level == idempotency.RetryWithKey || s.extra.Has(full)}
	if !mi.dedupe {
		return mi
	}
	if mt := protoreg.ResponseType(full); mt != nil {
		mi.out.Store(&outType{mt})
	}
	mi.in = protoreg.RequestType(full)
	return mi
}

// hashBufs holds serialization buffers for request hashing.
var hashBufs = sync.Pool{New: func() any { return new([]byte) }}

// maxPooledBuf is the largest buffer kept in hashBufs.
const maxPooledBuf = 64 << 10

func hashRequest(m proto.Message) ([sha256.Size]byte, error) {
	bp := hashBufs.Get().(*[]byte)
	b, err := proto.MarshalOptions{Deterministic: true}.MarshalAppend((*bp)[:0], m)
	var h [sha256.Size]byte
	if err == nil {
		h = sha256.Sum256(b)
	}
	if cap(b) <= maxPooledBuf {
		*bp = b[:0]
		hashBufs.Put(bp)
	}
	return h, err
}

// captureStream forwards to the real transport stream and records the
// header and trailer metadata the handler sets.
type captureStream struct {
	grpc.ServerTransportStream
	mu              sync.Mutex
	header, trailer metadata.MD
}

func (c *captureStream) SetHeader(md metadata.MD) error {
	if err := c.ServerTransportStream.SetHeader(md); err != nil {
		return err
	}
	c.addHeader(md)
	return nil
}

func (c *captureStream) SendHeader(md metadata.MD) error {
	if err := c.ServerTransportStream.SendHeader(md); err != nil {
		return err
	}
	c.addHeader(md)
	return nil
}

func (c *captureStream) SetTrailer(md metadata.MD) error {
	if err := c.ServerTransportStream.SetTrailer(md); err != nil {
		return err
	}
	c.addTrailer(md)
	return nil
}

func (c *captureStream) addHeader(md metadata.MD) {
	c.mu.Lock()
	c.header = metadata.Join(c.header, md)
	c.mu.Unlock()
}

func (c *captureStream) addTrailer(md metadata.MD) {
	c.mu.Lock()
	c.trailer = metadata.Join(c.trailer, md)
	c.mu.Unlock()
}

func (c *captureStream) captured() (header, trailer metadata.MD) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.header, c.trailer
}
