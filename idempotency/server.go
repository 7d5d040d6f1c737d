package idempotency

import (
	"context"
	"crypto/sha256"
	"errors"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/stormguard/stormguard/internal/cowmap"
)

// DefaultNotStored is the set of codes whose outcome the server
// interceptor does not store: failures after which a retry may succeed
// (Unavailable, DeadlineExceeded, ResourceExhausted, Aborted), and
// Canceled, which a handler returns when its caller left, so that the
// caller's retry runs the handler again instead of replaying the failure.
const DefaultNotStored = CodeSet(1<<codes.Canceled | 1<<codes.DeadlineExceeded |
	1<<codes.ResourceExhausted | 1<<codes.Aborted | 1<<codes.Unavailable)

// ServerConfig configures a Server. The zero value deduplicates keyed
// unary requests in a default [MemoryStore], without identity scoping, and
// passes every stream through.
type ServerConfig struct {
	// Store keeps the records; nil: NewMemoryStore(MemoryConfig{}).
	// Several Servers (for example one per service of a process) may
	// share a Store: keys are scoped by identity, and a record answers
	// only its own method and request.
	Store Store
	// Identity, when set, returns who is calling (for example a TLS
	// client certificate's subject from peer.FromContext, or a user from
	// the auth info a previous interceptor put in ctx). Keys are scoped
	// by it: two callers that use the same key do not see each other's
	// records, so a guessed key reveals nothing. It is called once per
	// keyed request, and must be fast and safe for concurrent use. An
	// empty identity is a scope of its own, shared by all callers that
	// have none. nil: no identity scoping (every caller of the server
	// shares the key space, scoped only by method and request).
	Identity func(ctx context.Context) string
	// NotStored lists the codes whose outcome is not stored, so that a
	// retry executes the handler again; 0: DefaultNotStored. A handler
	// that returns one of these codes must not have applied its effect.
	NotStored CodeSet
	// Streams opts server-streaming methods in to deduplication: full
	// method names ("/pkg.Svc/Method", the leading slash optional) or
	// whole services ("/pkg.Svc/" or "pkg.Svc"), as in
	// ResolverConfig.Idempotent. Empty entries are ignored. Client-streaming
	// and bidirectional methods are not deduplicated even when listed (see
	// [Server]). Empty: [Server.Stream] passes every stream through
	// untouched.
	Streams []string
	// MaxStreamBytes bounds the response messages recorded for one
	// deduplicated stream, in bytes, each message counted as its
	// serialized length plus ResponseOverhead (as Record.Size counts it);
	// 0 (or less): DefaultMaxStreamBytes. It is also the memory one stream
	// in progress may hold for its record, on top of what the store
	// holds. A stream whose responses outgrow it is stored as a tombstone
	// (see [Server]).
	MaxStreamBytes int64
}

// DefaultMaxStreamBytes is the default of ServerConfig.MaxStreamBytes.
const DefaultMaxStreamBytes = 1 << 20

