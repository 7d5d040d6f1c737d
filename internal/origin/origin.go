package origin

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// Call describes one attempt as it reached the origin.
type Call struct {
	// Method is the full method name, e.g. "/echo.v1.EchoService/Get".
	Method string
	// RequestID is the request_id of the (first) request message.
	RequestID string
	// Attempt counts the arrivals of this method and request id, from 1.
	Attempt int
	// Seq is the arrival order over all methods, from 1.
	Seq int64
	// Metadata is the incoming request metadata.
	Metadata metadata.MD
	// Deadline is the handler context's deadline, if it has one.
	Deadline    time.Time
	HasDeadline bool
	// Arrived is when the attempt reached the handler.
	Arrived time.Time
}

// Reply says how the origin answers one attempt. The zero Reply succeeds at
// once.
type Reply struct {
	// Delay is how long the origin works before answering. It stops early
	// when the caller's context is done, unless IgnoreCancel is set.
	Delay time.Duration
	// IgnoreCancel makes the origin finish its Delay even after the caller
	// left, like a handler that does not watch its context; such work is
	// counted by Origin.Wasted.
	IgnoreCancel bool
	// Code, when not OK, fails the attempt with Message.
	Code    codes.Code
	Message string
	// Header and Trailer are sent with the response.
	Header, Trailer metadata.MD
	// FailAfter, for streams with a non-OK Code, is how many response
	// messages are sent (List, Chat) or request messages received (Upload)
	// before the stream fails. 0 fails it before any message.
	FailAfter int
}

// Script decides the Reply of each attempt. It is called concurrently.
type Script func(Call) Reply

// Succeed answers every attempt with OK.
func Succeed() Script { return func(Call) Reply { return Reply{} } }

// Always fails every attempt with code.
func Always(code codes.Code) Script {
	return func(Call) Reply { return Reply{Code: code, Message: "origin: always " + code.String()} }
}

// FailFirst fails the first n attempts of every request id with code, then
// succeeds.
func FailFirst(n int, code codes.Code) Script {
	return func(c Call) Reply {
		if c.Attempt <= n {
			return Reply{Code: code, Message: fmt.Sprintf("origin: attempt %d of %s fails", c.Attempt, c.RequestID)}
		}
		return Reply{}
	}
}

// Sleep answers OK after d.
func Sleep(d time.Duration) Script { return func(Call) Reply { return Reply{Delay: d} } }

type countKey struct{ method, id string }

// Origin is a programmable EchoService. Create one with New; the zero
// Origin is not usable. An Origin is safe for concurrent use.
type Origin struct {
	echov1.UnimplementedEchoServiceServer

	script atomic.Pointer[Script]
	seq    atomic.Int64
	wasted atomic.Int64

	mu        sync.Mutex
	perMethod map[string]int
	perID     map[countKey]int
	calls     []Call
	balances  map[string]int64
	charges   map[string]int
	uploads   []*echov1.UploadResponse
}

// maxLog bounds the call log kept for Calls.
const maxLog = 1 << 16

// New returns an Origin that answers as s says (nil: Succeed).
func New(s Script) *Origin {
	o := &Origin{}
	o.Reset()
	o.SetScript(s)
	return o
}

// SetScript replaces the script for attempts that arrive from now on.
func (o *Origin) SetScript(s Script) {
	if s == nil {
		s = Succeed()
	}
	o.script.Store(&s)
}

// Reset forgets all counts, calls, balances and uploads.
func (o *Origin) Reset() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.perMethod = map[string]int{}
	o.perID = map[countKey]int{}
	o.calls = nil
	o.balances = map[string]int64{}
	o.charges = map[string]int{}
	o.uploads = nil
	o.seq.Store(0)
	o.wasted.Store(0)
}

// Register registers o as the EchoService of s.
func (o *Origin) Register(s grpc.ServiceRegistrar) { echov1.RegisterEchoServiceServer(s, o) }

// Total returns the number of attempts that reached the origin.
func (o *Origin) Total() int { return int(o.seq.Load()) }

// Count returns the attempts that reached method (a full method name).
func (o *Origin) Count(method string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.perMethod[method]
}

