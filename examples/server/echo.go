package main

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// maxListCount bounds the items one List sends.
const maxListCount = 1000

// maxValues bounds the values Put keeps.
const maxValues = 10000

// echo is the demo EchoService: Get returns what Put stored (or the key
// itself), Charge adds to an account's balance, Notify acknowledges, and
// the streams echo.
type echo struct {
	echov1.UnimplementedEchoServiceServer

	mu       sync.Mutex
	values   map[string][]byte
	balances map[string]int64
	charges  int
}

func newEcho() *echo {
	return &echo{values: map[string][]byte{}, balances: map[string]int64{}}
}

func (e *echo) Get(_ context.Context, r *echov1.GetRequest) (*echov1.GetResponse, error) {
	e.mu.Lock()
	v, ok := e.values[r.GetKey()]
	e.mu.Unlock()
	if !ok {
		v = []byte(r.GetKey())
	}
	return &echov1.GetResponse{RequestId: r.GetRequestId(), Value: v}, nil
}

func (e *echo) Put(_ context.Context, r *echov1.PutRequest) (*echov1.PutResponse, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.values[r.GetKey()]; !ok && len(e.values) >= maxValues {
		return nil, status.Error(codes.ResourceExhausted, "echo: too many values")
	}
	e.values[r.GetKey()] = r.GetValue()
	return &echov1.PutResponse{RequestId: r.GetRequestId()}, nil
}

// Charge is not idempotent by itself: the suite's server interceptor
// answers a repeated idempotency key with the first response instead of
// charging again.
func (e *echo) Charge(_ context.Context, r *echov1.ChargeRequest) (*echov1.ChargeResponse, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.balances[r.GetAccount()]; !ok && len(e.balances) >= maxValues {
		return nil, status.Error(codes.ResourceExhausted, "echo: too many accounts")
	}
	e.balances[r.GetAccount()] += r.GetAmountCents()
	e.charges++
	return &echov1.ChargeResponse{
		RequestId:    r.GetRequestId(),
		ChargeId:     fmt.Sprintf("ch_%d", e.charges),
		BalanceCents: e.balances[r.GetAccount()],
	}, nil
}

func (e *echo) Notify(_ context.Context, r *echov1.NotifyRequest) (*echov1.NotifyResponse, error) {
	return &echov1.NotifyResponse{RequestId: r.GetRequestId()}, nil
}

func (e *echo) List(r *echov1.ListRequest, s grpc.ServerStreamingServer[echov1.ListResponse]) error {
	if r.GetCount() > maxListCount {
		return status.Errorf(codes.InvalidArgument, "echo: count %d > %d", r.GetCount(), maxListCount)
	}
	for i := range r.GetCount() {
		if err := s.Send(&echov1.ListResponse{RequestId: r.GetRequestId(), Index: i, Payload: fmt.Appendf(nil, "item %d", i)}); err != nil {
			return err
		}
	}
	return nil
}

func (e *echo) Upload(s grpc.ClientStreamingServer[echov1.UploadRequest, echov1.UploadResponse]) error {
	h := sha256.New()
	resp := &echov1.UploadResponse{}
	for {
		m, err := s.Recv()
		if errors.Is(err, io.EOF) {
			resp.Sha256 = h.Sum(nil)
			return s.SendAndClose(resp)
		} else if err != nil {
			return err
		}
		if resp.RequestId == "" {
			resp.RequestId = m.GetRequestId()
		}
		h.Write(m.GetChunk())
		resp.Size += uint64(len(m.GetChunk()))
		resp.Chunks++
	}
}

func (e *echo) Chat(s grpc.BidiStreamingServer[echov1.ChatRequest, echov1.ChatResponse]) error {
	for {
		m, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return err
		}
		if err := s.Send(&echov1.ChatResponse{RequestId: m.GetRequestId(), Seq: m.GetSeq(), Payload: m.GetPayload()}); err != nil {
			return err
		}
	}
}