// Server is the server side of idempotency keys: server interceptors that
// run each keyed write once and answer its retries with the stored
// outcome: every unary method, and the server-streaming methods that
// ServerConfig.Streams opts in.
//
// For a unary request that carries idempotency-key metadata:
//
//   - An invalid key (empty, longer than MaxKeyLen, not printable ASCII
//     without spaces, or several values) fails with codes.InvalidArgument
//     before the handler runs.
//   - The key is scoped by the caller's identity (ServerConfig.Identity)
//     and bound to the method and a SHA-256 of the request (its
//     deterministic protobuf serialization), its [Fingerprint].
//   - First sight: the handler runs, and its outcome — response message
//     bytes, status code, message and details, and the header and trailer
//     metadata set inside this interceptor — is stored for the store's
//     TTL. An outcome with a code in NotStored (by default retryable
//     failures and Canceled), a handler panic, or a response that is not a
//     protobuf message is not stored: the next attempt runs the handler
//     again.
//   - Same key while the first is running: the request waits for the first
//     one's outcome, for as long as its own deadline allows
//     (codes.DeadlineExceeded or codes.Canceled otherwise); the handler
//     does not run twice. If the first one's outcome is not stored, one of
//     the waiters runs the handler instead.
//   - Same key after completion: the stored outcome is replayed (same
//     response message, status, header and trailers) and the handler does
//     not run.
//   - Same key with another method or another request: codes.InvalidArgument
//     before the handler runs; never someone else's response.
//
// A replayed response is rebuilt as a message of the method's output type,
// found once per method in protoregistry.GlobalFiles and GlobalTypes (or,
// for a method the registry does not know, learned from the handler's
// first response in this process). Requests without the key pass straight
// through, at the cost of one metadata lookup.
//
// To record header and trailers, the handler of a keyed request runs with
// a context whose grpc.ServerTransportStream is wrapped; grpc's
// SetSendCompressor and ClientSupportedCompressors do not work there.
// grpc.SetHeader, SendHeader, SetTrailer and Method do. A replayed header
// is set with grpc.SetHeader, and is lost if an interceptor outside this
// one has already sent the header.
//
// # Streams
//
// [Server.Stream] deduplicates the streams of the server-streaming methods
// (one request message, any number of responses) that ServerConfig.Streams
// lists, and passes every other stream to the handler untouched: with no
// Streams configured, at the cost of a function call; otherwise at the
// cost of one lock-free, allocation-free cache lookup of the method name
// (none for client-streaming and bidirectional methods), and no metadata
// lookup.
//
// A keyed stream of an opted-in server-streaming method follows the unary
// rules above (invalid key, identity scope, fingerprint, conflicts, wait,
// NotStored, panics), with these differences:
//
//   - The interceptor reads the request message before the handler runs,
//     as a message of the method's input type from protoregistry.GlobalFiles
//     and GlobalTypes (a keyed stream of a method whose request type the
//     registry does not know fails with codes.Internal; the handler does
//     not run), and fingerprints it as for unary requests. An error
//     receiving it is returned as the handler would have returned it.
//   - First sight: the handler runs on a wrapped stream whose first RecvMsg
//     yields the request already read (copied into the handler's message),
//     and whose SendMsg forwards each response to the client and records
//     its serialized bytes (each response is serialized twice: for the
//     record and by grpc). The stored outcome is the list of responses in
//     the order sent, the status, and the header and trailer metadata set
//     on the stream (SetHeader, SendHeader, SetTrailer) or on its context
//     (grpc.SetHeader and friends). A stream that fails after sending
//     messages is stored with them, unless its code is in NotStored. An
//     outcome is not stored either when the handler sent a message that
//     is not a protobuf message (such as a grpc.PreparedMsg).
//   - Recording limit: once the recorded responses outgrow
//     ServerConfig.MaxStreamBytes, recording stops and what was recorded is
//     dropped; the client still receives every message. If the outcome is
//     one to store, a tombstone is stored in its place, exactly like a
//     MemoryStore's oversized record: its replay is codes.Internal
//     ("response stream was too large to keep for replay"), without
//     messages or metadata. The request ran once and is not run again
//     (Stats.Oversized counts these).
//   - Replay: the stored header, then every stored response, rebuilt as a
//     message of the method's output type (as for unary), then the stored
//     trailer and status. The handler does not run. The header is set with
//     the stream's SetHeader, and is lost if an interceptor outside this
//     one has already sent it. The handler of a deduplicated stream runs
//     with a wrapped transport stream in its context, as for unary.
//
// Client-streaming and bidirectional methods are passed through untouched
// even when listed: their requests are not known before the handler runs,
// so they cannot be fingerprinted before the key is claimed. Reading them
// all first would change the method: it would hold a whole upload in
// memory (or have to refuse large ones), and deadlock any bidirectional
// protocol whose client waits for a response before it sends its next
// request.
//
// Create a Server with [NewServer]; the zero Server is not usable. A
// Server is safe for concurrent use.
type Server struct {
	store     Store
	identity  func(context.Context) string
	notStored CodeSet
	methods   cowmap.Map[string, *methodInfo]

	// streamServices and streamMethods are ServerConfig.Streams, parsed;
	// streams is false when both are empty.
	streams                       bool
	streamServices, streamMethods map[string]bool
	maxStreamBytes                int64

	hits, misses, waits, conflicts, invalid, notStoredN, storeErrors, oversized atomic.Uint64
}