// CountID returns the attempts of method with the given request id.
func (o *Origin) CountID(method, id string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.perID[countKey{method, id}]
}

// Calls returns the attempts seen so far, in arrival order (at most the
// first 65536).
func (o *Origin) Calls() []Call {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]Call(nil), o.calls...)
}

// Wasted returns how many attempts finished their work after their caller
// had already gone (only possible with Reply.IgnoreCancel).
func (o *Origin) Wasted() int { return int(o.wasted.Load()) }

// Balance returns the sum charged to account, in cents, and how many
// charges were applied to it.
func (o *Origin) Balance(account string) (cents int64, charges int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.balances[account], o.charges[account]
}

// Uploads returns the summaries of the uploads that completed.
func (o *Origin) Uploads() []*echov1.UploadResponse {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]*echov1.UploadResponse(nil), o.uploads...)
}

// arrive records an attempt and returns the script's reply for it.
func (o *Origin) arrive(ctx context.Context, method, id string) (Call, Reply) {
	c := Call{Method: method, RequestID: id, Arrived: time.Now()}
	c.Metadata, _ = metadata.FromIncomingContext(ctx)
	c.Deadline, c.HasDeadline = ctx.Deadline()
	o.mu.Lock()
	o.perMethod[method]++
	k := countKey{method, id}
	o.perID[k]++
	c.Attempt = o.perID[k]
	c.Seq = o.seq.Add(1)
	if len(o.calls) < maxLog {
		o.calls = append(o.calls, c)
	}
	o.mu.Unlock()
	return c, (*o.script.Load())(c)
}

// work carries out the reply's delay and headers; it returns the error to
// fail with before any message, or nil to go on.
func (o *Origin) work(ctx context.Context, r Reply) error {
	if len(r.Header) > 0 {
		if err := grpc.SetHeader(ctx, r.Header); err != nil {
			return err
		}
	}
	if len(r.Trailer) > 0 {
		grpc.SetTrailer(ctx, r.Trailer)
	}
	if r.Delay > 0 {
		t := time.NewTimer(r.Delay)
		defer t.Stop()
		if r.IgnoreCancel {
			<-t.C
			if ctx.Err() != nil {
				o.wasted.Add(1)
			}
		} else {
			select {
			case <-t.C:
			case <-ctx.Done():
				return status.FromContextError(ctx.Err()).Err()
			}
		}
	}
	return nil
}

func (r Reply) err() error {
	if r.Code == codes.OK {
		return nil
	}
	return status.Error(r.Code, r.Message)
}

func unary[Req interface{ GetRequestId() string }, Resp any](o *Origin, ctx context.Context, method string, req Req, effect func(Call) Resp) (Resp, error) {
	var zero Resp
	c, r := o.arrive(ctx, method, req.GetRequestId())
	if err := o.work(ctx, r); err != nil {
		return zero, err
	}
	if err := r.err(); err != nil {
		return zero, err
	}
	return effect(c), nil
}

// Get answers with the key as the value.
func (o *Origin) Get(ctx context.Context, req *echov1.GetRequest) (*echov1.GetResponse, error) {
	return unary(o, ctx, echov1.EchoService_Get_FullMethodName, req, func(Call) *echov1.GetResponse {
		return &echov1.GetResponse{RequestId: req.GetRequestId(), Value: []byte(req.GetKey())}
	})
}

// Put accepts the value.
func (o *Origin) Put(ctx context.Context, req *echov1.PutRequest) (*echov1.PutResponse, error) {
	return unary(o, ctx, echov1.EchoService_Put_FullMethodName, req, func(Call) *echov1.PutResponse {
		return &echov1.PutResponse{RequestId: req.GetRequestId()}
	})
}

// Charge applies the charge to the account's balance (once per successful
// attempt: the origin does not deduplicate) and returns a new charge id.
func (o *Origin) Charge(ctx context.Context, req *echov1.ChargeRequest) (*echov1.ChargeResponse, error) {
	return unary(o, ctx, echov1.EchoService_Charge_FullMethodName, req, func(c Call) *echov1.ChargeResponse {
		o.mu.Lock()
		o.balances[req.GetAccount()] += req.GetAmountCents()
		o.charges[req.GetAccount()]++
		bal := o.balances[req.GetAccount()]
		o.mu.Unlock()
		return &echov1.ChargeResponse{RequestId: req.GetRequestId(), ChargeId: fmt.Sprintf("ch_%d", c.Seq), BalanceCents: bal}
	})
}

