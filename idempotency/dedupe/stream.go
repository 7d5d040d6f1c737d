package dedupe

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/stormguard/stormguard/idempotency"
)

// tooLargeStream is the message of the tombstone stored for a stream whose
// responses outgrew Config.MaxStreamBytes.
const tooLargeStream = "dedupe: this request was executed, but its response stream was too large to keep for replay; it is not executed again"

// stream is the interceptor Stream returns when some methods are opted in.
func (s *Server) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	// One request, then responses: the only shape whose request is known
	// before the handler runs (see the Server doc).
	if info.IsClientStream || !info.IsServerStream {
		return handler(srv, ss)
	}
	mi := s.method(info.FullMethod)
	if !mi.dedupe {
		return handler(srv, ss)
	}
	ctx := ss.Context()
	key, ok, err := idempotency.KeyFromIncoming(ctx)
	if !ok {
		return handler(srv, ss)
	}
	if err != nil {
		s.invalid.Add(1)
		return err
	}
	scope, err := s.scope(ctx, key, info.FullMethod)
	if err != nil {
		return err
	}
	if mi.in == nil {
		return status.Error(codes.Internal, "dedupe: the request type of "+info.FullMethod+
			" is unknown to the protobuf registry; its streams cannot be deduplicated")
	}
	req := mi.in.New().Interface()
	if err := ss.RecvMsg(req); err != nil {
		return err // as the handler would have returned it
	}
	fp := Fingerprint{Method: info.FullMethod}
	if fp.RequestHash, err = hashRequest(req); err != nil {
		return status.Error(codes.Internal, "dedupe: cannot serialize the request: "+err.Error())
	}
	c, rec, err := s.claim(ctx, scope, fp)
	if err == nil && rec == nil {
		return s.executeStream(srv, ss, handler, c, mi, req)
	}
	if err == nil {
		err = s.replayStream(ss, mi, fp, rec)
	}
	if md := pushbackMD(err); md != nil {
		ss.SetTrailer(md)
	}
	return err
}

// executeStream runs the handler under the owned claim c, recording what it
// sends, and stores or releases its outcome.
func (s *Server) executeStream(srv any, ss grpc.ServerStream, handler grpc.StreamHandler, c Claim, mi *methodInfo, req proto.Message) error {
	ctx := ss.Context()
	rs := &recordingStream{ServerStream: ss, ctx: ctx, req: req, mi: mi, limit: s.maxStreamBytes}
	if inner := grpc.ServerTransportStreamFromContext(ctx); inner != nil {
		rs.cs.ServerTransportStream = inner
		rs.ctx = grpc.NewContextWithServerTransportStream(ctx, &rs.cs)
	}
	finished := false
	defer func() {
		if !finished { // the handler panicked: let the next attempt run
			s.release(ctx, c)
		}
	}()
	err := handler(srv, rs)
	finished = true

	st, ok := status.FromError(err)
	if !ok {
		st = status.FromContextError(err) // as grpc does with a handler's error
	}
	if s.notStored.Has(st.Code()) || (err != nil && st.Code() == codes.OK) || rs.unstorable {
		s.release(ctx, c)
		return err
	}
	var rec *Record
	if rs.oversized {
		// The request ran and must not run again; its responses are gone.
		s.oversized.Add(1)
		rec = &Record{Fingerprint: c.Holder, Code: codes.Internal, Message: tooLargeStream}
	} else {
		rec = &Record{Fingerprint: c.Holder, Code: st.Code(), Message: st.Message(), Responses: rs.resps}
		if err != nil {
			rec.Details = st.Proto().GetDetails()
		}
		rec.Header, rec.Trailer = rs.cs.captured()
	}
	if cerr := s.store.Complete(context.WithoutCancel(ctx), c, rec); cerr != nil {
		s.storeErrors.Add(1)
	}
	return err
}

// replayStream answers the stream with the stored outcome rec.
func (s *Server) replayStream(ss grpc.ServerStream, mi *methodInfo, fp Fingerprint, rec *Record) error {
	if rec.Fingerprint != fp {
		return s.storeFailure("answered with a record of another request")
	}
	mt := mi.outType()
	if mt == nil && len(rec.Responses) > 0 {
		return status.Error(codes.Internal, "dedupe: cannot rebuild the stored responses of "+
			fp.Method+": its output type is unknown to the protobuf registry")
	}
	// Best effort, as for unary: an interceptor outside this one may have
	// sent the header already.
	_ = ss.SetHeader(rec.Header)
	for _, b := range rec.Responses {
		m := mt.New().Interface() // a new one each: grpc may use a sent message lazily
		if err := proto.Unmarshal(b, m); err != nil {
			return status.Error(codes.Internal, "dedupe: cannot rebuild a stored response: "+err.Error())
		}
		if err := ss.SendMsg(m); err != nil {
			return err
		}
	}
	ss.SetTrailer(rec.Trailer)
	return rec.err()
}

// recordingStream is the stream a deduplicated handler runs on: its first
// RecvMsg yields the request the interceptor read, and SendMsg records
// each response (up to limit bytes) before forwarding it. Header and
// trailer metadata set on it, or on its context's transport stream, are
// recorded in cs.
//
// grpc allows one goroutine in SendMsg and another in RecvMsg at a time:
// RecvMsg uses only req, SendMsg only the recording fields, and the
// interceptor reads those after the handler has returned.
type recordingStream struct {
	grpc.ServerStream
	ctx context.Context
	cs  captureStream // its ServerTransportStream is nil without one in ctx
	req proto.Message // until the first RecvMsg
	mi  *methodInfo

	limit, size           int64
	resps                 [][]byte
	oversized, unstorable bool
}

func (r *recordingStream) Context() context.Context { return r.ctx }

func (r *recordingStream) SetHeader(md metadata.MD) error {
	if err := r.ServerStream.SetHeader(md); err != nil {
		return err
	}
	r.cs.addHeader(md)
	return nil
}

func (r *recordingStream) SendHeader(md metadata.MD) error {
	if err := r.ServerStream.SendHeader(md); err != nil {
		return err
	}
	r.cs.addHeader(md)
	return nil
}

func (r *recordingStream) SetTrailer(md metadata.MD) {
	r.ServerStream.SetTrailer(md)
	r.cs.addTrailer(md)
}

func (r *recordingStream) RecvMsg(m any) error {
	req := r.req
	if req == nil {
		return r.ServerStream.RecvMsg(m)
	}
	r.req = nil
	dst, ok := m.(proto.Message)
	if !ok || dst.ProtoReflect().Descriptor().FullName() != req.ProtoReflect().Descriptor().FullName() {
		return status.Errorf(codes.Internal, "dedupe: the handler receives its request into a %T, not a %s",
			m, req.ProtoReflect().Descriptor().FullName())
	}
	proto.Reset(dst)
	proto.Merge(dst, req)
	return nil
}

func (r *recordingStream) SendMsg(m any) error {
	r.record(m)
	return r.ServerStream.SendMsg(m)
}

// record keeps the serialized m, until the responses outgrow the limit.
func (r *recordingStream) record(m any) {
	if r.oversized || r.unstorable {
		return
	}
	pm, ok := m.(proto.Message)
	if !ok {
		r.unstorable, r.resps = true, nil
		return
	}
	b, err := proto.Marshal(pm)
	if err != nil { // grpc fails to send it too
		r.unstorable, r.resps = true, nil
		return
	}
	r.size += responseCost(len(b))
	if r.size > r.limit {
		r.oversized, r.resps = true, nil
		return
	}
	if r.resps == nil {
		r.mi.learn(pm)
	}
	r.resps = append(r.resps, b)
}