// Stats counts what a Server did, since it was created.
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
	// NotStored counts handler runs whose outcome was not stored.
	NotStored uint64
	// StoreErrors counts Store calls that failed, including a MemoryStore
	// refusing a new key while full of requests in flight.
	StoreErrors uint64
	// Oversized counts deduplicated streams whose responses outgrew
	// ServerConfig.MaxStreamBytes and whose outcome was stored as a
	// tombstone.
	Oversized uint64
	// Evictions is the store's count of records dropped for room, when
	// the store has an Evictions() uint64 method (MemoryStore does); 0
	// otherwise.
	Evictions uint64
}

// NewServer returns a Server configured by c.
func NewServer(c ServerConfig) *Server {
	s := &Server{store: c.Store, identity: c.Identity, notStored: c.NotStored}
	if s.store == nil {
		s.store = NewMemoryStore(MemoryConfig{})
	}
	if s.notStored == 0 {
		s.notStored = DefaultNotStored
	}
	s.methods.Max = maxCached
	s.streamServices, s.streamMethods = parseMethodSet(c.Streams)
	s.streams = len(s.streamServices)+len(s.streamMethods) > 0
	s.maxStreamBytes = c.MaxStreamBytes
	if s.maxStreamBytes <= 0 {
		s.maxStreamBytes = DefaultMaxStreamBytes
	}
	return s
}

// Stats returns the Server's counters.
func (s *Server) Stats() Stats {
	st := Stats{
		Hits:        s.hits.Load(),
		Misses:      s.misses.Load(),
		Waits:       s.waits.Load(),
		Conflicts:   s.conflicts.Load(),
		Invalid:     s.invalid.Load(),
		NotStored:   s.notStoredN.Load(),
		StoreErrors: s.storeErrors.Load(),
		Oversized:   s.oversized.Load(),
	}
	if ev, ok := s.store.(interface{ Evictions() uint64 }); ok {
		st.Evictions = ev.Evictions()
	}
	return st
}

// Unary returns the deduplicating unary server interceptor.
func (s *Server) Unary() grpc.UnaryServerInterceptor { return s.unary }

// Stream returns the stream server interceptor: it deduplicates the
// server-streaming methods ServerConfig.Streams opts in, and passes every
// other stream through untouched (see [Server]).
func (s *Server) Stream() grpc.StreamServerInterceptor {
	if !s.streams {
		return passStream
	}
	return s.stream
}

func passStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	return handler(srv, ss)
}

func (s *Server) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	key, ok, err := KeyFromIncoming(ctx)
	if !ok {
		return handler(ctx, req)
	}
	if err != nil {
		s.invalid.Add(1)
		return nil, err
	}
	msg, ok := req.(proto.Message)
	if !ok {
		return nil, status.Error(codes.Internal, "idempotency: the request of "+info.FullMethod+
			" is not a protobuf message; it cannot be deduplicated")
	}
	fp := Fingerprint{Method: info.FullMethod}
	if fp.RequestHash, err = hashRequest(msg); err != nil {
		return nil, status.Error(codes.Internal, "idempotency: cannot serialize the request: "+err.Error())
	}
	mi := s.method(info.FullMethod)
	c, rec, err := s.claim(ctx, s.scope(ctx, key), fp)
	switch {
	case err != nil:
		return nil, err
	case rec != nil:
		return s.replay(ctx, mi, fp, rec)
	}
	return s.execute(ctx, req, handler, c, mi)
}