// Notify acknowledges.
func (o *Origin) Notify(ctx context.Context, req *echov1.NotifyRequest) (*echov1.NotifyResponse, error) {
	return unary(o, ctx, echov1.EchoService_Notify_FullMethodName, req, func(Call) *echov1.NotifyResponse {
		return &echov1.NotifyResponse{RequestId: req.GetRequestId()}
	})
}

// Transfer acknowledges.
func (o *Origin) Transfer(ctx context.Context, req *echov1.TransferRequest) (*echov1.TransferResponse, error) {
	return unary(o, ctx, echov1.EchoService_Transfer_FullMethodName, req, func(Call) *echov1.TransferResponse {
		return &echov1.TransferResponse{RequestId: req.GetRequestId()}
	})
}

// List sends req.Count items, failing after Reply.FailAfter of them when
// the reply has a code.
func (o *Origin) List(req *echov1.ListRequest, stream grpc.ServerStreamingServer[echov1.ListResponse]) error {
	ctx := stream.Context()
	_, r := o.arrive(ctx, echov1.EchoService_List_FullMethodName, req.GetRequestId())
	if err := o.work(ctx, r); err != nil {
		return err
	}
	for i := uint32(0); i < req.GetCount(); i++ {
		if r.Code != codes.OK && int(i) >= r.FailAfter {
			return r.err()
		}
		if err := stream.Send(&echov1.ListResponse{RequestId: req.GetRequestId(), Index: i, Payload: []byte(fmt.Sprint(i))}); err != nil {
			return err
		}
	}
	return r.err()
}

// Upload receives chunks and answers with their size and SHA-256. The
// request id is taken from the first chunk; a reply with a code fails the
// stream after Reply.FailAfter chunks.
func (o *Origin) Upload(stream grpc.ClientStreamingServer[echov1.UploadRequest, echov1.UploadResponse]) error {
	ctx := stream.Context()
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	_, r := o.arrive(ctx, echov1.EchoService_Upload_FullMethodName, first.GetRequestId())
	if err := o.work(ctx, r); err != nil {
		return err
	}
	h := sha256.New()
	resp := &echov1.UploadResponse{RequestId: first.GetRequestId()}
	for m := first; ; {
		if r.Code != codes.OK && int(resp.Chunks) >= r.FailAfter {
			return r.err()
		}
		h.Write(m.GetChunk())
		resp.Size += uint64(len(m.GetChunk()))
		resp.Chunks++
		if m, err = stream.Recv(); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return err
		}
	}
	if err := r.err(); err != nil {
		return err
	}
	resp.Sha256 = h.Sum(nil)
	o.mu.Lock()
	o.uploads = append(o.uploads, resp)
	o.mu.Unlock()
	return stream.SendAndClose(resp)
}

// Chat echoes every message, failing after Reply.FailAfter echoes when the
// reply has a code. The request id is taken from the first message.
func (o *Origin) Chat(stream grpc.BidiStreamingServer[echov1.ChatRequest, echov1.ChatResponse]) error {
	ctx := stream.Context()
	first, err := stream.Recv()
	if errors.Is(err, io.EOF) {
		return nil
	} else if err != nil {
		return err
	}
	_, r := o.arrive(ctx, echov1.EchoService_Chat_FullMethodName, first.GetRequestId())
	if err := o.work(ctx, r); err != nil {
		return err
	}
	for m, n := first, 0; ; n++ {
		if r.Code != codes.OK && n >= r.FailAfter {
			return r.err()
		}
		if err := stream.Send(&echov1.ChatResponse{RequestId: m.GetRequestId(), Seq: m.GetSeq(), Payload: m.GetPayload()}); err != nil {
			return err
		}
		if m, err = stream.Recv(); errors.Is(err, io.EOF) {
			return r.err()
		} else if err != nil {
			return err
		}
	}
}