// scope returns the store scope of key: the key, prefixed by the caller's
// identity when the server has an Identity function.
func (s *Server) scope(ctx context.Context, key string) string {
	if s.identity == nil {
		return key
	}
	// Keys hold no NUL, so the last NUL splits identity and key.
	return s.identity(ctx) + "\x00" + key
}

// claim takes scope for fp, waiting (bounded by ctx) while another
// execution of the same request holds it. It returns either an owned claim,
// whose handler the caller runs (and counts as a miss), or the record to
// replay (counted as a hit), or a status error: a conflict, the caller's
// context, or the store's.
func (s *Server) claim(ctx context.Context, scope string, fp Fingerprint) (Claim, *Record, error) {
	for {
		c, err := s.store.Claim(ctx, scope, fp)
		if err != nil {
			s.storeErrors.Add(1)
			return Claim{}, nil, storeError(err)
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
				s.storeErrors.Add(1)
				return Claim{}, nil, status.Error(codes.Internal, "idempotency: the store answered DONE without a record")
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
				if ctx.Err() == nil {
					s.storeErrors.Add(1)
				}
				return Claim{}, nil, storeError(err)
			}
			if rec != nil {
				s.hits.Add(1)
				return Claim{}, rec, nil
			}
			// Released without an outcome: claim again, and maybe run it.
		default:
			s.storeErrors.Add(1)
			return Claim{}, nil, status.Error(codes.Internal, "idempotency: store answered "+c.State.String())
		}
	}
}

func (s *Server) conflict(fp, holder Fingerprint) error {
	s.conflicts.Add(1)
	if fp.Method != holder.Method {
		return status.Error(codes.InvalidArgument, "idempotency: this "+MetadataKey+
			" was already used for another method; a new request needs a new key")
	}
	return status.Error(codes.InvalidArgument, "idempotency: this "+MetadataKey+
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
	if s.notStored.Has(st.Code()) || (err != nil && st.Code() == codes.OK) {
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
	if rec == nil || rec.Fingerprint != fp {
		s.storeErrors.Add(1)
		return nil, status.Error(codes.Internal, "idempotency: the store answered with a record of another request")
	}
	// Best effort: see the Server doc.
	_ = grpc.SetHeader(ctx, rec.Header)
	_ = grpc.SetTrailer(ctx, rec.Trailer)
	if rec.Code != codes.OK {
		return nil, rec.err()
	}
	mt := mi.outType()
	if mt == nil {
		return nil, status.Error(codes.Internal, "idempotency: cannot rebuild the stored response of "+
			fp.Method+": its output type is unknown to the protobuf registry")
	}
	m := mt.New().Interface()
	if err := proto.Unmarshal(rec.Response, m); err != nil {
		return nil, status.Error(codes.Internal, "idempotency: cannot rebuild the stored response: "+err.Error())
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

// storeError turns a Store's error into a status error.
func storeError(err error) error {
	if st, ok := status.FromError(err); ok {
		return st.Err()
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return status.FromContextError(err).Err()
	}
	return status.Error(codes.Unavailable, "idempotency: store: "+err.Error())
}

// methodInfo is what the server knows of one method, resolved once.
type methodInfo struct {
	out atomic.Pointer[outType]
	// stream is true when ServerConfig.Streams lists the method (or its
	// service): its server streams are deduplicated.
	stream bool
	// in is the request type of a method listed in Streams, from the
	// registry; nil if the registry does not know it.
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

// resolveMethod finds the output type of full in the global registries,
// and whether (and with what request type) its streams are deduplicated.
func (s *Server) resolveMethod(full string) *methodInfo {
	mi := &methodInfo{}
	if mt := ResponseType(full); mt != nil {
		mi.out.Store(&outType{mt})
	}
	svc, _, ok := splitMethod(full)
	mi.stream = s.streamMethods[full] || (ok && s.streamServices[svc])
	if mi.stream {
		mi.in = requestType(full)
	}
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
